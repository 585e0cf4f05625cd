"""The run's vocabulary (§5.1): trained from the training files with the run's seed, and reused only for the
inputs its record names: one left by an attempt without checkpoints is trained anew for others."""

import json
import re
from pathlib import Path

import pytest

from transformer.config import load_config
from transformer.tokenizer import Tokenizer
from transformer.vocabulary import open_vocabulary


def paths(overrides: list[str]) -> tuple[Path, Path]:
    value = {o.split("=", 1)[0]: o.split("=", 1)[1].strip('"') for o in overrides}
    return Path(value["data.train_src"]), Path(value["data.train_tgt"])


def test_the_record_names_both_files_and_the_seed(tmp_path, tiny_overrides):
    """A vocabulary left in the folder (by an attempt that failed before its first checkpoint) is reused for
    the same inputs, and trained anew for another target file or another seed (each is an input of the model:
    the seed draws its training sample), the log naming what changed."""
    src, tgt = paths(tiny_overrides)
    cfg = load_config("tiny", tiny_overrides)
    path = tmp_path / "spm.model"
    first = open_vocabulary(cfg, src, tgt, path, lambda m: None, resuming=False)
    said: list[str] = []
    assert open_vocabulary(cfg, src, tgt, path, said.append, resuming=False).sha256 == first.sha256
    assert said == []
    seeded = load_config("tiny", tiny_overrides + ["train.seed=7", "data.spm_input_sentences=200"])
    other = open_vocabulary(seeded, src, tgt, path, said.append, False)
    assert said[0].startswith(f"{path} was trained from other inputs than this config asks for (")
    assert "seed: 1 -> 7" in said[0] and "training a new one in its place" in said[0]
    assert other.sha256 != first.sha256 and Tokenizer(path).sha256 == other.sha256
    assert json.loads(path.with_suffix(".json").read_text())["seed"] == 7
    tgt.write_text(tgt.read_text(encoding="utf-8").replace("Hund", "Katze"), encoding="utf-8")
    said.clear()
    open_vocabulary(seeded, src, tgt, path, said.append, resuming=False)
    assert re.search(r"\(train_tgt_sha256: '[0-9a-f]+' -> '[0-9a-f]+'\)", said[0])


def test_a_damaged_record_trains_a_new_vocabulary(tmp_path, tiny_overrides):
    """spm.json damaged (not JSON, or JSON but no object) with no checkpoint trained on its vocabulary: trained
    anew, and the log says why; before, the user was told to delete both files by hand."""
    src, tgt = paths(tiny_overrides)
    cfg, path = load_config("tiny", tiny_overrides), tmp_path / "spm.model"
    open_vocabulary(cfg, src, tgt, path, lambda m: None, resuming=False)
    for damaged in ("{not json", "[1, 2]"):
        path.with_suffix(".json").write_text(damaged)
        said: list[str] = []
        open_vocabulary(cfg, src, tgt, path, said.append, resuming=False)
        assert said[0].startswith(f"{path.with_suffix('.json')}: unreadable (")
        assert json.loads(path.with_suffix(".json").read_text())["vocab_size"] == cfg.data.vocab_size


def test_the_seed_draws_the_training_sample(tmp_path, tiny_overrides):
    """With fewer sentences sampled than the files hold, train.seed picks them: two seeds, two vocabularies;
    the same seed, the same one."""
    src, tgt = paths(tiny_overrides)

    def sha(seed: int, folder: str) -> str:
        cfg = load_config("tiny", tiny_overrides + [f"train.seed={seed}", "data.spm_input_sentences=200"])
        return open_vocabulary(cfg, src, tgt, tmp_path / f"{folder}.model", lambda m: None, False).sha256
    assert sha(2, "a") == sha(2, "b") != sha(3, "c")


def test_a_vocabulary_without_its_record_is_used_as_it_is(tmp_path, tiny_overrides):
    """A folder's spm.model without spm.json (written by hand, or by an older version) is used, and the log
    says so; it is not an unreadable record."""
    src, tgt = paths(tiny_overrides)
    cfg, path = load_config("tiny", tiny_overrides), tmp_path / "spm.model"
    first = open_vocabulary(cfg, src, tgt, path, lambda m: None, resuming=False)
    path.with_suffix(".json").unlink()
    said = []
    assert open_vocabulary(cfg, src, tgt, path, said.append, resuming=False).sha256 == first.sha256
    assert said == [f"{path}: no record of what it was trained from (spm.json); using it as it is"]


def test_a_parsing_run_on_targets_that_are_no_trees_is_refused(tmp_path, tiny_overrides):
    """data.task = "parse" on sentences (a translation corpus named by mistake) trained without a word, and only
    `parse` refused the run once it was trained. Its vocabulary, the first to read the targets, refuses them."""
    from transformer.data import DataError

    src, tgt = paths(tiny_overrides)
    cfg = load_config("tiny", tiny_overrides + ['data.task="parse"'])
    with pytest.raises(DataError, match=rf"{tgt.name}: data.task is \"parse\", and 600 of its 600 lines are no "
                                        "linearized tree"):
        open_vocabulary(cfg, src, tgt, tmp_path / "spm.model", lambda m: None, resuming=False)
    assert not list(tmp_path.glob("spm.*"))
    tgt.write_text("".join(f"(S (NP XX ) {line} )S\n" for line in tgt.read_text(encoding="utf-8").splitlines()[:300])
                   + "".join(f"{line}\n" for line in tgt.read_text(encoding="utf-8").splitlines()[300:]))
    open_vocabulary(cfg, src, tgt, tmp_path / "spm.model", lambda m: None, resuming=False)  # half of them: taken


def test_a_parsing_run_on_bracketed_trees_is_refused(tmp_path, tiny_overrides):
    """The .gold file `linearize` writes for `evaluate --ref` named as data.train_tgt trained without a word, and
    the parser wrote "(S (XX The) (XX dog))": its trees close after words, "dog)", not with ")NP"."""
    from transformer.data import DataError

    src, tgt = paths(tiny_overrides)
    cfg = load_config("tiny", tiny_overrides + ['data.task="parse"'])
    lines = tgt.read_text(encoding="utf-8").splitlines()
    tgt.write_text("".join(f"(S (NP (NN {w[0]})) (VP (VBD {w[-1]})))\n" for w in map(str.split, lines)))
    with pytest.raises(DataError, match=rf"{tgt.name}: 600 of its 600 lines are trees bracketed as the treebank "
                                        r"writes them .*\(the \.wlin file"):
        open_vocabulary(cfg, src, tgt, tmp_path / "spm.model", lambda m: None, resuming=False)
    tgt.write_text("".join(f"(S (NP (NN {w[0]} ) ) (VP (VBD {w[-1]} ) ) )\n" for w in map(str.split, lines)))
    with pytest.raises(DataError, match=rf"{tgt.name}: 600 of its 600 lines are trees bracketed"):  # spaced closings
        open_vocabulary(cfg, src, tgt, tmp_path / "spm.model", lambda m: None, resuming=False)
    assert not list(tmp_path.glob("spm.*"))


def test_a_parsing_vocabulary_that_lacks_some_symbols_is_warned_of(tiny_parse_run):
    """A symbol of the training trees that is no piece of the vocabulary (one reused from other trees): the
    beam cannot write that constituent, and the log says which."""
    from transformer.tokenizer import Tokenizer
    from transformer.vocabulary import check_tree_symbols

    said: list[str] = []
    tokenizer = Tokenizer(tiny_parse_run / "spm.model")
    check_tree_symbols(tokenizer, Path("t.wlin"), ["(S (NP dog )NP )S"], said.append)  # with words (.wlin), no XX
    assert said == []
    check_tree_symbols(tokenizer, Path("t.wlin"), ["(S (FOOBAR dog )FOOBAR )S"], said.append)
    assert said == [f"warning: the vocabulary {tokenizer.path} lacks 2 of the training trees' 4 symbols as a piece "
                    "((FOOBAR, )FOOBAR): the parser cannot write those constituents"]


def test_gold_trees_are_refused_with_a_vocabulary_not_trained_on_them(tiny_parse_run):
    """A fine-tune (--init-from) or a reused vocabulary trains no vocabulary, whose reading refused the .gold
    file: its trees were only warned of as lacking symbols ("(DT", "(NN"), and the parser wrote "(XX The)"."""
    from transformer.data import DataError
    from transformer.vocabulary import check_tree_symbols

    tokenizer = Tokenizer(tiny_parse_run / "spm.model")
    with pytest.raises(DataError, match=r"^t\.gold: 1 of its 1 lines are trees bracketed as the treebank writes"):
        check_tree_symbols(tokenizer, Path("t.gold"), ["(S (NP (DT the) (NN dog)) (VP (VBZ runs)))"], print)
    with pytest.raises(DataError, match=r"^t\.en: data.task is \"parse\", and 1 of its 1 lines are no linearized"):
        check_tree_symbols(tokenizer, Path("t.en"), ["A dog runs."], print)
    # a token store's run: the validation trees are what it checks, and named as such
    with pytest.raises(DataError, match=r"^v\.gold: 1 of its 1 lines .* a parsing run's validation trees are linear"):
        check_tree_symbols(tokenizer, Path("v.gold"), ["(S (NP (DT the) (NN dog)))"], print, "validation")


def test_a_rank_but_the_first_reads_rank_0s_vocabulary_and_never_writes_one(tmp_path):
    """A data-parallel rank other than 0 trained and wrote its own vocabulary where it found none (its --out
    another folder) or one of other inputs (its node's own copy of the data), over rank 0's: it now reads rank 0's,
    refuses in one line where it cannot, and writes nothing."""
    from transformer.data import DataError
    from transformer.vocabulary import vocabulary_inputs

    cfg = load_config("tiny")
    src, tgt = tmp_path / "train.en", tmp_path / "train.de"
    src.write_text("a dog runs .\n")
    tgt.write_text("ein Hund rennt .\n")
    spm = tmp_path / "run" / "spm.model"
    spm.parent.mkdir()
    for resuming in (False, True):  # resuming: a fine-tune's rank too (its vocabulary is its parent's)
        with pytest.raises(DataError, match=r"spm.model: not there, where rank 0 wrote the run's vocabulary"):
            open_vocabulary(cfg, src, tgt, spm, print, resuming=resuming, write=False)
    assert list(spm.parent.iterdir()) == []
    reference = Path(__file__).parent / "data" / "decode_reference" / "spm.model"
    spm.write_bytes(reference.read_bytes())
    spm.with_suffix(".json").write_text(json.dumps(vocabulary_inputs(cfg, src, tgt)))
    assert open_vocabulary(cfg, src, tgt, spm, print, resuming=False, write=False).sha256 == Tokenizer(reference).sha256
    src.write_text("another copy of the data .\n")
    with pytest.raises(DataError, match=r"rank 0 trained it from other inputs than this rank's \(train_src_sha256\)"):
        open_vocabulary(cfg, src, tgt, spm, print, resuming=False, write=False)
    assert spm.read_bytes() == reference.read_bytes()
