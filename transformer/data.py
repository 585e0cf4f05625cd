"""Reading parallel text and batching it by length (§5.1).

§5.1: "Sentence pairs were batched together by approximate sequence length. Each training batch
contained a set of sentence pairs containing approximately 25000 source tokens and 25000 target
tokens." As in the authors' code (IMPLEMENTATION-NOTES A10) the budget counts *padded* tokens, per
side, and over-long training pairs are dropped, never truncated.

Files are one sentence per line, UTF-8, plain or gzip. Lines are split on "\\n" only: Unicode line
separators (U+2028, U+0085, form feed) occur inside real sentences, and splitting on them would
misalign a parallel corpus silently.
"""

from __future__ import annotations

import collections
import gzip
import hashlib
import itertools
import math
import multiprocessing
import multiprocessing.connection
import os
import random
import shlex
import signal
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from numpy.typing import ArrayLike

from .errors import UserError
from .tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, BPEDropout, Tokenizer

class DataError(UserError, ValueError):
    """A user error in the data; a one-line message naming the file and line, or both files."""


def shown(path: Path) -> str:
    """A file as errors name it: "stdin" for ``-`` (read as /dev/stdin, a path the user gave no such name)."""
    return "stdin" if Path(path) == Path("/dev/stdin") else str(path)


def pair_named(src: Path, tgt: Path) -> str:
    """Two files of a pair as logs name them: the first's whole path, the second's name where it lies beside it
    (else its whole path too: a second file elsewhere read as if beside the first)."""
    src, tgt = Path(src).resolve(), Path(tgt).resolve()
    return f"{src} + {tgt.name if tgt.parent == src.parent else tgt}"


# other compressors' magic bytes: named, and how to decompress (a gzip file is read as it is)
COMPRESSED = {b"BZh": ("bzip2", "bunzip2 -k {}"), b"\xfd7zXZ\x00": ("xz", "unxz -k {}"),
              b"PK\x03\x04": ("zip", "unzip {}"), b"\x28\xb5\x2f\xfd": ("zstd", "unzstd {}")}


def iter_lines(path: Path) -> Iterator[str]:
    """Lines of a UTF-8 file, plain or gzip (detected by its magic bytes), split on "\\n" only, streamed.

    One trailing "\\r" per line is removed (CRLF files), a byte-order mark is removed from the
    start of a line (the first, or one of files joined by `cat`), a final line without "\\n" counts and
    a trailing "\\n" does not add an empty line. A file of "\\r" endings (old Mac), one line with carriage
    returns inside whether or not a "\\n" ends it, is refused.
    Memory is bounded by the longest line, so corpora of millions of lines (§5.1: 4.5M and 36M
    pairs) are read without holding them; a pipe's or a terminal's lines come as they are written.
    Binary line iteration splits on b"\\n" alone, which is what keeps U+2028, U+0085 and form feeds
    inside their line.
    """
    path = Path(path)
    name = shown(path)
    try:
        f = open(path, "rb")
    except OSError as e:
        if name == "stdin":  # the command was started with it closed
            raise DataError("standard input is closed (<&-): give the input as a file, or pipe it in") from None
        raise DataError(f"{name}: cannot read ({e.strerror})") from None
    n = 0
    with f:
        try:
            # looked at, not read: a pipe or a terminal (/dev/stdin) cannot be rewound, and its lines are
            # yielded as they come (at a terminal, each as it is typed)
            head = f.peek(2)[:2]
        except OSError as e:
            raise DataError(f"{name}: cannot read ({e.strerror})") from None
        # a pipe may give its first byte alone (a slow writer: `(head -c1; sleep 9; ...)`), and no text starts with
        # gzip's first, 0x1f: read as text, a gzip stream was "invalid UTF-8"
        zipped = head[:1] == b"\x1f" and head[1:2] in (b"\x8b", b"")
        stream = gzip.GzipFile(fileobj=f, mode="rb") if zipped else f
        try:
            looked = False  # at the first line of 8 bytes or more (UTF-16's "Hi\n" is 5, its "\n" 1)
            held: str | None = None  # a first line with carriage returns inside, until a second line comes
            for n, data in enumerate(stream, 1):
                if n == 1 and (data[:2] in (b"\xff\xfe", b"\xfe\xff") or data[:4] == b"\x00\x00\xfe\xff"):
                    # the mark of UTF-16 or UTF-32: a first line too short for the test below
                    encoding = "UTF-32" if data[:4] in (b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff") else "UTF-16"
                    convert = ("iconv" if not zipped else "zcat | iconv" if name == "stdin" else
                               f"zcat {shlex.quote(str(path))} | iconv")
                    raise DataError(f"{name}: it begins with a {encoding} byte-order mark: {encoding} text, not UTF-8; "
                                    f"convert it with {convert} -t UTF-8 -f {encoding}")
                if not looked and len(data) >= 8:
                    looked = True
                    if any(half.count(0) >= 0.9 * len(half) for half in (data[::2], data[1::2])):
                        # NUL between the characters: UTF-16 without its byte-order mark is valid UTF-8 (NUL is a
                        # character), and read as such it translated to noise and split a vocabulary into letters
                        raise DataError(f"{name}: NUL bytes between its characters: UTF-16 or UTF-32 text, not "
                                        "UTF-8; convert it with iconv -t UTF-8 -f (its encoding)")
                try:
                    line = data.decode("utf-8")
                except UnicodeDecodeError as e:
                    if n == 1 and (kind := next((k for magic, k in COMPRESSED.items() if data.startswith(magic)),
                                                None)):  # "invalid UTF-8 (byte 0xfd at byte column 1)" said nothing
                        raise DataError(f"{name}: {kind[0]}-compressed, and gzip's alone is read: decompress it "
                                        f"first ({kind[1].format('FILE' if name == 'stdin' else shlex.quote(name))})"
                                        ) from None
                    raise DataError(f"{name}:{n}: invalid UTF-8 (byte 0x{data[e.start]:02x} at byte column "
                                    f"{e.start + 1}); the file must be UTF-8 text (from Latin-1, say: iconv -f "
                                    "latin1 -t UTF-8)") from None
                if line.startswith("\ufeff"):
                    # a UTF-8 byte-order mark is not part of the sentence: the first line's, or a later line's in
                    # files joined by `cat` (the model's vocabulary removes it, but sacreBLEU scored "\ufeffEin"
                    # against "Ein" as another word)
                    line = line.lstrip("\ufeff")
                    if n == 1 and not line:  # nor a line: a file of the mark alone holds none, as an empty file
                        return
                ended = line.endswith("\n")
                line = line[:-1] if ended else line
                line = line[:-1] if line.endswith("\r") else line
                if held is not None:
                    yield held
                    held = None
                if n == 1 and "\r" in line.rstrip("\r"):
                    # carriage returns with text after them in the first line: old Mac line endings, all its sentences
                    # one line, when no second line follows (an editor may have ended it with one "\n"): held until
                    # then. A line's own stray ones at its end ("x\r\r\n") are text, kept as they were
                    held = line
                    continue
                yield line
            if held is not None:
                raise DataError(f"{name}: its lines end in a carriage return alone (old Mac line endings), so it "
                                "reads as one line; convert it with tr '\\r' '\\n'")
        except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
            if zipped:
                raise DataError(f"{name}:{n + 1}: corrupt or truncated gzip file ({e})") from None
            raise DataError(f"{name}:{n + 1}: cannot read ({e.strerror or e})") from None


def read_lines(path: Path) -> list[str]:
    """All lines of ``path``, by the rules of ``iter_lines`` (the one reader of text files)."""
    return list(iter_lines(path))


def iter_parallel(src: Path, tgt: Path,
                  read: Callable[[Path], Iterator[str]] = iter_lines) -> Iterator[tuple[str, str]]:
    """Sentence pairs of two line-aligned files, streamed; unequal line counts are an error, never a zip.

    The error is raised where the shorter file ends, after the pairs before it were yielded, so a
    consumer that writes must write atomically. ``read`` turns a path into its sentences
    (``iter_lines``, or a reader of another format such as WMT's SGML test sets).
    """
    missing = object()
    pairs = itertools.zip_longest(read(src), read(tgt), fillvalue=missing)
    n = 0
    for s, t in pairs:
        if s is missing or t is missing:
            n_src, n_tgt = n + (s is not missing), n + (t is not missing)
            for s, t in pairs:  # count both files to their ends for the message
                n_src, n_tgt = n_src + (s is not missing), n_tgt + (t is not missing)
            raise DataError(f"parallel files differ in length: {shown(src)} has {n_src} lines, {shown(tgt)} has "
                            f"{n_tgt}")
        n += 1
        yield s, t


def check_parallel(src: Path, tgt: Path) -> None:
    """Reads two line-aligned files through once, keeping nothing: their line counts and UTF-8 refused before a
    command's long work or first output (a pipe cannot be read twice: its caller skips it)."""
    collections.deque(iter_parallel(src, tgt), maxlen=0)


def read_parallel(src: Path, tgt: Path) -> list[tuple[str, str]]:
    """All sentence pairs of two line-aligned files (``iter_parallel``)."""
    return list(iter_parallel(src, tgt))


class _Encoder(Protocol):
    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...


@dataclass
class Example:
    """One encoded pair; both sides end with EOS, as in the authors' code (inputs and targets)."""

    src: list[int]
    tgt: list[int]


@dataclass
class EncodeStats:
    n_pairs: int  # pairs read
    skipped_empty: int  # a side empty after stripping whitespace
    skipped_long: int  # a side longer than max_len pieces, EOS included (A10)
    pieces: tuple[int, int] = (0, 0)  # of the pairs kept, (source, target), EOS left out
    unknown: tuple[int, int] = (0, 0)  # of those, the vocabulary's unknown piece (characters it has no piece for)

    @property
    def n_kept(self) -> int:
        return self.n_pairs - self.skipped_empty - self.skipped_long

    def unknown_warning(self, what: str, vocabulary: str) -> str | None:
        """A warning when more than 0.1% of a side's pieces are unknown: the model learns to write "\u2047"
        for what the vocabulary cannot spell (a vocabulary inherited by --init-from from other text, or learnt
        from a sample, data.spm_input_sentences, that lacked those characters). None otherwise."""
        shares = [u / p if p else 0.0 for u, p in zip(self.unknown, self.pieces)]
        if max(shares) <= 0.001:
            return None
        return (f"warning: {what}: {100 * shares[0]:.2g}% of the source's pieces and {100 * shares[1]:.2g}% of the "
                f"target's are unknown to the vocabulary ({vocabulary}): characters it has no piece for, which the "
                "model reads and writes as \u2047 (a vocabulary of other text, or of a sample that lacked them)")


def encode_pairs(pairs: list[tuple[str, str]], tokenizer: _Encoder, max_len: int,
                 kept: list[int] | None = None) -> tuple[list[Example], EncodeStats]:
    """Training examples: ids + EOS per side; empty and over-long pairs are dropped and counted.

    A side is empty when it has no piece: blank, or only characters the vocabulary's normalisation makes
    spaces (a zero-width space), as `translate` counts a blank line; stripped alone, such pairs were trained
    on, EOS against a sentence. A10: pairs longer than max_len on either side are dropped, not truncated; a truncated
    target would teach the model to stop mid-sentence. ``kept``: the indices of the pairs kept are appended to it.
    """
    src_ids = tokenizer.encode_batch([s.strip() for s, _ in pairs])
    tgt_ids = tokenizer.encode_batch([t.strip() for _, t in pairs])
    examples, empty = [], 0
    pieces, unknown = [0, 0], [0, 0]
    for i, (s, t) in enumerate(zip(src_ids, tgt_ids)):
        if not s or not t:
            empty += 1
        elif len(s) < max_len and len(t) < max_len:  # + EOS <= max_len
            examples.append(Example(s + [EOS_ID], t + [EOS_ID]))
            pieces[0], pieces[1] = pieces[0] + len(s), pieces[1] + len(t)
            unknown[0], unknown[1] = unknown[0] + s.count(UNK_ID), unknown[1] + t.count(UNK_ID)
            if kept is not None:
                kept.append(i)
    return examples, EncodeStats(len(pairs), empty, len(pairs) - empty - len(examples), (pieces[0], pieces[1]),
                                 (unknown[0], unknown[1]))


def encode_for_decoding(texts: list[str], tokenizer: _Encoder) -> list[list[int]]:
    """Source ids + EOS for translation; never truncates or skips (an empty line gives [EOS])."""
    return [ids + [EOS_ID] for ids in tokenizer.encode_batch([t.strip() for t in texts])]


@dataclass
class Batch:
    """Padded tensors of a batch. Shapes: src [B, S]; tgt_in and tgt_out [B, T]."""

    src: torch.Tensor  # PAD on the right
    tgt_in: torch.Tensor  # BOS + y[:-1]: §3.1 "output embeddings are offset by one position"
    tgt_out: torch.Tensor  # y, ending with EOS
    n_src_tokens: int  # non-PAD positions
    n_tgt_tokens: int
    indices: list[int]  # example indices, so callers can restore input order
    # the non-PAD target positions as indices into tgt_out flattened, row-major [n_tgt_tokens]: made here,
    # on the host, so that selecting them on a GPU does not read their count back (a boolean mask would:
    # one synchronisation per batch, and a break in a compiled graph)
    positions: torch.Tensor

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.src.to(device, non_blocking=True), self.tgt_in.to(device, non_blocking=True),
                     self.tgt_out.to(device, non_blocking=True), self.n_src_tokens, self.n_tgt_tokens,
                     self.indices, self.positions.to(device, non_blocking=True))

    def pin_memory(self) -> Batch:
        """The batch in page-locked host memory (a CUDA machine's), from which ``to`` a GPU is queued on
        the device without the host waiting for it."""
        return Batch(self.src.pin_memory(), self.tgt_in.pin_memory(), self.tgt_out.pin_memory(), self.n_src_tokens,
                     self.n_tgt_tokens, self.indices, self.positions.pin_memory())


def pad(seqs: list[list[int]], shape: tuple[int, int] | None = None) -> torch.Tensor:
    """[B, max len] long tensor, PAD on the right; one array built per batch, not one per row (numpy reads
    the lists several times faster than ``torch.tensor``: the host work between a GPU's steps). ``shape``:
    [rows, length] instead, its rows after the sequences' all PAD (``ShapeBuckets``)."""
    lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=int(lengths.sum()))
    out = np.full(shape or (len(seqs), int(lengths.max())), PAD_ID, dtype=np.int64)
    out[:len(seqs)][np.arange(out.shape[1]) < lengths[:, None]] = flat  # row-major fill
    return torch.from_numpy(out)


@dataclass(frozen=True)
class ShapeBuckets:
    """Batches of a few shapes (train.shape_buckets), for CUDA graphs: a graph replays one shape, and a
    corpus batched by length (§5.1) meets thousands of (sentences, source length, target length).

    Both sides of a batch are padded to the bucket of its longest sentence, source or target: the next of
    8 · 2^(k / per_doubling), rounded up (``per_doubling`` lengths per doubling: 8 pads a length by at most
    9%); and its rows to as many as the token budget holds at that length. A batch's shape is then its
    bucket's, one per bucket up to the longest sentence (padding each side to its own bucket would make
    the shapes pairs of buckets, several times as many for less padding than more buckets give). The
    batcher counts those padded tokens (A10), so a batch of its shape fits ``max_tokens``. The added rows
    are all padding but their source's first position, an EOS: each attention row then has a key to
    attend to (a row of masked keys only gives NaN, which the weights' gradients would sum). They hold no
    target token, so no loss, no gradient, and nothing counted.

    DEVIATION(§5.1): opt-in (train.shape_buckets); §5.1 batches pad to each batch's own longest sides.
    """

    per_doubling: int
    max_tokens: int

    def lengths(self, lengths: ArrayLike) -> np.ndarray:
        """Each length padded to its bucket."""
        n = np.asarray(lengths, dtype=np.int64)
        doublings = math.log2(max(int(n.max(initial=8)), 8) / 8)
        k = np.arange(math.ceil(self.per_doubling * doublings) + 1)
        buckets = np.unique(np.ceil(8 * 2.0 ** (k / self.per_doubling) - 1e-9).astype(np.int64))
        return buckets[np.searchsorted(buckets, n)]

    def shape(self, src_len: int, tgt_len: int) -> tuple[int, int, int]:
        """(rows, source length, target length) of a batch whose longest sides are ``src_len``, ``tgt_len``."""
        length = int(self.lengths([max(src_len, tgt_len)])[0])
        return max(1, self.max_tokens // length), length, length

    def shapes(self, src_lengths: ArrayLike, tgt_lengths: ArrayLike,
               batches: list[list[int]]) -> set[tuple[int, int, int]]:
        """The shapes ``batches`` of examples of these lengths take: CUDA graphs, one each."""
        src, tgt = np.asarray(src_lengths), np.asarray(tgt_lengths)
        return {self.shape(int(src[b].max()), int(tgt[b].max())) for b in batches}


def collate(examples: list[Example], indices: list[int], buckets: ShapeBuckets | None = None) -> Batch:
    """Pads the examples at ``indices`` into one Batch (of a bucket's shape with ``buckets``)."""
    chosen = [examples[i] for i in indices]
    src_shape = tgt_shape = None
    if buckets:
        rows, src_len, tgt_len = buckets.shape(max(len(e.src) for e in chosen), max(len(e.tgt) for e in chosen))
        src_shape, tgt_shape = (rows, src_len), (rows, tgt_len)
    tgt_out = pad([e.tgt for e in chosen], tgt_shape)
    # §3.1: the decoder's input is the target shifted right behind the start symbol, as long as the target
    # (its EOS falls off, or onto a padding position, which stays padding)
    shifted = torch.cat([torch.full_like(tgt_out[:, :1], BOS_ID), tgt_out[:, :-1]], 1)
    keep = tgt_out != PAD_ID
    src = pad([e.src for e in chosen], src_shape)
    src[len(chosen):, 0] = EOS_ID  # a bucket's added rows: one key for their attention (ShapeBuckets)
    return Batch(src=src, tgt_in=shifted.masked_fill_(~keep, PAD_ID),
                 tgt_out=tgt_out, n_src_tokens=sum(len(e.src) for e in chosen),
                 n_tgt_tokens=sum(len(e.tgt) for e in chosen), indices=list(indices),
                 positions=keep.flatten().nonzero().squeeze(1))


def make_batches(examples: list[Example], max_tokens: int, buckets: ShapeBuckets | None = None) -> list[list[int]]:
    """§5.1 length batching of in-memory examples: ``make_batches_from_lengths`` on their lengths."""
    return make_batches_from_lengths(*lengths(examples), max_tokens, buckets)


def make_batches_from_lengths(src_lengths: ArrayLike, tgt_lengths: ArrayLike, max_tokens: int,
                              buckets: ShapeBuckets | None = None) -> list[list[int]]:
    """§5.1 length batching: sort by the longer side's length (then target, then source), fill greedily.

    A batch of B examples takes B * longest source and B * longest target padded positions; each
    must stay <= max_tokens (A10 counts padded tokens). The sort key is the length the authors' code
    buckets by (A10: max(input, target)) and the one this budget binds on, so a batch's two sides end
    near the same length, with less padding than sorted by one side first (benchmarks/batching.py counts
    it). An example longer than max_tokens on its own gets a batch of one rather than being lost.
    Deterministic: shuffling is BatchOrder's job. Takes lengths only (EOS included), so a memory-mapped
    TokenStore of millions of pairs is batched without building an Example per pair. With ``buckets``
    the lengths are counted padded to their buckets (the shapes ``collate`` gives the batches).
    """
    src, tgt = np.asarray(src_lengths, dtype=np.int64), np.asarray(tgt_lengths, dtype=np.int64)
    if src.shape != tgt.shape or src.ndim != 1:
        raise ValueError(f"src_lengths {src.shape} and tgt_lengths {tgt.shape} must be equal 1-d arrays")
    if buckets:
        src = tgt = buckets.lengths(np.maximum(src, tgt))
    # the last key is the primary one; stable: ties keep index order
    return fill_batches(np.lexsort((src, tgt, np.maximum(src, tgt))), src, tgt, max_tokens)


def fill_batches(order: ArrayLike, src_lengths: ArrayLike, tgt_lengths: ArrayLike, max_tokens: int) -> list[list[int]]:
    """The examples in ``order`` cut into consecutive batches, each closed only when the next example would
    take a side past ``max_tokens`` padded positions (``make_batches_from_lengths`` gives the order)."""
    order = np.asarray(order, dtype=np.int64)
    src, tgt = np.asarray(src_lengths, dtype=np.int64)[order], np.asarray(tgt_lengths, dtype=np.int64)[order]
    batches: list[list[int]] = []
    batch: list[int] = []
    max_src = max_tgt = 0
    for i, src_len, tgt_len in zip(order.tolist(), src.tolist(), tgt.tolist()):
        s, t = max(max_src, src_len), max(max_tgt, tgt_len)
        if batch and (len(batch) + 1) * max(s, t) > max_tokens:
            batches.append(batch)
            batch, s, t = [], src_len, tgt_len
        batch.append(i)
        max_src, max_tgt = s, t
    if batch:
        batches.append(batch)
    return batches


def batches_sha256(batches: list[list[int]]) -> str:
    """Hex sha256 of a batch plan (each batch's size, then every index in order): a checkpoint records it,
    so that a resume can tell whether it draws the same batches as the run did."""
    sizes = np.fromiter((len(b) for b in batches), dtype=np.int64, count=len(batches))
    indices = np.fromiter(itertools.chain.from_iterable(batches), dtype=np.int64, count=int(sizes.sum()))
    return hashlib.sha256(sizes.tobytes() + indices.tobytes()).hexdigest()


def padding_fraction(src_lengths: ArrayLike, tgt_lengths: ArrayLike, batches: list[list[int]],
                     buckets: ShapeBuckets | None = None) -> float:
    """Share of padded source + target positions that are PAD (how much compute batching wastes), in the
    buckets' shapes with ``buckets``."""
    src, tgt = np.asarray(src_lengths, dtype=np.int64), np.asarray(tgt_lengths, dtype=np.int64)
    total = real = 0
    for batch in batches:
        s, t = src[batch], tgt[batch]
        rows, longest_src, longest_tgt = (buckets.shape(int(s.max()), int(t.max())) if buckets else
                                          (len(batch), int(s.max()), int(t.max())))
        total += rows * (longest_src + longest_tgt)
        real += int(s.sum() + t.sum())
    return 1.0 - real / total if total else 0.0


def lengths(examples: list[Example]) -> tuple[list[int], list[int]]:
    """(source lengths, target lengths) of in-memory examples, EOS included."""
    return [len(e.src) for e in examples], [len(e.tgt) for e in examples]


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of a draw made anew every epoch: distinct for every (seed, epoch) of a run (train.seed < 2^32,
    epochs < 1,000,003), so runs of neighbouring seeds do not share their draws an epoch apart."""
    return seed * 1_000_003 + epoch


# the versions of BatchOrder's seeding; a run keeps the one it started with (TrainState.batch_order), so it resumes
# exactly. 1 seeded epoch e of seed s with s + e: seed s + 1 trained the orders of seed s an epoch ahead.
BATCH_ORDERS = (1, 2)


class BatchOrder:
    """Deterministic per-epoch shuffled order of a fixed list of batches, resumable at (epoch, position).

    The order of epoch e is a function of (seed, e) alone, so a resumed run replays
    ``epoch_order(e)[position:]`` exactly. With world_size > 1, rank r takes every world_size-th
    batch of the shared permutation, so ranks see distinct batches and all take the same number of
    steps (the remainder is dropped for that epoch; the next permutation drops others). ``version``
    is the seeding's (``BATCH_ORDERS``); runs started before version 2 resume with 1.
    """

    def __init__(self, n_batches: int, seed: int, rank: int = 0, world_size: int = 1,
                 version: int = BATCH_ORDERS[-1]) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        if version not in BATCH_ORDERS:
            raise ValueError(f"batch order version {version} is none of {BATCH_ORDERS}")
        if n_batches < world_size:
            raise DataError(f"only {n_batches} batch{'es' * (n_batches != 1)} for {world_size} ranks; use more data or "
                            "a smaller train.max_tokens")
        self.n_batches, self.seed, self.rank, self.world_size = n_batches, seed, rank, world_size
        self.version = version

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return self.n_batches // self.world_size

    def epoch_order(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed + epoch if self.version == 1 else
                                                  epoch_seed(self.seed, epoch))
        order = torch.randperm(self.n_batches, generator=generator).tolist()
        return order[:len(self) * self.world_size][self.rank::self.world_size]


class SampledEpochs:
    """The training pairs segmented anew for every epoch by BPE-dropout (subword regularization).

    DEVIATION(§5.1): the paper encodes the corpus once. With ``alpha`` > 0 every epoch e gets its own
    segmentation of every training sentence (source and target), drawn with a generator seeded by
    (seed, e) alone, so a resumed run replays its epochs exactly; the epoch's batches are built after
    sampling, so token budgets hold for the longer sampled sequences; a pair whose sample is longer
    than ``max_len`` is left out of that epoch. Epoch e + 1 is sampled in a worker process while epoch
    e trains, off the training loop's path. Validation and decoding keep the deterministic segmentation.
    """

    def __init__(self, src: Path, tgt: Path, spm_model: Path, alpha: float, seed: int, max_len: int,
                 max_tokens: int, buckets: ShapeBuckets | None = None) -> None:
        self.seed = seed
        self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                         initializer=_start_sampler,
                                         initargs=(src, tgt, spm_model, alpha, max_len, max_tokens, buckets))
        self._ahead: dict[int, Future] = {}

    def __call__(self, epoch: int) -> tuple[list[Example], list[list[int]]]:
        """Epoch ``epoch``'s examples and batches (waiting only if they are not ready); starts the next."""
        future = self._ahead.pop(epoch, None) or self._pool.submit(_sample_epoch, self.seed, epoch)
        self._ahead = {epoch + 1: self._pool.submit(_sample_epoch, self.seed, epoch + 1)}
        return future.result()

    def close(self) -> None:
        """Ends the worker at once. The next epoch's sampling is under way by now (minutes on a large corpus),
        and is of no use to a run that stops: shutdown's wait for it held a stopped run's exit for as long, and
        a second SIGTERM in that wait left the process hung in the executor's join."""
        processes = list((getattr(self._pool, "_processes", None) or {}).values())  # no public API names them
        self._pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
        # each one's end, as its sentinel shows it: the executor's own thread reaps the worker too, and a join that
        # lost that race to waitpid (ECHILD) returned at once, the worker still "alive"
        waiting = [p.sentinel for p in processes]
        while waiting:
            done = multiprocessing.connection.wait(waiting)
            waiting = [s for s in waiting if s not in done]


_sampler: dict = {}  # the worker process's state: its training text, dropout and settings


def _start_sampler(src: Path, tgt: Path, spm_model: Path, alpha: float, max_len: int, max_tokens: int,
                   buckets: ShapeBuckets | None) -> None:
    os.nice(10)  # the next epoch is due in minutes: the training processes come first
    # a terminal's Ctrl-C reaches the whole process group: the trainer stops it (close), and its own
    # KeyboardInterrupt printed a traceback beside the trainer's one line
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with, args=(os.getppid(),), daemon=True).start()
    _sampler.update(pairs=read_parallel(src, tgt), dropout=Tokenizer(spm_model).dropout(), alpha=alpha,
                    max_len=max_len, max_tokens=max_tokens, buckets=buckets)


def _exit_with(parent: int) -> None:
    """Ends the worker once its trainer has gone: killed (SIGKILL, the OOM killer), the trainer never shuts the
    pool down, and the worker, which holds its task queue's both ends, waited on it for ever (~400 MB)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def _sample_epoch(seed: int, epoch: int) -> tuple[list[Example], list[list[int]]]:
    examples = sample_examples(_sampler["pairs"], _sampler["dropout"], _sampler["alpha"], seed, epoch,
                               _sampler["max_len"])
    return examples, make_batches(examples, _sampler["max_tokens"], _sampler["buckets"])


def sample_examples(pairs: list[tuple[str, str]], dropout: BPEDropout, alpha: float, seed: int, epoch: int,
                    max_len: int) -> list[Example]:
    """``encode_pairs`` with every side segmented by BPE-dropout, the draws seeded by (seed, epoch)."""
    return encode_pairs(pairs, _Sampled(dropout, alpha, random.Random(epoch_seed(seed, epoch))), max_len)[0]


@dataclass
class _Sampled:
    """A BPE-dropout sampler in the shape ``encode_pairs`` takes."""

    dropout: BPEDropout
    alpha: float
    rng: random.Random

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.dropout.encode_batch(texts, self.alpha, self.rng)
