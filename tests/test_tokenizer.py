"""Tokenizer (§5.1): joint BPE on real Multi30k text, special ids, round trips, refusals."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from transformer.config import SPECIAL_PIECES
from transformer.data import read_lines

from transformer.prepare import find_data_root
from transformer.tokenizer import EOS_ID, PAD_ID, UNK_ID, Tokenizer, TokenizerError

N_LINES = 1000  # per language: ~2,000 training sentences keep training well under a second


@pytest.fixture(scope="module")
def train_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The first N_LINES of Multi30k train en and de, one gzipped and one plain (both inputs work)."""
    root = find_data_root()
    if root is None or not (root / "multi30k" / "train.en.gz").exists():
        pytest.skip("Multi30k not found: set TRANSFORMER_DATA to the shared data folder")
    out = tmp_path_factory.mktemp("spm_text")
    en = read_lines(root / "multi30k" / "train.en.gz")[:N_LINES]
    de = read_lines(root / "multi30k" / "train.de.gz")[:N_LINES]
    (out / "en.gz").write_bytes(gzip.compress(("\n".join(en) + "\n").encode()))
    (out / "de.txt").write_text("\n".join(de) + "\n", encoding="utf-8")
    return [out / "en.gz", out / "de.txt"]


def lines_of(files: list[Path]) -> list[str]:
    """The training text of ``files``, as the trainer reads it (data.read_lines)."""
    return [line for f in files for line in read_lines(f)]


@pytest.fixture(scope="module")
def tok(train_files: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return Tokenizer.train(lines_of(train_files), tmp_path_factory.mktemp("spm") / "spm.model",
                           vocab_size=1000, input_sentence_size=100_000)


def test_special_ids_are_fixed(tok: Tokenizer) -> None:
    assert (PAD_ID, EOS_ID, UNK_ID) == (0, 1, 2)
    assert SPECIAL_PIECES == len({PAD_ID, EOS_ID, UNK_ID})  # the count config's vocab_size check gives
    assert tok.vocab_size == 1000
    assert tok._sp.bos_id() == -1 and not any(tok._sp.is_control(i) for i in range(3, 1000))  # BOS is PAD
    assert tok.pieces("") == [] and tok.encode("") == []
    ids = tok.encode("A man is riding a bike.")
    assert ids and EOS_ID not in ids and PAD_ID not in ids  # encode appends nothing


def test_reloaded_model_is_the_same(tok: Tokenizer) -> None:
    again = Tokenizer(tok.path)
    assert again.sha256 == tok.sha256 and again.vocab_size == tok.vocab_size
    assert again.encode("Zwei Hunde spielen im Schnee.") == tok.encode("Zwei Hunde spielen im Schnee.")


@pytest.mark.parametrize("text", [
    "Two young, White males are outside near many bushes.",
    "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.",
    "A man in an orange hat starring at something.",
])
def test_encode_decode_round_trip(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert "".join(tok.pieces(text)).replace("\u2581", " ").strip() == text
    assert tok.encode_batch([text, text]) == [ids, ids]


def test_decode_drops_pad_and_stops_at_eos(tok: Tokenizer) -> None:
    ids = tok.encode("Ein Hund rennt.")
    other = tok.encode("Eine Katze schläft.")
    assert tok.decode([PAD_ID] + ids + [PAD_ID, PAD_ID]) == "Ein Hund rennt."
    assert tok.decode(ids + [EOS_ID] + other) == "Ein Hund rennt."
    assert tok.decode([EOS_ID] + ids) == ""


def test_words_keep_an_unknown_character_inside_its_word(tok: Tokenizer) -> None:
    """decode's text sets an unknown piece apart ("Zo \u2047"); words group pieces as the model wrote them."""
    ids = tok.encode("Zo\u00d8 \u0416uk ran .")
    assert UNK_ID in ids and len(tok.decode(ids).split()) > 4
    assert tok.words([PAD_ID] + ids + [EOS_ID] + ids) == ["Zo\u2047", "\u2047uk", "ran", "."]
    assert tok.words(tok.encode("Ein Hund rennt.")) == tok.decode(tok.encode("Ein Hund rennt.")).split()
    assert tok.words([EOS_ID]) == [] and tok.words([]) == []


def test_too_large_vocab_is_a_clear_error(train_files: list[Path], tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"vocab_size 100000 is too large.*at most \d+") as e:
        Tokenizer.train(lines_of(train_files), tmp_path / "spm.model", vocab_size=100_000,
                        input_sentence_size=100_000)
    assert "\n" not in str(e.value) and ".cc(" not in str(e.value)
    assert not (tmp_path / "spm.model").exists() and list(tmp_path.iterdir()) == []
    assert "sample" not in str(e.value)  # the whole text was read
    # learnt from a sample (data.spm_input_sentences): the limit is the sample's, and the message says so
    with pytest.raises(TokenizerError, match=r"too large for this training text \(10 sentences, a sample of its "
                                             rf"{len(lines_of(train_files))} \(data.spm_input_sentences\)\): .* lower "
                                             r"data.vocab_size or raise data.spm_input_sentences$"):
        Tokenizer.train(lines_of(train_files), tmp_path / "spm.model", vocab_size=1000, input_sentence_size=10)


def test_too_small_a_vocab_is_a_clear_error_with_our_remedy(train_files: list[Path], tmp_path: Path) -> None:
    """sentencepiece's own message told the user to "decrease character_coverage with --character_coverage", an
    option of its command line, not ours (coverage is fixed at 1.0 here)."""
    with pytest.raises(TokenizerError, match=r"^vocab_size 5 is too small for this training text: sentencepiece "
                                             r"needs \d+ pieces for its characters alone; raise data.vocab_size") as e:
        Tokenizer.train(lines_of(train_files), tmp_path / "spm.model", vocab_size=5, input_sentence_size=100_000)
    assert "character_coverage" not in str(e.value) and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("corrupt", [lambda b: b[: len(b) // 2], lambda b: b"not a model at all"])
def test_corrupt_model_is_refused(tok: Tokenizer, tmp_path: Path, corrupt) -> None:
    bad = tmp_path / "bad.model"
    bad.write_bytes(corrupt(tok.path.read_bytes()))
    with pytest.raises(TokenizerError, match="bad.model"):
        Tokenizer(bad)


def test_missing_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="nope.model"):
        Tokenizer(tmp_path / "nope.model")


def test_model_with_other_special_ids_is_refused(tmp_path: Path) -> None:
    import io

    import sentencepiece as spm
    writer = io.BytesIO()  # sentencepiece's defaults: unk 0, bos 1, eos 2, no pad
    spm.SentencePieceTrainer.train(sentence_iterator=iter(["a b c d e f g"] * 20), model_writer=writer,
                                   model_type="bpe", vocab_size=12, minloglevel=2)
    (tmp_path / "default.model").write_bytes(writer.getvalue())
    with pytest.raises(TokenizerError, match="default.model.*special ids"):
        Tokenizer(tmp_path / "default.model")


def test_training_is_deterministic_per_seed(train_files: list[Path], tok: Tokenizer, tmp_path: Path) -> None:
    same = Tokenizer.train(lines_of(train_files), tmp_path / "a" / "spm.model", vocab_size=1000,
                           input_sentence_size=100_000)
    assert same.sha256 == tok.sha256  # the file path is not part of the model
    # Sampling fewer sentences than there are: the seed picks which, and it is honoured.
    s1 = Tokenizer.train(lines_of(train_files), tmp_path / "s1.model", 500, input_sentence_size=800, seed=1)
    s1b = Tokenizer.train(lines_of(train_files), tmp_path / "s1b.model", 500, input_sentence_size=800, seed=1)
    s2 = Tokenizer.train(lines_of(train_files), tmp_path / "s2.model", 500, input_sentence_size=800, seed=2)
    assert s1.sha256 == s1b.sha256 != s2.sha256
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "s1.model", "s1b.model", "s2.model"]


def test_texts_train_the_same_model_as_files(train_files: list[Path], tok: Tokenizer, tmp_path: Path) -> None:
    texts = [line for f in train_files for line in read_lines(f)]
    from_texts = Tokenizer.train(texts, tmp_path / "t.model", 1000, input_sentence_size=100_000)
    assert from_texts.sha256 == tok.sha256


def test_empty_training_text_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("\n\n", encoding="utf-8")
    with pytest.raises(TokenizerError, match="empty"):
        Tokenizer.train(lines_of([tmp_path / "empty.txt"]), tmp_path / "spm.model", 100, 1000)


def test_symbols_are_kept_whole(tmp_path: Path) -> None:
    """The parsing task's brackets: one piece each, where plain BPE splits "(" from the label."""
    trees = ["(S (NP XX XX )NP (VP XX (NP XX )NP )VP XX )S", "(S (NP XX )NP (VP XX )VP XX )S"] * 50
    words = ["The dog saw a cat .", "It barked ."] * 50
    plain = Tokenizer.train(trees + words, tmp_path / "plain.model", 60, 10_000)
    whole = Tokenizer.train(trees + words, tmp_path / "whole.model", 60, 10_000,
                            symbols=["(S", ")S", "(NP", ")NP", "(VP", ")VP", "XX"])
    assert plain.pieces(trees[1])[:2] == ["▁(", "S"]
    assert whole.pieces(trees[1]) == ["▁" + t for t in trees[1].split()]
    assert whole.decode(whole.encode(trees[0])) == trees[0]


def test_bpe_dropout_at_zero_is_sentencepieces_segmentation(tok: Tokenizer, train_files: list[Path]) -> None:
    """The re-implemented merge order is sentencepiece's own: alpha 0 gives its ids on every sentence."""
    import random

    texts = lines_of(train_files) + ["Ein  Mann\u00a0fährt ﬁ ☃ 😀 ", "", "   x",  # normalization, unknown characters,
                                     "Жук ate ☃☃ snow 😀😀x ☃a☃",  # runs of them (one UNK each, as sentencepiece's)
                                     "ssss nnnnn"]  # equal pairs in a row ("ss" a piece): the leftmost merges first
    assert tok.dropout().encode_batch(texts, 0.0, random.Random(1)) == tok.encode_batch(texts)


def test_bpe_dropout_samples_other_segmentations_of_the_same_text(tok: Tokenizer, train_files: list[Path]) -> None:
    import random

    texts = lines_of(train_files)[:200]
    dropout = tok.dropout()
    a, b = (dropout.encode_batch(texts, 0.1, random.Random(seed)) for seed in (1, 2))
    assert a == dropout.encode_batch(texts, 0.1, random.Random(1))  # a function of the generator's state
    assert a != b and a != tok.encode_batch(texts)
    assert sum(map(len, a)) > sum(map(len, tok.encode_batch(texts)))  # dropped merges leave more pieces
    assert [tok.decode(ids) for ids in a] == [tok.decode(ids) for ids in tok.encode_batch(texts)]  # same text


def test_bpe_dropout_goes_on_merging_after_a_dropped_merge(tok: Tokenizer, train_files: list[Path]) -> None:
    """A dropped merge is one merge not made at that place; the others are still made (Provilkov et al.): with
    the first two chosen merges of each word dropped, the words come out in more pieces than sentencepiece's,
    but far fewer than their letters (a word merges on where the vocabulary has another way)."""
    import random

    class FirstTwoDropped(random.Random):
        """Draws 0.0 (drop) for the first two merges of a word, 0.99 (keep) for the rest."""

        def random(self) -> float:
            self.draws = getattr(self, "draws", 0) + 1
            return 0.0 if self.draws <= 2 else 0.99

    words = [w for w in " ".join(lines_of(train_files)[:50]).split() if len(tok.pieces(w)) == 1 and len(w) >= 6]
    assert len(words) > 10
    sampled = [tok.dropout().encode_batch([word], 0.5, FirstTwoDropped())[0] for word in words]
    assert len(words) < sum(map(len, sampled)) < 0.85 * sum(map(len, words))  # 253 pieces for 341 letters


def test_training_samples_sentences_uniformly() -> None:
    """The reservoir keeps every sentence with the same chance, k / n (Algorithm R): of two sentences, one kept,
    each is the one about half of the seeds; not the last one every time."""
    from transformer.tokenizer import _sample

    kept = [_sample(["first", "second"], 1, seed) for seed in range(200)]
    assert 70 < kept.count(["first"]) < 130 and kept.count(["first"]) + kept.count(["second"]) == 200
    counts = [0] * 5
    for seed in range(400):
        for s in _sample([str(i) for i in range(5)], 2, seed):
            counts[int(s)] += 1
    assert all(120 < c < 200 for c in counts), counts  # each kept 2 / 5 of the time: 160


def test_training_on_blank_text_names_the_text(tmp_path):
    """preprocess named the temporary path of the model it would have written, not the empty corpus."""
    with pytest.raises(TokenizerError, match=r"^cannot train a tokenizer: a.en \+ b.de is empty"):
        Tokenizer.train(["", "  "], tmp_path / "spm.model", 100, 1000, named="a.en + b.de")


def test_a_model_whose_unknown_id_alone_differs_is_refused(tmp_path: Path) -> None:
    """PAD and EOS in place are not enough: UNK_ID is what the prefix and constraint checks look for (an
    unknown character), so a model with its unknown piece elsewhere would let "⁇" through unnoticed."""
    import io

    import sentencepiece as spm
    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(["a b c d e f g"] * 20), model_writer=writer,
                                   model_type="bpe", vocab_size=12, pad_id=0, eos_id=1, bos_id=2, unk_id=3,
                                   minloglevel=2)
    (tmp_path / "unk3.model").write_bytes(writer.getvalue())
    with pytest.raises(TokenizerError, match=r"unk3.model: special ids \(pad, eos, unk\) are \(0, 1, 3\)"):
        Tokenizer(tmp_path / "unk3.model")


def test_the_training_sample_keeps_input_order() -> None:
    """The reservoir's sentences come back in the order of the input, whatever slots the draws replaced: the
    model is a function of the sample, and the sample's order is part of what it is trained on."""
    from transformer.tokenizer import _sample

    lines = [f"{i:03d}" for i in range(50)]
    for seed in range(20):
        kept = _sample(lines, 10, seed)
        assert len(kept) == 10 and kept == sorted(kept), (seed, kept)


def test_a_character_seen_once_is_a_piece_not_unknown(tmp_path: Path) -> None:
    """character_coverage 1.0: every character of the training text is in the vocabulary, however rare (a name's
    'ř' once in a corpus), so it is translated as itself; sentencepiece's default 0.9995 maps the rarest 0.05% of
    the characters to the unknown piece, which the output cannot spell back."""
    lines = ["ein hund läuft durch den schnee"] * 400 + ["dvořák"]
    tokenizer = Tokenizer.train(lines, tmp_path / "spm.model", 40, 1000)
    ids = tokenizer.encode("dvořák")
    assert UNK_ID not in ids and tokenizer.decode(ids) == "dvořák"


def test_a_character_seen_only_in_a_long_line_is_a_piece_not_unknown(tmp_path: Path) -> None:
    """sentencepiece left lines of more than 4,192 bytes out of training without a word (paragraphs, documents):
    a character seen only in them was unknown, and a text of such lines alone was "unreadable"."""
    paragraph = " ".join(["die straße ist lang"] * 300)  # 5,999 bytes
    lines = ["ein hund läuft durch den schnee"] * 400 + [paragraph]
    tokenizer = Tokenizer.train(lines, tmp_path / "spm.model", 40, 1000)
    assert UNK_ID not in tokenizer.encode("straße")
    assert Tokenizer.train([paragraph] * 3, tmp_path / "long.model", 20, 1000).vocab_size == 20


def test_a_text_of_short_lines_trains_the_file_sentencepieces_defaults_write(tmp_path: Path) -> None:
    """The long lines' flag (above) was given for every text, and sentencepiece stores each flag given in the
    model file: the same pieces from the same text came in a file of another sha256, and --ensemble of a run
    trained before it refused one trained after as "another vocabulary". It is given only where a line is
    longer than sentencepiece's default."""
    from sentencepiece import sentencepiece_model_pb2

    def trainer_spec(lines: list[str], name: str):
        Tokenizer.train(lines, tmp_path / name, 40, 1000)
        proto = sentencepiece_model_pb2.ModelProto()
        proto.ParseFromString((tmp_path / name).read_bytes())
        return proto.trainer_spec

    short = ["ein hund läuft durch den schnee"] * 400
    assert not trainer_spec(short, "short.model").HasField("max_sentence_length")
    paragraph = " ".join(["die straße ist lang"] * 300)  # 5,999 bytes
    assert trainer_spec(short + [paragraph], "long.model").max_sentence_length == len(paragraph.encode())
