"""Streaming reader and length-only batching (data.py): each equals the in-memory algorithm it replaced."""

from __future__ import annotations

import gzip
import itertools
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from transformer.data import (DataError, Example, encode_pairs, iter_lines, make_batches,
                              make_batches_from_lengths, read_lines, read_parallel)


def reference_read_lines(data: bytes) -> list[str]:
    """The whole-file reader that iter_lines replaced (decoding errors aside), kept as the reference; a mark at
    the start of a later line (files joined by `cat`) is removed too."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    text = data.decode("utf-8")
    if not text.strip("\ufeff"):  # byte-order marks alone: no line
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [(line[:-1] if line.endswith("\r") else line).lstrip("\ufeff") for line in lines]


def reference_make_batches(examples: list[Example], max_tokens: int) -> list[list[int]]:
    """A list-based make_batches, the reference: by the longer side's length, then target, then source."""
    order = sorted(range(len(examples)), key=lambda i: (max(len(examples[i].src), len(examples[i].tgt)),
                                                        len(examples[i].tgt), len(examples[i].src)))
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


BLOBS = [b"", b"\n", b"\n\n", b"a", b"a\n", b"a\nb", b"one\r\ntwo\r\n\r\nthree\r", b"x\r\r\n",
         "\ufeffbom\nsecond \ufeff\n".encode(), "\ufeff\r\n".encode(), "\ufeff".encode(), "\ufeff\n".encode(),
         "a\u2028b\nc\u0085d\ne\x0cf\ng\x1eh\x1di\x0bj\n".encode()]


@pytest.mark.parametrize("blob", BLOBS)
def test_iter_lines_equals_the_whole_file_reader(tmp_path: Path, blob: bytes) -> None:
    plain, zipped, two_members = tmp_path / "p.txt", tmp_path / "z.gz", tmp_path / "m.gz"
    plain.write_bytes(blob)
    zipped.write_bytes(gzip.compress(blob))
    two_members.write_bytes(gzip.compress(blob) + gzip.compress(blob))  # `cat a.gz b.gz` is valid gzip
    for path in (plain, zipped, two_members):
        assert list(iter_lines(path)) == read_lines(path) == reference_read_lines(path.read_bytes())


def test_iter_lines_on_multi30k(multi30k: Path) -> None:
    for name in ("val.en.gz", "val.de.gz", "test_2016_flickr.de.gz"):
        assert list(iter_lines(multi30k / name)) == reference_read_lines((multi30k / name).read_bytes())


@pytest.mark.parametrize("zipped", [False, True])
def test_iter_lines_reads_a_pipe(tmp_path: Path, zipped: bool) -> None:
    """/dev/stdin cannot be rewound after the gzip sniff: it must still read right."""
    blob = "ä\r\nb\n".encode()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(gzip.compress(blob) if zipped else blob))
    writer.start()
    assert list(iter_lines(fifo)) == ["ä", "b"]
    writer.join()


def test_iter_lines_streams_and_names_the_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.txt"
    f.write_bytes(b"ok\nstill ok\nbroken \xff here\nnever read\n")
    lines = iter_lines(f)
    assert list(itertools.islice(lines, 2)) == ["ok", "still ok"]  # lines come before the bad one is read
    with pytest.raises(DataError, match=r"bad\.txt:3: invalid UTF-8 \(byte 0xff at byte column 8\)"):
        next(lines)
    cut = tmp_path / "cut.gz"
    cut.write_bytes(gzip.compress(b"".join(b"line %d\n" % i for i in range(20_000)))[:5_000])
    with pytest.raises(DataError, match=r"cut\.gz:\d+: corrupt or truncated gzip file") as e:
        list(iter_lines(cut))
    assert "\n" not in str(e.value)
    with pytest.raises(DataError, match=r"missing\.txt: cannot read"):
        list(iter_lines(tmp_path / "missing.txt"))


class WordTokenizer:
    """One id per whitespace-separated word: real sentence length distributions, no model to train."""

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [[3 + len(w) for w in t.split()] for t in texts]


@pytest.mark.parametrize("max_tokens", [1, 40, 300, 4096])
def test_batches_from_lengths_equal_the_list_algorithm(multi30k: Path, max_tokens: int) -> None:
    pairs = read_parallel(multi30k / "val.en.gz", multi30k / "val.de.gz")
    examples, _ = encode_pairs(pairs, WordTokenizer(), max_len=30)  # many length ties: stability matters
    expected = reference_make_batches(examples, max_tokens)
    assert make_batches(examples, max_tokens) == expected
    src = np.array([len(e.src) for e in examples], dtype=np.uint16)
    tgt = np.array([len(e.tgt) for e in examples], dtype=np.uint16)
    batches = make_batches_from_lengths(src, tgt, max_tokens)
    assert batches == expected and all(type(i) is int for b in batches for i in b)
    assert make_batches_from_lengths([], [], max_tokens) == []
