"""A memory-mapped token store: a parallel corpus encoded once, read by training without its text.

§5.1 trains on 4.5M (EN-DE) and 36M (EN-FR) sentence pairs. Encoding them at every start of a run
and holding them as Python lists would take minutes and tens of GiB; ``write_store`` encodes them
once with the run's sentencepiece model, streaming in chunks of bounded memory, and ``TokenStore``
maps the result read-only, so every DDP rank shares the page cache instead of a private copy.

Layout of a store folder (ids end with EOS on both sides, exactly as in ``Example``):

    meta.json          format, version, vocabulary hash, dtypes, counts, sources
    src.ids, tgt.ids   all ids of one side, concatenated (uint16 when the vocabulary fits, else int32)
    src.len, tgt.len   one length per kept pair (same dtype rule, with max_len in place of the vocabulary)
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import tempfile
from pathlib import Path
from collections.abc import Callable
from typing import Any

import numpy as np
from tqdm import tqdm

from .data import DataError, EncodeStats, Example, encode_pairs, iter_parallel
from .files import not_replaceable, read_record, staged_write_error, staging
from .tokenizer import EOS_ID, PAD_ID, Tokenizer

FORMAT = "transformer-token-store"
VERSION = 1
FILES = ("src.ids", "tgt.ids", "src.len", "tgt.len")


def _dtype(largest: int) -> str:
    """Narrowest of uint16 / int32 that holds values up to ``largest``: halves the store for 37k BPE."""
    return "uint16" if largest <= np.iinfo(np.uint16).max else "int32"


# what a store folder holds: write_store's files, and the vocabulary `transformer preprocess` copies beside them
STORE_FILES = {*FILES, "meta.json", "spm.model"}


def check_store_folder(out: Path, overwrite: bool) -> None:
    """Refuses ``out`` as a store's folder: one that exists and is not empty, unless ``overwrite``, and even
    then one that is not an earlier token store. Asked before any work (``transformer preprocess`` trains a
    vocabulary first), and again by ``write_store``."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DataError(f"{out}: a file, not a folder; choose another folder")
    # refused before --overwrite is offered: a folder it may not replace was answered "pass --overwrite"
    if out.is_dir() and any(out.iterdir()) and (why := not_replaceable(out, "meta.json", STORE_FILES)):
        raise DataError(f"{out}: exists, and {why} (--overwrite replaces an earlier token store only): give a new "
                        "folder, or remove this one yourself")
    if out.is_dir() and not overwrite and any(out.iterdir()):
        raise DataError(f"{out}: holds an earlier token store; choose another folder, or pass --overwrite to "
                        "replace it")


def write_store(src: Path, tgt: Path, tokenizer: Tokenizer, out: Path, max_len: int,
                chunk_pairs: int = 50_000, progress: bool = False, overwrite: bool = False,
                vocabulary: Path | None = None, task: str | None = None,
                log: Callable[[str], None] = lambda message: None) -> dict:
    """Encodes the line-aligned files ``src`` / ``tgt`` into a token store at ``out``; returns its meta.

    Pairs are filtered exactly as training filters them (``encode_pairs``: empty sides and pairs
    longer than max_len pieces with EOS are skipped and counted, A10), chunk by chunk, so memory is
    bounded by ``chunk_pairs`` and not by the corpus. The store is built in a sibling temporary
    folder and renamed into place, so an interrupted run never leaves a half store that a later
    run would open; an existing non-empty ``out`` is refused unless ``overwrite``. ``vocabulary``: the
    tokenizer's model file, copied in as spm.model before the rename, so the store and its vocabulary
    replace the old ones at once (the file may be the old store's own). ``task``: the config's data.task,
    recorded so that a run of the other task refuses the store. ``log``: a warning where many pieces are unknown
    to the vocabulary, as training from the text warns (a store is trained on without reading the text).
    """
    src, tgt, out = Path(src), Path(tgt), Path(out)
    if chunk_pairs < 1 or max_len < 1:
        raise ValueError(f"chunk_pairs ({chunk_pairs}) and max_len ({max_len}) must be >= 1")
    check_store_folder(out, overwrite)
    ids_dtype, len_dtype = np.dtype(_dtype(tokenizer.vocab_size - 1)), np.dtype(_dtype(max_len))
    out.parent.mkdir(parents=True, exist_ok=True)
    # the staging folder is locked while it is written (a killed preprocess's folder goes first)
    with staging(out.parent, out.name, directory=True) as tmp:
        files: dict[str, Any] = {}
        try:
            tmp.chmod(0o755)  # mkdtemp's 0700 would hide the store from the other users of a shared machine
            files = {name: open(tmp / name, "wb") for name in FILES}
            counts = dict.fromkeys(("n_pairs", "skipped_empty", "skipped_long", "n_kept", "n_src_tokens",
                                    "n_tgt_tokens"), 0)
            pieces, unknown = [0, 0], [0, 0]  # per side, of the pairs kept: EncodeStats' counts, summed
            # the ids' own hash in meta.json, which a run's records hash: a corpus edited to the same sizes (two pairs
            # swapped) and encoded again into the store resumed without a word
            digests = {side: hashlib.sha256() for side in ("src", "tgt")}
            pairs = iter_parallel(src, tgt)
            with tqdm(unit=" pairs", unit_scale=True, desc=f"encoding {src.name}", disable=not progress) as bar:
                while chunk := list(itertools.islice(pairs, chunk_pairs)):
                    examples, stats = encode_pairs(chunk, tokenizer, max_len)
                    counts["n_pairs"] += stats.n_pairs
                    counts["skipped_empty"] += stats.skipped_empty
                    counts["skipped_long"] += stats.skipped_long
                    counts["n_kept"] += len(examples)
                    pieces = [a + b for a, b in zip(pieces, stats.pieces)]
                    unknown = [a + b for a, b in zip(unknown, stats.unknown)]
                    for side in ("src", "tgt"):
                        seqs = [getattr(e, side) for e in examples]
                        lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
                        ids = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64,
                                          count=int(lengths.sum()))
                        written = ids.astype(ids_dtype).tobytes()
                        files[f"{side}.ids"].write(written)
                        digests[side].update(written)
                        files[f"{side}.len"].write(lengths.astype(len_dtype).tobytes())
                        counts[f"n_{side}_tokens"] += len(ids)
                    bar.update(len(chunk))
            for f in files.values():
                f.close()
            if not counts["n_kept"]:  # training would refuse it: say so here, and write nothing
                raise DataError(f"{src}: no usable training pairs of {counts['n_pairs']:,} "
                                f"({counts['skipped_empty']:,} with an empty side, {counts['skipped_long']:,} "
                                f"longer than {max_len} pieces with EOS)")
            meta = {"format": FORMAT, "version": VERSION, "vocab_size": tokenizer.vocab_size,
                    "vocab_sha256": tokenizer.sha256, "dtype": ids_dtype.name, "length_dtype": len_dtype.name,
                    **counts, "max_len": max_len, **({} if task is None else {"task": task}),
                    "sources": {side: {"path": str(path.resolve()), "bytes": path.stat().st_size}
                                for side, path in (("src", src), ("tgt", tgt))},
                    "ids_sha256": {side: digest.hexdigest() for side, digest in digests.items()}}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
            if vocabulary is not None:
                shutil.copyfile(vocabulary, tmp / "spm.model")
            # again: another writer may have filled it since the start (both said done, one store silently lost)
            check_store_folder(out, overwrite)
            if out.exists() and (not out.is_dir() or any(out.iterdir())):  # overwrite: move the old one aside
                old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".old"))
                os.replace(out, old / "store")
                os.replace(tmp, out)
                shutil.rmtree(old)
            else:
                os.replace(tmp, out)  # rename(2) onto an empty folder replaces it
            seen = EncodeStats(counts["n_pairs"], counts["skipped_empty"], counts["skipped_long"], tuple(pieces),
                               tuple(unknown))
            # the vocabulary as the store holds it (preprocess's own is trained in a folder gone when it ends)
            spelt_by = str(out / "spm.model" if vocabulary is not None else getattr(tokenizer, "path", "its"))
            if warning := seen.unknown_warning("preprocess", spelt_by):
                log(warning)
            return meta
        except Exception as e:  # a full disk named the vocabulary it copied, or no file
            if (told := staged_write_error(e, tmp, out)) is not None:
                raise told from None
            raise
        finally:
            for f in files.values():
                f.close()


# meta.json's fields as ``write_store`` writes them: each checked at opening (a value edited by hand, "500" or null,
# ended in an internal error, and a dtype of the same width was read as another kind of number)
_COUNTS = ("vocab_size", "max_len", "n_pairs", "skipped_empty", "skipped_long", "n_kept", "n_src_tokens", "n_tgt_tokens")


def _scan(ids: np.ndarray, chunk: int = 1 << 24) -> tuple[int, int, int]:
    """The smallest and largest id and the number of EOS ids, read a chunk at a time: a memory-mapped store
    stays on disk, and its temporaries are a chunk's."""
    lows, tops, eos = [], [], 0
    for start in range(0, len(ids), chunk):
        part = np.asarray(ids[start:start + chunk])
        lows.append(int(part.min()))
        tops.append(int(part.max()))
        eos += int(np.count_nonzero(part == EOS_ID))
    return min(lows), max(tops), eos


def _check_meta(meta_path: Path, meta: dict) -> None:
    for key in _COUNTS:
        if not isinstance(value := meta.get(key), int) or isinstance(value, bool) or value < 0:
            raise DataError(f"{meta_path}: {key} is {value!r}, not a count; the store is damaged, rebuild it")
    if not isinstance(value := meta.get("vocab_sha256"), str):
        raise DataError(f"{meta_path}: vocab_sha256 is {value!r}, not a sha256; the store is damaged, rebuild it")
    for key, largest in (("dtype", meta["vocab_size"] - 1), ("length_dtype", meta["max_len"])):
        if meta.get(key) != (wrote := _dtype(largest)):
            raise DataError(f"{meta_path}: {key} is {meta.get(key)!r} where its writer takes {wrote!r} (for values up "
                            f"to {largest}); the store is damaged, rebuild it")


class TokenStore:
    """A token store opened read-only; indexes like a list of ``Example`` so ``collate`` takes it as is.

    Everything is checked at opening, so a bad store fails with one line before training starts,
    not at a random batch hours later: a missing or foreign meta.json, another format version, a
    file whose size disagrees with the meta (truncated copy), ids past the vocabulary (bytes overwritten
    in place) and, when ``vocab_sha256`` is given, a store encoded with another vocabulary (its ids would
    index the wrong embeddings, §3.4). Memory: the two offset arrays (8 bytes per pair and side); the ids
    stay on disk, read once at opening for that check.
    """

    def __init__(self, path: Path, vocab_sha256: str | None = None) -> None:
        self.path = Path(path)
        meta_path = self.path / "meta.json"
        meta = read_record(meta_path, DataError, f"{self.path} is not a token store; write one with "
                           "`transformer preprocess`", FORMAT)
        if meta.get("version") != VERSION:
            raise DataError(f"{meta_path}: format version {meta.get('version')!r}, this code reads version "
                            f"{VERSION}; rebuild the store with `transformer preprocess`")
        _check_meta(meta_path, meta)
        if vocab_sha256 is not None and meta["vocab_sha256"] != vocab_sha256:
            raise DataError(f"{meta_path}: encoded with vocabulary {meta['vocab_sha256'][:12]}…, this run's "
                            f"vocabulary is {vocab_sha256[:12]}…; re-encode with the run's spm.model")
        self.stats = meta
        ids_dtype, len_dtype = np.dtype(meta["dtype"]), np.dtype(meta["length_dtype"])
        n = meta["n_kept"]
        arrays = {}
        for name, dtype, count in (("src.ids", ids_dtype, meta["n_src_tokens"]),
                                   ("tgt.ids", ids_dtype, meta["n_tgt_tokens"]),
                                   ("src.len", len_dtype, n), ("tgt.len", len_dtype, n)):
            file = self.path / name
            size = file.stat().st_size if file.is_file() else None
            if size != count * dtype.itemsize:
                found = "missing" if size is None else f"{size} bytes"
                raise DataError(f"{file}: {found}, meta.json says {count * dtype.itemsize} bytes "
                                f"({count} × {dtype.name}); the store is truncated or damaged, rebuild it")
            # np.memmap refuses empty files; an empty store has nothing to map
            arrays[name] = np.memmap(file, dtype=dtype, mode="r") if count else np.zeros(0, dtype)
        self._src_ids, self._tgt_ids = arrays["src.ids"], arrays["tgt.ids"]
        self.src_lengths, self.tgt_lengths = arrays["src.len"], arrays["tgt.len"]
        self._src_offsets = np.concatenate([[0], np.cumsum(self.src_lengths, dtype=np.int64)])
        self._tgt_offsets = np.concatenate([[0], np.cumsum(self.tgt_lengths, dtype=np.int64)])
        if self._src_offsets[-1] != meta["n_src_tokens"] or self._tgt_offsets[-1] != meta["n_tgt_tokens"]:
            raise DataError(f"{self.path}: lengths sum to {self._src_offsets[-1]} / {self._tgt_offsets[-1]} "
                            f"ids, meta.json says {meta['n_src_tokens']} / {meta['n_tgt_tokens']}; rebuild it")
        for name, ids, offsets in (("src.ids", self._src_ids, self._src_offsets),
                                   ("tgt.ids", self._tgt_ids, self._tgt_offsets)):
            if not len(ids):
                continue
            low, top, eos = _scan(ids)
            if top >= meta["vocab_size"] or low < 0:
                raise DataError(f"{self.path / name}: holds id {top if low >= 0 else low}, outside the vocabulary's "
                                f"{meta['vocab_size']} pieces; the store is damaged, rebuild it")
            if low == PAD_ID:  # a block of zero bytes (a crash, a copy cut short and padded) reads as padding
                raise DataError(f"{self.path / name}: holds the padding id {PAD_ID}, which no pair has; the store "
                                "is damaged, rebuild it")
            # each pair is its pieces and one EOS (encode_pairs): lengths moved between pairs (sums unchanged) cut
            # pairs in the wrong places, which no size or sum above shows
            if eos != n or len(ends := np.flatnonzero(ids[offsets[1:] - 1] != EOS_ID)):
                pair = int(ends[0]) if eos == n else None
                raise DataError(f"{self.path / name}: " + (f"pair {pair} does not end with EOS" if pair is not None
                                                          else f"{eos} EOS ids for {n} pairs") +
                                f" ({name.replace('ids', 'len')} and {name} disagree); the store is damaged, rebuild it")

    def __len__(self) -> int:
        return len(self.src_lengths)

    def __getitem__(self, i: int) -> Example:
        """Pair ``i`` as python int lists, EOS included: what ``encode_pairs`` gave for it."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"pair {i} is outside a store of {len(self)} pairs")
        i %= len(self)
        s, t = self._src_offsets, self._tgt_offsets
        return Example(self._src_ids[s[i]:s[i + 1]].tolist(), self._tgt_ids[t[i]:t[i + 1]].tolist())
