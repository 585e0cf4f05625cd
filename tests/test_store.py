"""Token store (store.py): a round trip equals encode_pairs on the same text; damaged stores are refused."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import write_slice
from transformer.data import (DataError, collate, encode_pairs, make_batches, make_batches_from_lengths,
                              read_parallel)
from transformer.store import TokenStore, write_store
from transformer.tokenizer import EOS_ID, Tokenizer

MAX_LEN = 24  # short enough that some Multi30k pairs are skipped as too long (A10)


@pytest.fixture(scope="module")
def corpus(multi30k: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Tokenizer]:
    """3,000 Multi30k training pairs plus an empty pair and a whitespace-only side, and a 400-piece BPE."""
    folder = tmp_path_factory.mktemp("corpus")
    src, tgt = write_slice(multi30k, folder, "train", 0, 3000)
    with src.open("a", encoding="utf-8") as s, tgt.open("a", encoding="utf-8") as t:
        s.write("\nA dog .\n")
        t.write("\n \t \n")
    texts = src.read_text(encoding="utf-8").splitlines()[:1000] + tgt.read_text(encoding="utf-8").splitlines()[:1000]
    tokenizer = Tokenizer.train(texts, folder / "spm.model", 400, 10_000)
    return src, tgt, tokenizer


def test_round_trip_equals_encode_pairs(corpus: tuple[Path, Path, Tokenizer], tmp_path: Path) -> None:
    src, tgt, tok = corpus
    meta = write_store(src, tgt, tok, tmp_path / "store", MAX_LEN, chunk_pairs=700)  # 5 chunks
    examples, stats = encode_pairs(read_parallel(src, tgt), tok, MAX_LEN)
    assert (meta["n_pairs"], meta["skipped_empty"], meta["skipped_long"], meta["n_kept"]) == \
        (stats.n_pairs, stats.skipped_empty, stats.skipped_long, stats.n_kept)
    assert stats.n_pairs == 3002 and stats.skipped_empty == 2 and stats.skipped_long > 0
    store = TokenStore(tmp_path / "store", vocab_sha256=tok.sha256)
    assert len(store) == len(examples) and store.stats == meta
    assert [store[i] for i in range(len(store))] == examples
    assert store[-1] == examples[-1] and store[0].src[-1] == EOS_ID
    assert store.src_lengths.tolist() == [len(e.src) for e in examples]
    assert store.tgt_lengths.tolist() == [len(e.tgt) for e in examples]
    assert meta["dtype"] == "uint16" and (tmp_path / "store" / "src.ids").stat().st_size == 2 * meta["n_src_tokens"]
    assert meta["vocab_sha256"] == tok.sha256 and meta["sources"]["tgt"]["bytes"] == tgt.stat().st_size
    indices = [5, 0, 17, len(store) - 1]
    a, b = collate(store, indices), collate(examples, indices)
    assert all((getattr(a, k) == getattr(b, k)).all() for k in ("src", "tgt_in", "tgt_out"))
    assert (a.n_src_tokens, a.n_tgt_tokens, a.indices) == (b.n_src_tokens, b.n_tgt_tokens, b.indices)
    for max_tokens in (64, 500):  # §5.1 batching reads the lengths only, never the ids
        assert make_batches_from_lengths(store.src_lengths, store.tgt_lengths, max_tokens) == \
            make_batches(examples, max_tokens)
    assert [p.name for p in tmp_path.iterdir()] == ["store"]  # no temporary folder left behind
    assert meta["ids_sha256"] == {side: hashlib.sha256((tmp_path / "store" / f"{side}.ids").read_bytes()).hexdigest()
                                  for side in ("src", "tgt")}
    # two pairs swapped, every size the same: meta.json (which a run's records hash) was too, and a run resumed on
    # the store encoded again without a word
    swapped, texts = [], [path.read_text(encoding="utf-8").splitlines(keepends=True) for path in (src, tgt)]
    i, j = [k for k, pair in enumerate(zip(*texts)) if all(0 < len(side.split()) < 8 for side in pair)][:2]  # kept
    for path, lines in zip((src, tgt), texts):
        lines[i], lines[j] = lines[j], lines[i]
        (tmp_path / path.name).write_text("".join(lines), encoding="utf-8")
        swapped.append(tmp_path / path.name)
    again = write_store(*swapped, tok, tmp_path / "again", MAX_LEN)
    assert (again["n_src_tokens"], again["n_tgt_tokens"]) == (meta["n_src_tokens"], meta["n_tgt_tokens"])
    assert again["ids_sha256"] != meta["ids_sha256"]


def test_ids_beyond_uint16_are_stored_as_int32(tmp_path: Path) -> None:
    class BigVocab:
        vocab_size, sha256 = 70_000, "f" * 64

        def encode_batch(self, texts: list[str]) -> list[list[int]]:
            return [[69_990 + len(w) for w in t.split()] for t in texts]

    src, tgt = tmp_path / "s.en", tmp_path / "t.de"
    src.write_text("a bb ccc\nd\n", encoding="utf-8")
    tgt.write_text("eeee\nf gg\n", encoding="utf-8")
    meta = write_store(src, tgt, BigVocab(), tmp_path / "store", max_len=10)  # type: ignore[arg-type]
    store = TokenStore(tmp_path / "store")
    assert meta["dtype"] == "int32" and store[0].src == [69_991, 69_992, 69_993, EOS_ID]
    assert store[1].tgt == [69_991, 69_992, EOS_ID]
    # the lengths take the rule with max_len in place of the vocabulary: at most 10, so uint16 still
    assert meta["length_dtype"] == "uint16" and (tmp_path / "store" / "src.len").stat().st_size == 2 * 2
    (tmp_path / "store" / "tgt.ids").write_bytes(b"\xff" * (tmp_path / "store" / "tgt.ids").stat().st_size)
    with pytest.raises(DataError, match=r"store/tgt\.ids: holds id -1, outside the vocabulary's 70000 pieces"):
        TokenStore(tmp_path / "store")  # int32 is signed: bytes overwritten read as a negative id


@pytest.fixture
def store(corpus: tuple[Path, Path, Tokenizer], tmp_path: Path) -> Path:
    src, tgt, tok = corpus
    write_store(src, tgt, tok, tmp_path / "store", MAX_LEN)
    return tmp_path / "store"


def test_truncated_or_foreign_stores_are_refused(store: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut"
    shutil.copytree(store, cut)
    blob = (cut / "tgt.ids").read_bytes()
    (cut / "tgt.ids").write_bytes(blob[:-2])
    with pytest.raises(DataError, match=r"cut/tgt\.ids: \d+ bytes, meta\.json says \d+ bytes.*truncated") as e:
        TokenStore(cut)
    assert "\n" not in str(e.value)
    (cut / "tgt.ids").unlink()
    with pytest.raises(DataError, match=r"tgt\.ids: missing"):
        TokenStore(cut)
    shutil.rmtree(cut)
    shutil.copytree(store, cut)
    lengths = np.fromfile(cut / "src.len", dtype=np.uint16)
    lengths[0] += 1  # every file the right size, but the lengths no longer add up to the ids
    lengths.tofile(cut / "src.len")
    with pytest.raises(DataError, match=r"cut: lengths sum to \d+ / \d+ ids, meta\.json says"):
        TokenStore(cut)
    shutil.rmtree(cut)
    shutil.copytree(store, cut)
    size = (cut / "src.ids").stat().st_size  # bytes overwritten in place: every size and sum still right (the
    (cut / "src.ids").write_bytes(b"\xff" * size)  # first batch ended in the embedding's IndexError)
    with pytest.raises(DataError, match=r"cut/src\.ids: holds id 65535, outside the vocabulary's \d+ pieces; the store "
                                        r"is damaged"):
        TokenStore(cut)
    ids = np.fromfile(store / "src.ids", dtype=np.uint16)
    vocab = json.loads((store / "meta.json").read_text())["vocab_size"]
    ids[0] = vocab  # the first id past the vocabulary's last
    ids.tofile(cut / "src.ids")
    with pytest.raises(DataError, match=rf"cut/src\.ids: holds id {vocab}, outside the vocabulary's {vocab} pieces"):
        TokenStore(cut)
    # damage no size or sum shows, which trained without a word: zero bytes (padding), pieces moved from one
    # pair to the next in the lengths, an EOS overwritten
    tgt = np.fromfile(store / "tgt.ids", dtype=np.uint16)
    zeroed = tgt.copy()
    zeroed[-5:] = 0
    shutil.copy(store / "src.ids", cut / "src.ids")
    zeroed.tofile(cut / "tgt.ids")
    with pytest.raises(DataError, match=r"cut/tgt\.ids: holds the padding id 0, which no pair has; the store is dam"):
        TokenStore(cut)
    shutil.copy(store / "tgt.ids", cut / "tgt.ids")
    lengths = np.fromfile(store / "src.len", dtype=np.uint16)
    lengths[0], lengths[1] = lengths[0] + 1, lengths[1] - 1
    lengths.tofile(cut / "src.len")
    with pytest.raises(DataError, match=r"cut/src\.ids: pair 0 does not end with EOS \(src\.len and src\.ids disagree\)"):
        TokenStore(cut)
    shutil.copy(store / "src.len", cut / "src.len")
    ids = np.fromfile(store / "src.ids", dtype=np.uint16)
    ids[np.flatnonzero(ids == 1)[3]] = 5
    ids.tofile(cut / "src.ids")
    with pytest.raises(DataError, match=rf"cut/src\.ids: {int((ids == 1).sum())} EOS ids for {len(lengths)} pairs"):
        TokenStore(cut)
    shutil.copy(store / "src.ids", cut / "src.ids")
    TokenStore(cut)  # as written

    meta = json.loads((store / "meta.json").read_text())
    (cut / "meta.json").write_text(json.dumps(meta | {"version": 99}))
    with pytest.raises(DataError, match=r"meta\.json: format version 99, this code reads version 1"):
        TokenStore(cut)
    (cut / "meta.json").write_text(json.dumps({"format": "fairseq"}))
    with pytest.raises(DataError, match=r"meta\.json: not a transformer-token-store"):
        TokenStore(cut)
    (cut / "meta.json").unlink()
    with pytest.raises(DataError, match=r"meta\.json: missing"):
        TokenStore(cut)


@pytest.mark.parametrize("field, value, message", [
    ("vocab_size", "400", r"vocab_size is '400', not a count"),
    ("n_kept", None, r"n_kept is None, not a count"),
    ("n_tgt_tokens", -1, r"n_tgt_tokens is -1, not a count"),
    ("vocab_sha256", None, r"vocab_sha256 is None, not a sha256"),
    ("dtype", "float16", r"dtype is 'float16' where its writer takes 'uint16' \(for values up to 399\)"),
    ("dtype", 5, r"dtype is 5 where its writer takes 'uint16'"),
    ("length_dtype", [1], r"length_dtype is \[1\] where its writer takes 'uint16'"),
    ("version", "1", r"format version '1', this code reads version 1"),
])
def test_a_meta_field_edited_by_hand_is_refused_naming_it(store: Path, tmp_path: Path, field, value, message) -> None:
    """meta.json's values are checked at opening: "500" or null ended in an internal error (TypeError), a count
    given as text was repeated rather than multiplied, and float16 ids, as wide as uint16, were read as numbers."""
    cut = tmp_path / "cut"
    shutil.copytree(store, cut)
    meta = json.loads((store / "meta.json").read_text())
    (cut / "meta.json").write_text(json.dumps(meta | {field: value}))
    with pytest.raises(DataError, match=rf"cut/meta\.json: {message}"):
        TokenStore(cut)


def test_wrong_vocabulary_is_refused(store: Path) -> None:
    other = hashlib.sha256(b"another spm.model").hexdigest()
    with pytest.raises(DataError, match=r"meta\.json: encoded with vocabulary \w+…, this run's vocabulary is"):
        TokenStore(store, vocab_sha256=other)


def test_unequal_line_counts_are_refused(corpus: tuple[Path, Path, Tokenizer], tmp_path: Path) -> None:
    tok = corpus[2]
    src, tgt = tmp_path / "s.en", tmp_path / "t.de"
    src.write_text("a\nb\nc\nd\ne\n", encoding="utf-8")
    tgt.write_text("x\ny\nz\n", encoding="utf-8")
    for chunk_pairs in (1, 2, 3, 10):  # the short file may end inside a chunk or at its edge
        with pytest.raises(DataError, match=r"s\.en has 5 lines, .*t\.de has 3$"):
            write_store(src, tgt, tok, tmp_path / "store", 10, chunk_pairs=chunk_pairs)
        with pytest.raises(DataError, match=r"t\.de has 3 lines, .*s\.en has 5$"):
            write_store(tgt, src, tok, tmp_path / "store", 10, chunk_pairs=chunk_pairs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.en", "t.de"]  # nothing half-written


def test_a_corpus_without_usable_pairs_writes_no_store(corpus: tuple[Path, Path, Tokenizer], tmp_path: Path) -> None:
    """Empty files made a store of 0 pairs, "train with --set data.train_store=...", which training then refused."""
    src, tgt = tmp_path / "s.en", tmp_path / "t.de"
    src.write_text("", encoding="utf-8")
    tgt.write_text("", encoding="utf-8")
    with pytest.raises(DataError, match=r"s\.en: no usable training pairs of 0 \(0 with an empty side"):
        write_store(src, tgt, corpus[2], tmp_path / "store", 10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.en", "t.de"]


def test_existing_output_is_refused_unless_overwrite(corpus: tuple[Path, Path, Tokenizer], tmp_path: Path) -> None:
    tok = corpus[2]
    src, tgt = tmp_path / "s.en", tmp_path / "t.de"
    src.write_text("a b\nc\n", encoding="utf-8")
    tgt.write_text("x\ny z\n", encoding="utf-8")
    out = tmp_path / "store"
    out.mkdir()
    assert write_store(src, tgt, tok, out, 10)["n_kept"] == 2  # an empty folder is fine
    with pytest.raises(DataError, match=r"store: holds an earlier token store; choose another folder, or pass "
                                        r"--overwrite to replace it$"):
        write_store(src, tgt, tok, out, 10)
    tgt.write_text("x\n\n", encoding="utf-8")
    assert write_store(src, tgt, tok, out, 10, overwrite=True)["n_kept"] == 1
    assert len(TokenStore(out)) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.en", "store", "t.de"]


def test_a_store_written_meanwhile_is_not_replaced(corpus: tuple[Path, Path, Tokenizer], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Two `preprocess` into one new folder: the folder was checked at the start alone, so the writer done second
    moved the first one's store aside, and both said done (one user trained on the other's corpus)."""
    import transformer.store as store

    tok = corpus[2]
    src, tgt = tmp_path / "s.en", tmp_path / "t.de"
    src.write_text("a b\nc\n", encoding="utf-8")
    tgt.write_text("x\ny z\n", encoding="utf-8")
    out, other = tmp_path / "store", tmp_path / "other"
    write_store(src, src, tok, other, 10)
    checks = []
    checked = store.check_store_folder

    def meanwhile(folder: Path, overwrite: bool) -> None:  # the other writer finishes between the two checks
        checked(folder, overwrite)
        if not checks:
            shutil.copytree(other, out)
        checks.append(folder)

    monkeypatch.setattr(store, "check_store_folder", meanwhile)
    with pytest.raises(DataError, match="store: holds an earlier token store; choose another folder"):
        write_store(src, tgt, tok, out, 10)
    assert len(checks) == 1 and (out / "meta.json").read_bytes() == (other / "meta.json").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "s.en", "store", "t.de"]  # no staging left


def test_a_store_of_pieces_the_vocabulary_cannot_spell_is_warned_of(corpus: tuple[Path, Path, Tokenizer],
                                                                     tmp_path: Path) -> None:
    """Training from the text warns where many pieces are unknown; a store of the same text was written and trained
    on without a word (Chinese beside an English vocabulary: half its pieces "\u2047")."""
    tok = corpus[2]
    src, tgt = tmp_path / "s.zh", tmp_path / "t.en"
    src.write_text("一只狗在跑\n两个人在说话\n", encoding="utf-8")
    tgt.write_text("a b\nc\n", encoding="utf-8")
    said: list[str] = []
    write_store(src, tgt, tok, tmp_path / "store", 10, log=said.append)
    assert len(said) == 1 and said[0].startswith("warning: preprocess: ") and "of the source's pieces" in said[0]
    said.clear()
    write_store(tgt, tgt, tok, tmp_path / "clean", 10, log=said.append)
    assert not said


def test_overwrite_replaces_an_earlier_store_only(corpus: tuple[Path, Path, Tokenizer], tmp_path: Path) -> None:
    """--overwrite deleted whatever --out named, the folder holding the corpus being encoded included."""
    tok = corpus[2]
    data = tmp_path / "data"
    data.mkdir()
    src, tgt = data / "s.en", data / "t.de"
    src.write_text("a b\nc\n", encoding="utf-8")
    tgt.write_text("x\ny z\n", encoding="utf-8")
    for overwrite in (True, False):  # without it, --overwrite was offered, and then refused
        with pytest.raises(DataError, match=r"data: exists, and it has no meta.json, .* \(--overwrite replaces an "
                                            r"earlier token store only\)"):
            write_store(src, tgt, tok, data, 10, overwrite=overwrite)
    with pytest.raises(DataError, match=r"and it holds folders \(data\)"):
        write_store(src, tgt, tok, tmp_path, 10, overwrite=True)
    assert sorted(p.name for p in data.iterdir()) == ["s.en", "t.de"]
    store = tmp_path / "store"
    write_store(src, tgt, tok, store, 10)
    (store / "notes.txt").write_text("mine\n")  # beside an earlier store: not deleted with it
    with pytest.raises(DataError, match=r"and it holds notes\.txt, which this command does not write"):
        write_store(src, tgt, tok, store, 10, overwrite=True)
    (store / "notes.txt").unlink()
    write_store(src, tgt, tok, store, 10, overwrite=True)
