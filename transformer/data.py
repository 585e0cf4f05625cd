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

import gzip
import hashlib
import os
import tempfile
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from tqdm import tqdm

from .tokenizer import BOS_ID, EOS_ID, PAD_ID

MULTI30K_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw/"
MULTI30K_SHA256 = {  # task 1 raw files, as listed in the shared data README
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
}
_CHECKOUT = Path(__file__).resolve().parent.parent


class DataError(ValueError):
    """A user error in the data; a one-line message naming the file and line, or both files."""


def _candidate_roots() -> list[Path]:
    env = os.environ.get("TRANSFORMER_DATA")
    return ([Path(env).expanduser()] if env else []) + [
        Path.cwd() / "data", _CHECKOUT.parent / "shared" / "data", Path.home() / ".cache" / "transformer"]


def find_data_root() -> Path | None:
    """First existing of $TRANSFORMER_DATA, ./data, <checkout>/../shared/data, ~/.cache/transformer."""
    return next((root for root in _candidate_roots() if root.is_dir()), None)


def _download_multi30k(name: str) -> Path:
    """Fetches one Multi30k raw file into the cache, verified against its published sha256."""
    env = os.environ.get("TRANSFORMER_DATA")
    folder = (Path(env).expanduser() if env else Path.home() / ".cache" / "transformer") / "multi30k"
    url = os.environ.get("TRANSFORMER_MULTI30K_URL", MULTI30K_URL).rstrip("/") + "/" + name
    hint = (f"download the Multi30k task1 raw files ({MULTI30K_URL}) into {folder}, "
            "or set TRANSFORMER_DATA to a folder holding multi30k/")
    tmp = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".part")
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
            size = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=size, unit="B", unit_scale=True, desc=f"multi30k/{name}", disable=None) as bar:
                while chunk := response.read(1 << 16):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
        if digest.hexdigest() != MULTI30K_SHA256[name]:
            raise DataError(f"multi30k/{name} downloaded from {url} has sha256 {digest.hexdigest()}, "
                            f"expected {MULTI30K_SHA256[name]}; discarded it; {hint}")
        os.replace(tmp, folder / name)
        return folder / name
    except DataError:
        raise
    except Exception as e:  # offline, HTTP error, refused connection, disk full: all one message
        reason = " ".join(str(getattr(e, "reason", None) or e).split()) or type(e).__name__
        raise DataError(f"multi30k/{name} is missing and could not be downloaded from {url} ({reason}); "
                        f"{hint}") from None
    finally:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)


def resolve_data_path(path: str) -> Path:
    """A data file: absolute or existing as given, else under each data root in order.

    A missing Multi30k raw file ("multi30k/<file>") is downloaded, so the recipes run from a fresh
    checkout; anything else missing is an error that lists where it was looked for.
    """
    given = Path(path).expanduser()
    if given.exists():
        return given
    if given.is_absolute():
        raise DataError(f"data file not found: {given}")
    roots = _candidate_roots()
    for root in roots:
        if (root / given).exists():
            return root / given
    if len(given.parts) == 2 and given.parts[0] == "multi30k" and given.name in MULTI30K_SHA256:
        return _download_multi30k(given.name)
    raise DataError(f"data file not found: {path} (searched ./ and {', '.join(map(str, roots))}; "
                    "set TRANSFORMER_DATA to the folder that holds it)")


def read_lines(path: Path) -> list[str]:
    """All lines of a UTF-8 file, plain or gzip (detected by its magic bytes), split on "\\n" only.

    One trailing "\\r" per line is removed (CRLF files); a final line without "\\n" counts and a
    trailing "\\n" does not add an empty line.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise DataError(f"{path}: corrupt or truncated gzip file ({e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise DataError(f"{path}:{line}: invalid UTF-8 (byte 0x{data[e.start]:02x} at byte column "
                        f"{column}); the file must be UTF-8 text") from None
    lines = text.split("\n")  # never splitlines(): U+2028, U+0085 and \f stay inside their line
    if lines[-1] == "":
        lines.pop()
    if lines and lines[0].startswith("\ufeff"):
        lines[0] = lines[0][1:]  # a UTF-8 byte-order mark is not part of the first sentence
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_parallel(src: Path, tgt: Path) -> list[tuple[str, str]]:
    """Sentence pairs of two line-aligned files; unequal line counts are an error, never a zip."""
    src_lines, tgt_lines = read_lines(src), read_lines(tgt)
    if len(src_lines) != len(tgt_lines):
        raise DataError(f"parallel files differ in length: {src} has {len(src_lines)} lines, "
                        f"{tgt} has {len(tgt_lines)}")
    return list(zip(src_lines, tgt_lines))


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

    @property
    def n_kept(self) -> int:
        return self.n_pairs - self.skipped_empty - self.skipped_long


def encode_pairs(pairs: list[tuple[str, str]], tokenizer: _Encoder,
                 max_len: int) -> tuple[list[Example], EncodeStats]:
    """Training examples: ids + EOS per side; empty and over-long pairs are dropped and counted.

    A10: pairs longer than max_len on either side are dropped, not truncated; a truncated target
    would teach the model to stop mid-sentence.
    """
    kept = [(s.strip(), t.strip()) for s, t in pairs if s.strip() and t.strip()]
    src_ids = tokenizer.encode_batch([s for s, _ in kept])
    tgt_ids = tokenizer.encode_batch([t for _, t in kept])
    examples = [Example(s + [EOS_ID], t + [EOS_ID]) for s, t in zip(src_ids, tgt_ids)
                if len(s) < max_len and len(t) < max_len]  # + EOS <= max_len
    return examples, EncodeStats(len(pairs), len(pairs) - len(kept), len(kept) - len(examples))


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

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.src.to(device, non_blocking=True), self.tgt_in.to(device, non_blocking=True),
                     self.tgt_out.to(device, non_blocking=True), self.n_src_tokens, self.n_tgt_tokens,
                     self.indices)


def _pad(seqs: list[list[int]]) -> torch.Tensor:
    """[B, max len] long tensor, PAD on the right; one tensor built per batch, not one per row."""
    lengths = torch.tensor([len(s) for s in seqs])
    out = torch.full((len(seqs), int(lengths.max())), PAD_ID, dtype=torch.long)
    out[torch.arange(out.size(1)) < lengths[:, None]] = torch.tensor([i for s in seqs for i in s],
                                                                     dtype=torch.long)  # row-major fill
    return out


def collate(examples: list[Example], indices: list[int]) -> Batch:
    """Pads the examples at ``indices`` into one Batch."""
    chosen = [examples[i] for i in indices]
    return Batch(src=_pad([e.src for e in chosen]),
                 tgt_in=_pad([[BOS_ID] + e.tgt[:-1] for e in chosen]),  # §3.1: shifted right
                 tgt_out=_pad([e.tgt for e in chosen]),
                 n_src_tokens=sum(len(e.src) for e in chosen),
                 n_tgt_tokens=sum(len(e.tgt) for e in chosen), indices=list(indices))


def make_batches(examples: list[Example], max_tokens: int) -> list[list[int]]:
    """§5.1 length batching: sort by (target, source) length, then fill greedily.

    A batch of B examples takes B * longest source and B * longest target padded positions; each
    must stay <= max_tokens (A10 counts padded tokens). An example longer than max_tokens on its
    own gets a batch of one rather than being lost. Deterministic: shuffling is BatchOrder's job.
    """
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i].tgt), len(examples[i].src)))
    batches: list[list[int]] = []
    batch: list[int] = []
    max_src = max_tgt = 0
    for i in order:
        s, t = max(max_src, len(examples[i].src)), max(max_tgt, len(examples[i].tgt))
        if batch and (len(batch) + 1) * max(s, t) > max_tokens:
            batches.append(batch)
            batch, s, t = [], len(examples[i].src), len(examples[i].tgt)
        batch.append(i)
        max_src, max_tgt = s, t
    if batch:
        batches.append(batch)
    return batches


def padding_fraction(examples: list[Example], batches: list[list[int]]) -> float:
    """Share of padded source + target positions that are PAD (how much compute batching wastes)."""
    total = real = 0
    for batch in batches:
        src, tgt = [len(examples[i].src) for i in batch], [len(examples[i].tgt) for i in batch]
        total += len(batch) * (max(src) + max(tgt))
        real += sum(src) + sum(tgt)
    return 1.0 - real / total if total else 0.0


class BatchOrder:
    """Deterministic per-epoch shuffled order of a fixed list of batches, resumable at (epoch, position).

    The order of epoch e is a function of (seed, e) alone, so a resumed run replays
    ``epoch_order(e)[position:]`` exactly. With world_size > 1, rank r takes every world_size-th
    batch of the shared permutation, so ranks see distinct batches and all take the same number of
    steps (the remainder is dropped for that epoch; the next permutation drops others).
    """

    def __init__(self, n_batches: int, seed: int, rank: int = 0, world_size: int = 1) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        if n_batches < world_size:
            raise DataError(f"only {n_batches} batches for {world_size} ranks; use more data or "
                            "a smaller train.max_tokens")
        self.n_batches, self.seed, self.rank, self.world_size = n_batches, seed, rank, world_size

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return self.n_batches // self.world_size

    def epoch_order(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed + epoch)
        order = torch.randperm(self.n_batches, generator=generator).tolist()
        return order[:len(self) * self.world_size][self.rank::self.world_size]
