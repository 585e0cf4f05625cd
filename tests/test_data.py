"""Data (§5.1): reading, pairing, encoding, length batching, shuffling, the Multi30k downloader."""

from __future__ import annotations

import gzip
import math
import os
import re
import shutil
import subprocess
import threading
import zlib
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer.data import (BatchOrder, DataError, Example, ShapeBuckets, batches_sha256, collate,
                              encode_for_decoding, encode_pairs, iter_lines, lengths, make_batches, padding_fraction,
                              read_lines, read_parallel)
from transformer.prepare import find_data_root
from transformer.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer


class CharTokenizer:
    """One id per character (ord + 10), so lengths are hand-countable."""

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [[ord(c) + 10 for c in t] for t in texts]


def multi30k(name: str) -> Path:
    root = find_data_root()
    if root is None or not (root / "multi30k" / name).exists():
        pytest.skip("Multi30k not found: set TRANSFORMER_DATA to the shared data folder")
    return root / "multi30k" / name


# --- reading ---------------------------------------------------------------------------------------

def test_gz_and_plain_read_identically(tmp_path: Path) -> None:
    lines = read_lines(multi30k("val.de.gz"))
    assert len(lines) == 1014 and lines[0].startswith("Eine Gruppe von Männern")
    plain = tmp_path / "val.de"
    plain.write_bytes(gzip.decompress(multi30k("val.de.gz").read_bytes()))
    assert read_lines(plain) == lines
    disguised = tmp_path / "val.de.txt"  # gzip detected by magic bytes, not by the suffix
    disguised.write_bytes(multi30k("val.de.gz").read_bytes())
    assert read_lines(disguised) == lines


def test_crlf_and_final_newline(tmp_path: Path) -> None:
    f = tmp_path / "crlf.txt"
    f.write_bytes(b"one\r\ntwo\r\n\r\nthree\r")
    assert read_lines(f) == ["one", "two", "", "three"]
    f.write_bytes(b"a\nb\n")
    assert read_lines(f) == ["a", "b"]  # a trailing \n adds no empty line
    f.write_bytes(b"a\nb")
    assert read_lines(f) == ["a", "b"]  # a final line without \n counts
    f.write_bytes(b"\n")
    assert read_lines(f) == [""]
    f.write_bytes(b"")
    assert read_lines(f) == []
    # files joined by `cat`, each with its mark: sacreBLEU scored "\ufeffEin" as another word than "Ein"
    f.write_bytes("\ufeffein\n\ufeffzwei\n\ufeff\n".encode())
    assert read_lines(f) == ["ein", "zwei", ""]


def test_old_mac_line_endings_are_refused(tmp_path: Path) -> None:
    f = tmp_path / "mac.txt"
    f.write_bytes(b"one\rtwo\rthree\r")  # read as one line, three sentences would be translated (or trained) as one
    with pytest.raises(DataError, match=r"mac.txt: .*old Mac line endings.*tr '\\r' '\\n'"):
        read_lines(f)
    for ending in (b"\n", b"\r\n"):  # an editor's final line ending after them: still one line, was taken
        f.write_bytes(b"one\rtwo\rthree" + ending)
        with pytest.raises(DataError, match=r"mac.txt: .*old Mac line endings"):
            read_lines(f)
    f.write_bytes(b"one\rtwo\nthree\r")  # a stray carriage return inside a line of a "\n" file is text, kept
    assert read_lines(f) == ["one\rtwo", "three"]


def test_utf16_without_its_mark_is_refused(tmp_path: Path) -> None:
    """UTF-16 without a byte-order mark is valid UTF-8 (NUL is a character): it was translated line by line into
    noise, a line more than the file has, and its vocabulary split into letters. A NUL inside a line stays."""
    f = tmp_path / "u16.txt"
    for codec in ("utf-16-le", "utf-16-be", "utf-32-le"):
        for text in ("A dog runs.\nTwo men.\n", "Hi\nA dog runs.\n", "\nA dog runs.\n"):  # short first lines too
            f.write_bytes(text.encode(codec))
            with pytest.raises(DataError, match=r"u16.txt: NUL bytes between its characters: UTF-16 or UTF-32 text"):
                read_lines(f)
    f.write_bytes(b"a dog\x00 runs .\n\t\x00\x1b\n")
    assert read_lines(f) == ["a dog\x00 runs .", "\t\x00\x1b"]


@pytest.mark.parametrize("codec, encoding", [("utf-16", "UTF-16"), ("utf-16-be", "UTF-16"), ("utf-32", "UTF-32"),
                                             ("utf-32-be", "UTF-32")])
def test_utf16_with_its_mark_is_refused_by_name(tmp_path: Path, codec: str, encoding: str) -> None:
    """`iconv -t UTF-16` and Windows' "Unicode" write the mark: a short first line ("A dog.") passed under the NUL
    test's 90%, and the file was "invalid UTF-8 (byte 0xff at byte column 1)"."""
    f = tmp_path / "u16.txt"
    text = ("\ufeff" if codec.endswith("-be") else "").encode(codec) + "A dog.\nA cat.\n".encode(codec)
    f.write_bytes(text)
    with pytest.raises(DataError, match=rf"^{f}: it begins with a {encoding} byte-order mark: {encoding} text, not "
                                        rf"UTF-8; convert it with iconv -t UTF-8 -f {encoding}$"):
        read_lines(f)
    z = tmp_path / "u16.gz"
    z.write_bytes(gzip.compress(text))
    with pytest.raises(DataError, match=rf"convert it with zcat {z} \| iconv -t UTF-8 -f {encoding}$"):
        read_lines(z)


def test_unicode_line_separators_stay_inside_the_line(tmp_path: Path) -> None:
    text = "a\u2028b\nc\u0085d\ne\x0cf\ng\x1eh\x1di\x0bj\n"
    f = tmp_path / "seps.txt"
    f.write_bytes(text.encode("utf-8"))
    assert read_lines(f) == ["a\u2028b", "c\u0085d", "e\x0cf", "g\x1eh\x1di\x0bj"]
    g = tmp_path / "seps.gz"
    g.write_bytes(gzip.compress(text.encode("utf-8")))
    assert len(read_lines(g)) == 4


def test_invalid_utf8_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.txt"
    f.write_bytes("ok\nstill ok\nbroken \xff here\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"bad\.txt:3: invalid UTF-8") as e:
        read_lines(f)
    assert "\n" not in str(e.value)
    g = tmp_path / "bad.gz"
    g.write_bytes(gzip.compress(b"\xc3\n"))
    with pytest.raises(DataError, match=r"bad\.gz:1: invalid UTF-8"):
        read_lines(g)


def test_truncated_gzip_is_a_data_error(tmp_path: Path) -> None:
    blob = multi30k("val.en.gz").read_bytes()
    f = tmp_path / "cut.en.gz"
    f.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(DataError, match=r"cut\.en\.gz") as e:
        read_lines(f)
    # the line named is the first one the cut left incomplete: every line before it was read whole
    whole = zlib.decompressobj(wbits=31).decompress(blob[: len(blob) // 2]).count(b"\n")
    assert f"cut.en.gz:{whole + 1}: corrupt or truncated gzip file" in str(e.value)


def test_a_pipes_lines_come_as_they_are_written() -> None:
    """A pipe (stdin) is read as it is written: a line is yielded before the writer has closed, so a
    command translates what was typed so far; gzip comes through a pipe too."""
    read, write = os.pipe()
    try:
        lines = iter_lines(Path(f"/dev/fd/{read}"))
        os.write(write, b"one\n")
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(next(lines)), daemon=True)
        reader.start()
        reader.join(30)  # a reader that waits for the end of the input is still waiting
        assert got == ["one"]
        os.write(write, "tw\u00f6\r\n".encode())
        os.close(write)
        write = -1
        assert list(lines) == ["twö"]
    finally:
        for fd in (read, write):
            if fd >= 0:
                os.close(fd)
    read, write = os.pipe()
    os.write(write, gzip.compress(b"a\nb\n"))
    os.close(write)
    assert read_lines(Path(f"/dev/fd/{read}")) == ["a", "b"]
    os.close(read)
    # gzip whose first byte comes alone (a slow writer): it was read as text, "invalid UTF-8"
    read, write = os.pipe()
    blob = gzip.compress(b"a\nb\n")
    os.write(write, blob[:1])
    got = []
    reader = threading.Thread(target=lambda: got.append(read_lines(Path(f"/dev/fd/{read}"))), daemon=True)
    reader.start()
    reader.join(0.5)
    os.write(write, blob[1:])
    os.close(write)
    reader.join(30)
    os.close(read)
    assert got == [["a", "b"]]


def test_parallel_files_must_have_equal_line_counts(tmp_path: Path) -> None:
    src, tgt = tmp_path / "s.en", tmp_path / "t.de"
    src.write_text("a\nb\nc\n", encoding="utf-8")
    tgt.write_text("x\ny\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"s\.en has 3 lines.*t\.de has 2"):
        read_parallel(src, tgt)
    tgt.write_text("x\ny\nz", encoding="utf-8")
    assert read_parallel(src, tgt) == [("a", "x"), ("b", "y"), ("c", "z")]


# --- encoding --------------------------------------------------------------------------------------

def test_empty_and_overlong_pairs_are_skipped_and_counted() -> None:
    pairs = [("abc", "de"), ("  ", "xyz"), ("abc", "\t"), ("abcd", "de"), ("ab", "defg"), ("abc", "def")]
    examples, stats = encode_pairs(pairs, CharTokenizer(), max_len=4)  # 3 chars + EOS fit, 4 do not
    assert (stats.n_pairs, stats.skipped_empty, stats.skipped_long, stats.n_kept) == (6, 2, 2, 2)
    assert examples == [Example([107, 108, 109, EOS_ID], [110, 111, EOS_ID]),
                        Example([107, 108, 109, EOS_ID], [110, 111, 112, EOS_ID])]


def test_a_side_with_no_piece_is_empty(tmp_path: Path) -> None:
    """A side of characters the vocabulary's normalisation makes spaces (zero-width space, BOM, direction mark)
    was kept by str.strip() and trained on as EOS against a sentence, where `translate` counts such a line as
    blank; it is empty, and counted so."""
    tok = Tokenizer.train(["a dog runs", "ein hund läuft"] * 50, tmp_path / "spm.model", 30, 1000)
    pairs = [("\u200b", "ein hund"), ("a dog", "\u200e\ufeff"), ("a dog", "ein hund"), ("", "")]
    kept: list[int] = []
    examples, stats = encode_pairs(pairs, tok, max_len=20, kept=kept)
    assert (stats.n_pairs, stats.skipped_empty, stats.skipped_long, len(examples), kept) == (4, 3, 0, 1, [2])


def test_encode_for_decoding_never_truncates() -> None:
    ids = encode_for_decoding(["", "ab", "x" * 1000], CharTokenizer())
    assert ids[0] == [EOS_ID] and ids[1] == [107, 108, EOS_ID] and len(ids[2]) == 1001


def test_real_pairs_encode(tmp_path: Path) -> None:
    pairs = read_parallel(multi30k("val.en.gz"), multi30k("val.de.gz"))
    en = [s for s, _ in pairs[:300]]
    tok = Tokenizer.train(en + [t for _, t in pairs[:300]], tmp_path / "spm.model", 300, 10_000)
    examples, stats = encode_pairs(pairs, tok, max_len=20)
    assert stats.n_pairs == 1014 and stats.skipped_empty == 0 and 0 < stats.skipped_long < 1014
    assert len(examples) == stats.n_kept
    assert all(e.src[-1] == EOS_ID and e.tgt[-1] == EOS_ID and max(len(e.src), len(e.tgt)) <= 20
               for e in examples)
    assert all(EOS_ID not in e.src[:-1] and PAD_ID not in e.src for e in examples)


# --- batching --------------------------------------------------------------------------------------

def test_collate_shifts_targets_right() -> None:
    examples = [Example([5, 6, EOS_ID], [7, 8, 9, EOS_ID]), Example([5, EOS_ID], [7, EOS_ID])]
    b = collate(examples, [1, 0])
    assert b.indices == [1, 0] and (b.n_src_tokens, b.n_tgt_tokens) == (5, 6)
    assert b.src.tolist() == [[5, EOS_ID, PAD_ID], [5, 6, EOS_ID]] and b.src.dtype == torch.long
    assert b.tgt_out.tolist() == [[7, EOS_ID, PAD_ID, PAD_ID], [7, 8, 9, EOS_ID]]
    assert b.tgt_in.tolist() == [[BOS_ID, 7, PAD_ID, PAD_ID], [BOS_ID, 7, 8, 9]]
    for row, i in enumerate(b.indices):  # §3.1: position j of the input is target position j - 1
        n = len(examples[i].tgt)
        assert b.tgt_in[row, 1:n].tolist() == b.tgt_out[row, :n - 1].tolist() == examples[i].tgt[:-1]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(4, 99), max_size=8), st.lists(st.integers(4, 99), max_size=8)),
                min_size=1, max_size=6))
def test_collate_equals_padding_row_by_row(pairs) -> None:
    examples = [Example(s + [EOS_ID], t + [EOS_ID]) for s, t in pairs]
    b = collate(examples, list(range(len(examples))))

    def padded(rows: list[list[int]]) -> list[list[int]]:
        return [r + [PAD_ID] * (max(map(len, rows)) - len(r)) for r in rows]

    assert b.src.tolist() == padded([e.src for e in examples])
    assert b.tgt_out.tolist() == padded([e.tgt for e in examples])
    assert b.tgt_in.tolist() == padded([[BOS_ID] + e.tgt[:-1] for e in examples])
    assert b.src.dtype == b.tgt_in.dtype == b.tgt_out.dtype == torch.long


def random_examples(n: int, seed: int) -> list[Example]:
    """Pairs whose source and target lengths are correlated, as translations are."""
    g = torch.Generator().manual_seed(seed)
    tgt = torch.randint(1, 60, (n,), generator=g)
    src = (tgt + torch.randint(-5, 6, (n,), generator=g)).clamp(min=1)
    return [Example([3] * s, [4] * t) for s, t in zip(src.tolist(), tgt.tolist())]


@pytest.mark.parametrize("max_tokens", [50, 200, 1000])
def test_make_batches_respects_padded_budgets_and_covers_all(max_tokens: int) -> None:
    examples = random_examples(500, seed=max_tokens) + [Example([3] * 70, [4] * 2)]  # 70 > 50: alone
    batches = make_batches(examples, max_tokens)
    assert sorted(i for b in batches for i in b) == list(range(len(examples)))
    for b in batches:
        n_src, n_tgt = max(len(examples[i].src) for i in b), max(len(examples[i].tgt) for i in b)
        assert len(b) == 1 or (len(b) * n_src <= max_tokens and len(b) * n_tgt <= max_tokens)
    assert make_batches(examples, max_tokens) == batches  # deterministic
    assert all(batches)
    if max_tokens == 50:
        assert [len(examples) - 1] in batches
        assert make_batches([Example([3] * 70, [4] * 2), Example([3], [4] * 60)], 50) == [[1], [0]]
    # Greedy filling: a batch is only closed when the next example would break a budget.
    for b, nxt in zip(batches, batches[1:]):
        grown = b + nxt[:1]
        assert len(grown) * max(max(len(examples[i].src), len(examples[i].tgt)) for i in grown) > max_tokens
    # Length sorting keeps padding low (§5.1 "batched together by approximate sequence length").
    unsorted, start = [], 0
    for b in batches:
        unsorted.append(list(range(start, start + len(b))))
        start += len(b)
    assert padding_fraction(*lengths(examples), batches) < 0.5 * padding_fraction(*lengths(examples), unsorted)


def test_batches_sort_by_the_longer_side() -> None:
    """The sort key is max(source, target) length (A10's bucket length, the one the budget binds on), then
    target, then source: pairs whose longer sides match share a batch, whichever side is the longer."""
    examples = [Example([3] * 9, [4] * 2), Example([3] * 2, [4] * 3), Example([3] * 2, [4] * 9),
                Example([3] * 3, [4] * 2)]
    assert make_batches(examples, 18) == [[3, 1], [0, 2]]  # by (target, source): [[3, 0], [1, 2]]
    assert make_batches(examples, 100) == [[3, 1, 0, 2]]


def test_batches_sha256_names_a_plan() -> None:
    plan = [[0, 1], [2]]
    assert batches_sha256(plan) == batches_sha256([[0, 1], [2]])
    assert len({batches_sha256(p) for p in (plan, [[0], [1, 2]], [[1, 0], [2]], [[0, 1, 2]], [])}) == 5


def test_padding_fraction_by_hand() -> None:
    examples = [Example([1, 1], [1]), Example([1, 1, 1, 1], [1, 1, 1])]
    assert padding_fraction(*lengths(examples), [[0, 1]]) == pytest.approx(1 - 10 / 14)
    assert padding_fraction(*lengths(examples), [[0], [1]]) == 0.0
    assert padding_fraction([], [], []) == 0.0  # no batches: nothing padded (not a division by zero)


@pytest.mark.parametrize("per_doubling", [1, 4, 8])
def test_shape_buckets_pad_each_length_to_the_next_bucket(per_doubling: int) -> None:
    buckets = ShapeBuckets(per_doubling, 1000)
    n = list(range(1, 2049))
    padded = buckets.lengths(n).tolist()
    every = [math.ceil(8 * 2 ** (k / per_doubling) - 1e-9) for k in range(11 * per_doubling + 1)]
    assert padded == [min(b for b in every if b >= x) for x in n]  # the smallest bucket that holds it
    assert all(p < max(x, 8) * 2 ** (1 / per_doubling) + 1 for x, p in zip(n, padded))
    assert len(set(padded)) == len({b for b in every if b <= 2048})
    longer = int(buckets.lengths([30])[0])
    assert buckets.shape(9, 30) == buckets.shape(30, 2) == (1000 // longer, longer, longer)
    assert buckets.shape(5000, 3)[0] == 1  # longer than the budget alone: a batch of one, as without buckets


@pytest.mark.parametrize("per_doubling", [4, 8])
def test_bucketed_batches_take_a_shape_per_bucket_within_the_budget(per_doubling: int) -> None:
    examples = random_examples(3000, seed=per_doubling)
    buckets = ShapeBuckets(per_doubling, 600)
    batches = make_batches(examples, 600, buckets)
    assert sorted(i for b in batches for i in b) == list(range(len(examples)))
    shapes = buckets.shapes(*lengths(examples), batches)
    longest = max(max(len(e.src), len(e.tgt)) for e in examples)
    assert len(shapes) == len(set(buckets.lengths(range(1, longest + 1)).tolist()))  # one per bucket
    plain = {(len(b), max(len(examples[i].src) for i in b), max(len(examples[i].tgt) for i in b))
             for b in make_batches(examples, 600)}
    assert len(plain) > 2 * len(shapes)  # without buckets: more, and more with every new length
    for b in batches:
        batch = collate(examples, b, buckets)
        rows, src_len, tgt_len = batch.src.size(0), batch.src.size(1), batch.tgt_in.size(1)
        assert (rows, src_len, tgt_len) in shapes and rows * max(src_len, tgt_len) <= 600
        assert batch.tgt_out.shape == batch.tgt_in.shape == (rows, tgt_len)
        plain = collate(examples, b)  # the same examples, unpadded: the same rows and counts, then padding
        n, s, t = plain.src.size(0), plain.src.size(1), plain.tgt_in.size(1)
        assert torch.equal(batch.src[:n, :s], plain.src) and torch.equal(batch.tgt_out[:n, :t], plain.tgt_out)
        assert torch.equal(batch.tgt_in[:n, :t], plain.tgt_in)
        assert (batch.src[:n, s:] == PAD_ID).all() and (batch.tgt_out[:, t:] == PAD_ID).all()
        assert (batch.src[n:, 0] == EOS_ID).all() and (batch.src[n:, 1:] == PAD_ID).all()  # the added rows
        assert (batch.tgt_out[n:] == PAD_ID).all() and (batch.tgt_in[n:] == PAD_ID).all()
        assert (batch.n_src_tokens, batch.n_tgt_tokens, batch.indices) == (plain.n_src_tokens, plain.n_tgt_tokens, b)
        assert torch.equal(batch.tgt_out.flatten()[batch.positions], plain.tgt_out.flatten()[plain.positions])
    bucketed = padding_fraction(*lengths(examples), batches, buckets)
    assert padding_fraction(*lengths(examples), batches) < bucketed < 0.5


def test_padding_fraction_of_buckets_by_hand() -> None:
    examples = [Example([1] * 9, [1] * 3), Example([1] * 2, [1] * 2)]  # both sides: 9 -> 10 (4 per doubling)
    assert padding_fraction(*lengths(examples), [[0, 1]], ShapeBuckets(4, 40)) == pytest.approx(1 - 16 / (4 * 20))


def test_batch_order_is_deterministic_and_sharded() -> None:
    order = BatchOrder(101, seed=7)
    e0, e1 = order.epoch_order(0), order.epoch_order(1)
    assert sorted(e0) == list(range(101)) and e0 != e1 and e0 != list(range(101))
    assert BatchOrder(101, seed=7).epoch_order(0) == e0  # a resumed run replays it
    assert BatchOrder(101, seed=8).epoch_order(0) != e0
    r0, r1 = BatchOrder(101, 7, rank=0, world_size=2), BatchOrder(101, 7, rank=1, world_size=2)
    for epoch in (0, 3):
        a, b = r0.epoch_order(epoch), r1.epoch_order(epoch)
        assert len(a) == len(b) == len(r0) == 50 and not set(a) & set(b)
    with pytest.raises(DataError, match="2 batches for 3 ranks"):
        BatchOrder(2, 0, rank=0, world_size=3)


def test_neighbouring_seeds_draw_their_own_batch_orders() -> None:
    """Seeded with seed + epoch (version 1), seed 8 trained seed 7's orders an epoch ahead: a band of runs of
    seeds 1, 2, 3... was read as if their orders were independent draws. Version 2 draws each (seed, epoch)'s own;
    runs begun with version 1 keep it, so they resume exactly."""
    assert BatchOrder(101, 8, version=1).epoch_order(0) == BatchOrder(101, 7, version=1).epoch_order(1)
    orders = {tuple(BatchOrder(101, seed).epoch_order(epoch)) for seed in range(6) for epoch in range(6)}
    assert len(orders) == 36
    assert BatchOrder(101, 7).version == 2 and BatchOrder(101, 7).epoch_order(0) == BatchOrder(101, 7).epoch_order(0)
    with pytest.raises(ValueError, match="batch order version 3"):
        BatchOrder(101, 7, version=3)


def test_subword_sampling_segments_each_epoch_anew_reproducibly(multi30k: Path, tmp_path: Path) -> None:
    """Epochs differ from each other and from the deterministic segmentation; an epoch sampled in the
    worker process equals the same epoch sampled here (the seed carries across processes); every
    batch keeps its token budget."""
    from transformer.data import SampledEpochs, read_lines, read_parallel, sample_examples
    from transformer.tokenizer import Tokenizer

    src, tgt = tmp_path / "train.en", tmp_path / "train.de"
    for path, lang in ((src, "en"), (tgt, "de")):
        path.write_text("\n".join(read_lines(multi30k / f"train.{lang}.gz")[:300]) + "\n", encoding="utf-8")
    pairs = read_parallel(src, tgt)
    tok = Tokenizer.train([s for p in pairs for s in p], tmp_path / "spm.model", 400, 10_000)
    plain, _ = encode_pairs(pairs, tok, 256)
    dropout = tok.dropout()
    e0, e1 = (sample_examples(pairs, dropout, 0.1, 7, epoch, 256) for epoch in (0, 1))
    assert len(e0) == len(e1) == len(plain) == 300
    assert [e.src for e in e0] != [e.src for e in e1] and [e.tgt for e in e0] != [e.tgt for e in plain]
    assert [tok.decode(e.tgt) for e in e1] == [tok.decode(e.tgt) for e in plain]
    sampler = SampledEpochs(src, tgt, tok.path, 0.1, 7, 256, 512)
    try:
        examples, batches = sampler(1)
    finally:
        sampler.close()
    assert examples == e1
    assert sorted(i for b in batches for i in b) == list(range(len(e1)))
    for b in batches:
        assert len(b) * max(max(len(examples[i].src), len(examples[i].tgt)) for i in b) <= 512 or len(b) == 1


def test_closing_the_sampler_ends_the_next_epochs_sampling_under_way(multi30k: Path, tmp_path: Path) -> None:
    """close() waited for the next epoch's sampling, started as the last one was taken (minutes on a large corpus):
    a run stopped by SIGTERM exited that much later, and a second SIGTERM in the wait hung it for good. The worker
    now ends at once, its epoch unfinished."""
    from transformer.data import SampledEpochs, read_lines, read_parallel
    from transformer.tokenizer import Tokenizer

    src, tgt = tmp_path / "train.en", tmp_path / "train.de"
    for path, lang in ((src, "en"), (tgt, "de")):  # an epoch of seconds: the next is still sampling when closed
        path.write_text("\n".join(read_lines(multi30k / f"train.{lang}.gz")[:500] * 30) + "\n", encoding="utf-8")
    tok = Tokenizer.train([s for p in read_parallel(src, tgt)[:500] for s in p], tmp_path / "spm.model", 300, 10_000)
    sampler = SampledEpochs(src, tgt, tok.path, 0.1, 7, 256, 512)
    sampler(0)
    workers, ahead = list(sampler._pool._processes.values()), sampler._ahead[1]
    # a terminal's Ctrl-C reaches the worker too: it printed its own KeyboardInterrupt traceback; close() ends it
    import signal
    status = Path(f"/proc/{workers[0].pid}/status").read_text().splitlines()
    assert int(next(line for line in status if line.startswith("SigIgn:")).split()[1], 16) >> (signal.SIGINT - 1) & 1
    sampler.close()
    assert not ahead.done() or ahead.cancelled() or ahead.exception() is not None  # its sampling did not finish
    # ended: its sentinel says so whoever reaped it (is_alive() raced the executor's own thread, which reaps it too)
    import multiprocessing.connection
    assert workers and all(multiprocessing.connection.wait([w.sentinel], timeout=0) for w in workers)


def test_the_sampling_worker_ends_with_its_trainer(multi30k: Path, tmp_path: Path) -> None:
    """A trainer killed by SIGKILL (or the OOM killer) left its subword-sampling worker process behind, waiting
    on its task queue for ever with its ~400 MB of training text; it now ends within seconds of its parent."""
    import signal
    import subprocess
    import sys
    import textwrap
    import time

    from transformer.data import read_lines, read_parallel
    from transformer.tokenizer import Tokenizer

    src, tgt = tmp_path / "train.en", tmp_path / "train.de"
    for path, lang in ((src, "en"), (tgt, "de")):
        path.write_text("\n".join(read_lines(multi30k / f"train.{lang}.gz")[:100]) + "\n", encoding="utf-8")
    tok = Tokenizer.train([s for p in read_parallel(src, tgt) for s in p], tmp_path / "spm.model", 300, 10_000)
    trainer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from pathlib import Path
        from transformer.data import SampledEpochs
        sampler = SampledEpochs(Path({str(src)!r}), Path({str(tgt)!r}), Path({str(tok.path)!r}), 0.1, 7, 256, 512)
        sampler(0)
        print(*sampler._pool._processes, flush=True)
        time.sleep(600)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(trainer.stdout.readline())
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    def running() -> bool:  # a zombie (exited, not yet reaped by init) has its /proc entry until then
        try:
            return Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + 30
    while running() and time.monotonic() < deadline:
        time.sleep(0.2)
    if alive := running():
        os.kill(worker, signal.SIGKILL)
    assert not alive, "the sampling worker outlived its trainer by 30 s"


def test_a_pair_of_files_is_named_whole_where_they_lie_apart(tmp_path):
    """The logs named the second file by its name alone: a target in another folder read as if beside the source."""
    from transformer.data import pair_named

    (tmp_path / "u").mkdir()
    src = tmp_path / "train.en"
    assert pair_named(src, tmp_path / "train.fr") == f"{src} + train.fr"
    assert pair_named(src, tmp_path / "u" / "train.fr") == f"{src} + {tmp_path / 'u' / 'train.fr'}"


@pytest.mark.parametrize("tool, magic_name", [("bzip2", "bzip2"), ("xz", "xz"), ("zstd", "zstd")])
def test_a_file_of_another_compressor_is_named(tmp_path, tool, magic_name):
    """A .bz2 or .xz corpus was "invalid UTF-8 (byte 0xfd at byte column 1)": named, and how to decompress it."""
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")
    plain = tmp_path / "train.de"
    plain.write_text("Ein Hund.\n" * 50)
    subprocess.run([tool, "-k", "-q", str(plain)], check=True)
    packed = next(p for p in tmp_path.iterdir() if p != plain)
    with pytest.raises(DataError, match=rf"^{re.escape(str(packed))}: {magic_name}-compressed, and gzip's alone is "
                                        "read: decompress it first"):
        read_lines(packed)


def test_latin1_text_is_refused_with_the_conversion(tmp_path):
    (tmp_path / "l.de").write_bytes("Ein Hund läuft.\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"l.de:1: invalid UTF-8 \(byte 0xe4 at byte column 11\); the file must be "
                                        r"UTF-8 text \(from Latin-1, say: iconv -f latin1 -t UTF-8\)$"):
        read_lines(tmp_path / "l.de")
