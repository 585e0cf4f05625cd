"""Commands under bad paths (issue 44): an output path that cannot be written is refused in one line
before any work, so a finished translation is never lost to it; a missing input is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from transformer.cli import main
from transformer.data import read_lines

RUN = Path(__file__).parent / "data" / "decode_reference"


def refused(capsys, argv: list[str], message: str) -> None:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err


def test_outputs_are_checked_before_the_work(tmp_path, capsys, multi30k):
    src = tmp_path / "in.txt"
    src.write_text("A dog runs.\n")
    gone = tmp_path / "missing" / "out.txt"
    refused(capsys, ["translate", str(RUN), "--input", str(src), "--output", str(gone)],
            f"--output {gone}: the folder {gone.parent} does not exist")
    refused(capsys, ["translate", str(RUN), "--input", str(src), "--output", str(tmp_path)],
            f"--output {tmp_path}: is a folder")
    for option in ("--hyp-out", "--json"):
        refused(capsys, ["evaluate", str(RUN), "--src", str(src), "--ref", str(src), option, str(gone)],
                f"{option} {gone}: the folder")
    refused(capsys, ["average", str(RUN), "--last", "1", "--out", str(tmp_path / "avg.pt")], "give a .safetensors file")
    refused(capsys, ["train", "tiny", "--out", str(src / "run")], f"{src} is a file; give a folder")
    refused(capsys, ["translate", str(RUN), "--input", str(src), "--output", str(src / "out.txt")],
            f"--output {src / 'out.txt'}: {src} is a file, not a folder")  # it said "the folder does not exist"
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    for option, args in (("--output", ["translate", str(RUN), "--input", str(src)]),
                         ("--out", ["average", str(RUN), "--last", "1"])):  # an internal error: RuntimeError
        refused(capsys, [*args, option, str(tmp_path / "loop1")], f"{option} {tmp_path / 'loop1'}: a loop of symbolic "
                "links, which leads to no file")


@pytest.mark.parametrize("argv", [["train", "tiny"], ["average", str(RUN), "--last", "1"], ["export", str(RUN)],
                                  ["attention", str(RUN), "--src", "A dog."], ["plot", str(RUN)],
                                  ["linearize", "trees.mrg"], ["preprocess", "tiny"], ["prepare", "wmt14-en-de"]])
def test_a_dash_for_an_output_of_files_is_refused(argv, tmp_path, capsys, monkeypatch):
    """"-" is stdout to the options that take it; to one naming a file or folder it went unchecked (the output
    checks pass stdout) into one called "-", or drew a message naming the option without its dashes."""
    monkeypatch.chdir(tmp_path)
    option = "--dest" if argv[0] == "prepare" else "--out"
    with pytest.raises(SystemExit) as stop:
        main([*argv, option, "-"])
    assert stop.value.code == 2
    assert f"argument {option}: - (stdout): this output is a file or folder; give its path" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("argv, option", [(["linearize", "trees.mrg"], "--out"), (["translate", str(RUN)], "--output"),
                                          (["evaluate", str(RUN)], "--json"), (["plot", str(RUN)], "--out")])
def test_a_file_output_named_as_a_folder_is_refused(argv, option, tmp_path, capsys, monkeypatch):
    """A file's name ending in / is a folder's: Path dropped the slash, and `linearize --out odir/` wrote odir.words,
    odir.lin, ... beside the folder it named (`--output out/`, a file called out)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main([*argv, option, "odir/"])
    assert stop.value.code == 2
    assert f"argument {option}: odir/: a folder's name (it ends in /); give a file name" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
    assert main(["train", "tiny", "--out", "run/", "--set", "train.max_steps=0"]) == 1  # a folder's option takes it
    assert "train.max_steps must be positive" in capsys.readouterr().err


@pytest.mark.parametrize("argv, option", [(["translate", "", "--input", "x"], "run_dir"),
                                          (["translate", str(RUN), "--checkpoint", ""], "--checkpoint"),
                                          (["translate", str(RUN), "--ensemble", ""], "--ensemble"),
                                          (["export", str(RUN), "--out", "e", "--checkpoint", ""], "--checkpoint"),
                                          (["train", "tiny", "--out", "r", "--init-from", ""], "--init-from")])
def test_an_empty_input_path_is_refused(argv, option, tmp_path, capsys, monkeypatch):
    """Path("") is the current folder: `--checkpoint "$CKPT"` with CKPT unset said "--checkpoint .: not a checkpoint
    file", naming a path the user never gave."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and f"argument {option}: empty: give a path" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_a_missing_sentencepiece_model_is_named(tmp_path, capsys, multi30k):
    refused(capsys, ["preprocess", "tiny", "--out", str(tmp_path / "store"), "--spm", str(tmp_path / "no.model"),
                     "--set", f'data.train_src="{multi30k / "val.en.gz"}"', "--set",
                     f'data.train_tgt="{multi30k / "val.de.gz"}"'], f"--spm {tmp_path / 'no.model'}: no such file")


def test_preprocess_refuses_a_taken_folder_before_training_a_vocabulary(tmp_path, capsys, multi30k):
    """An --out holding other files was refused only after the joint BPE vocabulary was trained: minutes on a
    large corpus, lost."""
    taken = tmp_path / "store"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine\n")
    refused(capsys, ["preprocess", "tiny", "--out", str(taken), "--set", f'data.train_src="{multi30k / "val.en.gz"}"',
                     "--set", f'data.train_tgt="{multi30k / "val.de.gz"}"'], f"{taken}: exists, and it has no meta.json")
    assert [p.name for p in tmp_path.iterdir()] == ["store"]  # no vocabulary trained beside it


def test_preprocess_refuses_files_of_unequal_length_before_training_a_vocabulary(tmp_path, capsys, multi30k):
    """Line counts that differ were found after the vocabulary was trained and the pairs encoded (hours on WMT);
    `train` checks them first, and so does preprocess now."""
    short = tmp_path / "short.de"
    short.write_text("".join(line + "\n" for line in read_lines(multi30k / "val.de.gz")[:-1]))
    refused(capsys, ["preprocess", "tiny", "--out", str(tmp_path / "store"), "--set",
                     f'data.train_src="{multi30k / "val.en.gz"}"', "--set", f'data.train_tgt="{short}"'],
            "has 1014 lines")  # one line: no "training a joint BPE vocabulary" before it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["short.de"]


def test_preprocess_takes_a_run_folder_for_its_vocabulary(tmp_path, capsys, multi30k, tiny_run):
    """`--spm RUN` said "no such file": the run's spm.model is what is meant. With a vocabulary of another size than
    the config's data.vocab_size, the command it advised was refused by training."""
    sets = ["--set", f'data.train_src="{multi30k / "val.en.gz"}"', "--set", f'data.train_tgt="{multi30k / "val.de.gz"}"']
    from transformer.tokenizer import Tokenizer

    size = Tokenizer(tiny_run / "spm.model").vocab_size
    assert main(["preprocess", "tiny", "--out", str(tmp_path / "store"), "--spm", str(tiny_run), *sets,
                 "--set", f"data.vocab_size={size}"]) == 0
    assert (tmp_path / "store" / "spm.model").read_bytes() == (tiny_run / "spm.model").read_bytes()
    assert capsys.readouterr().out.endswith(f"train with --set data.train_store={tmp_path / 'store'}\n")
    # a config of another size: the advice alone was refused by training ("set data.vocab_size = ...")
    assert main(["preprocess", "tiny", "--out", str(tmp_path / "other"), "--spm", str(tiny_run), *sets,
                 "--set", f"data.vocab_size={size + 1}"]) == 0
    assert capsys.readouterr().out.endswith(f"train with --set data.train_store={tmp_path / 'other'} --set "
                                            f"data.vocab_size={size} (--spm's size; the config says {size + 1})\n")


def test_preprocess_overwrites_a_store_with_its_own_vocabulary(tmp_path, capsys, multi30k, tiny_run):
    """`--overwrite --spm STORE` (re-encoding with the store's own vocabulary) ended in a traceback once the old
    store, its spm.model with it, was replaced, and left a store without a vocabulary."""
    store = tmp_path / "store"
    val = ["--set", f'data.train_src="{multi30k / "val.en.gz"}"', "--set", f'data.train_tgt="{multi30k / "val.de.gz"}"']
    assert main(["preprocess", "tiny", "--out", str(store), "--spm", str(tiny_run), *val]) == 0
    test = ["--set", f'data.train_src="{multi30k / "test_2016_flickr.en.gz"}"',
            "--set", f'data.train_tgt="{multi30k / "test_2016_flickr.de.gz"}"']
    for spm in (store, store / "spm.model"):
        assert main(["preprocess", "tiny", "--out", str(store), "--overwrite", "--spm", str(spm), *test]) == 0
        assert (store / "spm.model").read_bytes() == (tiny_run / "spm.model").read_bytes()
        assert "test_2016_flickr.en" in (store / "meta.json").read_text()
    assert "Traceback" not in capsys.readouterr().err

def test_a_translation_written_to_a_file_is_whole(tmp_path, capsys):
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("A dog runs.\nTwo men.\n")
    assert main(["translate", str(RUN), "--input", str(src), "--output", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 2 and not list(tmp_path.glob(".out.txt.*"))


def test_an_output_that_is_an_input_is_refused(tmp_path, capsys):
    """--output in.txt --input in.txt replaced the input with its translation: the source was gone."""
    src = tmp_path / "in.txt"
    src.write_text("A dog runs.\n")
    refused(capsys, ["translate", str(RUN), "--input", str(src), "--output", str(src)],
            f"--output {src}: is --input {src}, which the command reads")
    (tmp_path / "same.txt").symlink_to(src)
    refused(capsys, ["score", str(RUN), "--src", str(src), "--tgt", str(src), "--output", str(tmp_path / "same.txt")],
            "which the command reads")
    refused(capsys, ["evaluate", str(RUN), "--src", str(src), "--ref", str(src), "--hyp-out", str(src)],
            f"--hyp-out {src}: is --src {src}")
    assert src.read_text() == "A dog runs.\n"


def test_an_output_onto_the_record_of_the_weights_given_is_refused(tmp_path, capsys):
    """`--checkpoint avg.safetensors --output avg.json` (average's record beside its weights, a natural name) wrote
    over the record, and the weights could no longer be loaded."""
    weights = tmp_path / "avg.safetensors"
    assert main(["average", str(RUN), "--last", "1", "--out", str(weights)]) == 0
    src, record = tmp_path / "in.txt", tmp_path / "avg.json"
    src.write_text("A dog runs.\n")
    kept = record.read_bytes()
    said = f"{record}: is the record of --checkpoint {weights}, which the command reads"
    refused(capsys, ["translate", str(RUN), "--checkpoint", str(weights), "--input", str(src), "--output", str(record)],
            f"--output {said}")
    refused(capsys, ["evaluate", str(RUN), "--checkpoint", str(weights), "--src", str(src), "--ref", str(src),
                     "--json", str(record)], f"--json {said}")
    assert record.read_bytes() == kept


def test_evaluates_report_leaves_stdout_to_a_json_written_to_dev_stdout(tmp_path, capfd):
    """--json /dev/stdout: the report's BLEU and chrF lines came first on stdout, and the JSON could not be read."""
    import json

    src = tmp_path / "in.txt"
    src.write_text("A dog runs.\n")
    assert main(["evaluate", str(RUN), "--src", str(src), "--ref", str(src), "--json", "/dev/stdout"]) == 0
    out, err = capfd.readouterr()
    assert json.loads(out)["bleu"] >= 0 and "BLEU = " in err


def test_two_outputs_in_one_file_or_an_output_onto_the_runs_records_are_refused(tmp_path, capsys):
    """evaluate --json o --hyp-out o kept the JSON alone; --json RUN/summary.json replaced the run's training
    summary (the model card of an export reads it), and an output could replace a checkpoint's record."""
    import shutil

    src = tmp_path / "in.txt"
    src.write_text("A dog runs.\n")
    refused(capsys, ["evaluate", str(RUN), "--src", str(src), "--ref", str(src), "--json", str(tmp_path / "o"),
                     "--hyp-out", str(tmp_path / "o")], f"--hyp-out {tmp_path / 'o'}: is also --json's")
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    (run / "summary.json").write_text('{"step": 30}\n')
    record = next((run / "checkpoints").glob("*.json"))
    for option, path in (("--json", run / "summary.json"), ("--hyp-out", run / "config.toml"), ("--json", record)):
        kept = path.read_bytes()
        refused(capsys, ["evaluate", str(run), "--src", str(src), "--ref", str(src), option, str(path)],
                f"{option} {path}: is the run's own {path.name}, which training wrote")
        assert path.read_bytes() == kept
    assert main(["evaluate", str(run), "--src", str(src), "--ref", str(src), "--json", str(run / "scores.json")]) == 0
    weights = next((run / "checkpoints").glob("*[0-9].safetensors"))  # train.keep_best's model: replaced without a
    shutil.copy(weights, run / "best.safetensors")  # word by `average --out RUN/best.safetensors`
    shutil.copy(weights.with_suffix(".json"), run / "best.json")
    kept = (run / "best.safetensors").read_bytes()
    capsys.readouterr()
    refused(capsys, ["average", str(run), "--last", "1", "--out", str(run / "best.safetensors")],
            f"--out {run / 'best.safetensors'}: is the run's own best.safetensors, which training wrote")
    assert (run / "best.safetensors").read_bytes() == kept


def test_an_output_onto_another_runs_records_or_checkpoints_is_refused(tmp_path, capsys):
    """Only the run a command read was guarded: `average RUN1 --out RUN2/checkpoints/step_N.safetensors` replaced
    RUN2's newest checkpoint and its record (RUN2 then trained and translated as another model, or not at all), and
    `translate RUN1 --output RUN2/spm.model` RUN2's vocabulary. A new file in a checkpoints folder may be taken for
    a checkpoint. A file of another name beside a run's records is written."""
    import shutil

    other = tmp_path / "other"
    shutil.copytree(RUN, other)
    newest = sorted((other / "checkpoints").glob("*[0-9].safetensors"))[-1]
    kept = {p: p.read_bytes() for p in (newest, newest.with_suffix(".json"), other / "spm.model")}
    src = tmp_path / "in.txt"
    src.write_text("A dog runs.\n")
    refused(capsys, ["average", str(RUN), "--last", "1", "--out", str(newest)],
            f"--out {newest}: is run {other}'s own {newest.name}, which training wrote")
    refused(capsys, ["average", str(RUN), "--last", "1", "--out", str(other / "checkpoints" / "new.safetensors")],
            f"is in run {other}'s checkpoints folder")
    refused(capsys, ["translate", str(RUN), "--input", str(src), "--output", str(other / "spm.model")],
            f"--output {other / 'spm.model'}: is run {other}'s own spm.model")
    (other / "tb").mkdir(exist_ok=True)  # training's TensorBoard log: `score --output RUN/tb/events...` replaced it
    (events := other / "tb" / "events.out.tfevents.1.host").write_bytes(b"events")
    kept[events] = b"events"
    refused(capsys, ["translate", str(RUN), "--input", str(src), "--output", str(events)],
            f"--output {events}: is run {other}'s own {events.name}, which training wrote")
    refused(capsys, ["translate", str(RUN), "--input", str(src), "--output", str(other / "tb" / "new.txt")],
            f"is in run {other}'s tb folder, which training keeps (its TensorBoard log): give another folder")
    assert all(p.read_bytes() == data for p, data in kept.items())
    assert main(["translate", str(RUN), "--input", str(src), "--output", str(other / "out.txt")]) == 0


def test_a_checkpoint_that_is_not_there_or_not_ours_is_named_so(tmp_path, capsys):
    """A missing --checkpoint was told as its JSON record missing, "an unfinished write"."""
    gone = tmp_path / "x.safetensors"
    refused(capsys, ["translate", str(RUN), "--checkpoint", str(gone)], f"error: --checkpoint {gone}: no such file\n")
    exported = tmp_path / "model.safetensors"  # a Hugging Face export's weights, alone
    exported.write_bytes(b"")
    refused(capsys, ["translate", str(RUN), "--checkpoint", str(exported)],
            f"{tmp_path / 'model.json'}: missing (model.safetensors without its JSON record is an unfinished write, "
            "or weights from elsewhere (an export?): not a checkpoint; the record travels with its weights file")


def test_a_weights_file_without_its_record_names_the_record_where_it_was_looked_for(tmp_path, capsys, monkeypatch):
    """`--init-from some/dir/avg5.safetensors` said "avg5.json: missing", not where it was looked for."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "some" / "dir").mkdir(parents=True)
    (tmp_path / "some" / "dir" / "avg5.safetensors").write_bytes(b"")
    refused(capsys, ["train", "tiny", "--out", "zz", "--init-from", "some/dir/avg5.safetensors"],
            "error: some/dir/avg5.json: missing (avg5.safetensors without its JSON record")


@pytest.mark.parametrize("argv", [["translate"], ["average", "--last", "1", "--out", "{tmp}/a.safetensors"], ["plot"],
                                  ["export", "--format", "ctranslate2", "--out", "{tmp}/ct2"]])
def test_a_run_folder_that_is_not_there_is_named_so(argv, tmp_path, capsys):
    """It was told as a run without checkpoints, spm.model or metrics.jsonl."""
    command, *options = [a.format(tmp=tmp_path) for a in argv]
    gone, a_file = tmp_path / "runs" / "mine", tmp_path / "in.txt"
    a_file.write_text("A dog runs.\n")
    refused(capsys, [command, str(gone), *options], f"error: {gone}: no such folder\n")
    refused(capsys, [command, str(a_file), *options], f"error: {a_file}: a file, not a run folder\n")
    store = tmp_path / "store"  # `transformer preprocess`'s folder: its spm.model made it "a run without checkpoints"
    store.mkdir()
    for name in ("meta.json", "src.ids", "spm.model"):
        (store / name).write_bytes(b"")
    refused(capsys, [command, str(store), *options],
            f"error: {store}: a token store (transformer preprocess), not a run folder: give the folder of a run "
            "trained on it (train --out)\n")


def test_an_output_named_gz_is_compressed(tmp_path, capsys):
    """As the inputs may be (--output out.txt.gz was written as plain text)."""
    import gzip

    src = tmp_path / "in.txt"
    src.write_text("A dog runs.\nTwo men.\n")
    assert main(["translate", str(RUN), "--input", str(src), "--output", str(tmp_path / "out.txt")]) == 0
    assert main(["translate", str(RUN), "--input", str(src), "--output", str(tmp_path / "out.txt.gz")]) == 0
    assert gzip.decompress((tmp_path / "out.txt.gz").read_bytes()) == (tmp_path / "out.txt").read_bytes()
    assert main(["score", str(RUN), "--src", str(src), "--tgt", str(src), "--output", str(tmp_path / "s.gz")]) == 0
    assert len(gzip.decompress((tmp_path / "s.gz").read_bytes()).decode().splitlines()) == 2


def test_plots_default_output_is_checked_as_a_given_one(tmp_path, capsys, monkeypatch):
    """`plot RUN` on a read-only run folder exited 70 ("internal error: OSError: [Errno 30] Read-only file
    system: '.../.training.png...tmp'"), where `--out RUN/training.png` was refused in one line."""
    import os

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 5, "minutes": 0.5, "lr": 0.001, "train_loss": 6.5}\n')
    run.chmod(0o555)
    if os.geteuid() == 0:  # root writes into any folder: the check is told what another account would find
        access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: access(p, mode) and not (p == run and mode & os.W_OK))
    try:
        for argv in (["--out", str(run / "training.png")], []):
            refused(capsys, ["plot", str(run), *argv], f"error: --out {run / 'training.png'}: the folder {run} is not "
                    "writable\n")
    finally:
        run.chmod(0o755)


def test_a_gz_output_names_the_final_file_in_its_header(tmp_path):
    """The header named the temporary file (`file o.gz`: was ".o.gz.XXXX.tmp"; gunzip -N made a hidden file)."""
    src = tmp_path / "in.txt"
    src.write_text("A dog runs.\n")
    assert main(["translate", str(RUN), "--input", str(src), "--output", str(tmp_path / "o.txt.gz")]) == 0
    header = (tmp_path / "o.txt.gz").read_bytes()
    assert header[3] & 0x08 and header[10:].split(b"\0", 1)[0] == b"o.txt"  # FNAME: as gzip(1) names it


def test_the_language_moses_tokenizes_as_is_a_language(tmp_path):
    """evaluate --paper-bleu with --ref ref.txt tokenized as language "txt"."""
    from argparse import Namespace
    from types import SimpleNamespace

    from transformer.cli import _target_language
    from transformer.config import ConfigError

    run = SimpleNamespace(train_tgt="data/train.fr.gz")
    assert _target_language(Namespace(lang="de", ref=Path("ref.txt")), run, "--ref ref.txt") == "de"
    assert _target_language(Namespace(lang=None, ref=Path("test_2016_flickr.de.gz")), run, "--ref x") == "de"
    assert _target_language(Namespace(lang=None, ref=Path("ref.txt")), run, "--ref ref.txt") == "fr"
    with pytest.raises(ConfigError, match=r"--lang not given, and neither data.test_tgt ref.txt nor .* train.tgt ends "
                       r"in a language code \(.de, .fr, ...\): give --lang \(the run's data.tgt_lang, 'de', is not "
                       "taken"):  # the file as what named it: the run's config, not --ref; and why not data.tgt_lang
        _target_language(Namespace(lang=None, ref=Path("ref.txt")), SimpleNamespace(train_tgt="train.tgt",
                                                                                    tgt_lang="de"),
                         "data.test_tgt ref.txt")


def test_attention_of_an_empty_sentence_says_only_that(tmp_path, capsys):
    """It printed "translation: " (the empty line's) before its error."""
    for blank in (" ", "\u200b \u200e"):  # zero-width characters alone: no piece, and a figure of EOS was drawn
        refused(capsys, ["attention", str(RUN), "--src", blank, "--out", str(tmp_path / "a.png")],
                "error: the source sentence is empty\n")
    refused(capsys, ["attention", str(RUN), "--src", "A dog.", "--tgt", "\u200b", "--out", str(tmp_path / "a.png")],
            "error: --tgt is empty")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("error", [
    RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
                 "tried to allocate 4000016000016 bytes. Error code 12 (Cannot allocate memory)"),
    MemoryError()])
def test_an_input_too_large_for_memory_is_one_line(error, tmp_path, capsys, monkeypatch):
    """A 1 MB input line (500,000 pieces) makes attention ask torch for 4 TB at once: its CPU allocator's
    RuntimeError was an internal error, "please report it". The input's size is the user's to change: one
    line, exit 1, and no output file. (Raised in place of the real allocation, which a machine that
    overcommits memory might grant and then be killed for.)"""
    def too_large(*args, **kwargs):
        raise error

    monkeypatch.setattr("transformer.translator.decode_ids", too_large)
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("A dog runs.\n" + "a " * 500_000 + "\nTwo men.\n")
    assert main(["translate", str(RUN), "--input", str(src), "--output", str(out), "--threads", "1"]) == 1
    said = capsys.readouterr().err.splitlines()  # what was loaded, then the error
    assert said[-1].startswith("error: out of memory") and "--batch-size" in said[-1], said
    assert "decoding input lines 1-3, whose longest is line 2 (" in said[-1], said  # the line to shorten
    assert len(said) == 2 and not out.exists(), said
    if isinstance(error, RuntimeError):
        assert said[-1].startswith("error: out of memory (4,000,016,000,016 bytes at once): "), said
    # score named no line: "a very long input line"
    monkeypatch.setattr("transformer.translator.score_ids", too_large)
    assert main(["score", str(RUN), "--src", str(src), "--tgt", str(src), "--threads", "1"]) == 1
    said = capsys.readouterr().err.splitlines()
    assert "scoring input lines 1-3, whose longest is line 2 (2,000,000 characters): shorten or split that line" \
        in said[-1] and said[-1].startswith("error: out of memory"), said


@pytest.mark.parametrize("field, value", [("n_heads", 2), ("ln_eps", 0.9)])
def test_a_checkpoint_record_whose_model_config_was_edited_is_refused(tmp_path, capsys, field, value):
    """A record's model config edited by hand (n_heads, ln_eps) loaded its weights into another model without a
    word: other scores and translations, exit 0. Its model_hash, taken when training wrote it, tells."""
    import json
    import shutil

    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    (record,) = (run / "checkpoints").glob("*.json")
    meta = json.loads(record.read_text())
    meta["config"]["model"][field] = value
    record.write_text(json.dumps(meta))
    src = tmp_path / "in.txt"
    src.write_text("A dog runs.\n")
    for chosen in ([], ["--checkpoint", str(record)]):
        refused(capsys, ["translate", str(run), *chosen, "--input", str(src), "--threads", "1"],
                f"{record}: its model config (hash ")
    del meta["config"]["model"][field]  # a record written before a field was added: not compared
    record.write_text(json.dumps(meta))
    assert main(["translate", str(run), "--input", str(src), "--threads", "1"]) == 0


def test_a_checkpoint_record_without_its_config_is_named(tmp_path, capsys):
    """A record edited by hand without its "config" was an internal error (KeyError: 'config') in every
    command that loads a run's model: translate, score, evaluate, export, serve."""
    import json
    import shutil

    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    (record,) = (run / "checkpoints").glob("*.json")
    record.write_text(json.dumps({k: v for k, v in json.loads(record.read_text()).items() if k != "config"}))
    src = tmp_path / "in.txt"
    src.write_text("A dog runs.\n")
    refused(capsys, ["translate", str(run), "--input", str(src), "--threads", "1"],
            f"{record}: the record holds no config")
    refused(capsys, ["translate", str(run), "--checkpoint", str(record), "--input", str(src), "--threads", "1"],
            f"{record}: the record holds no config")


def test_a_folder_or_file_given_for_the_other_is_named_so(tmp_path, capsys, multi30k):
    """`preprocess --spm FOLDER` without spm.model said "no such file" of a folder that is there; a text file as
    data.train_store was "a token store without spm.model"."""
    data = ["--set", f'data.train_src="{multi30k / "val.en.gz"}"', "--set", f'data.train_tgt="{multi30k / "val.de.gz"}"']
    (tmp_path / "empty").mkdir()
    refused(capsys, ["preprocess", "tiny", "--out", str(tmp_path / "store"), "--spm", str(tmp_path / "empty"), *data],
            f"error: --spm {tmp_path / 'empty'}: a folder without spm.model (a sentencepiece model, e.g. RUN/spm.model)")
    text = tmp_path / "in.en"
    text.write_text("A dog runs.\n")
    refused(capsys, ["train", "tiny", "--out", str(tmp_path / "run"), "--set", f'data.train_store="{text}"', *data,
                     "--set", f'data.valid_src="{multi30k / "val.en.gz"}"', "--set",
                     f'data.valid_tgt="{multi30k / "val.de.gz"}"'],
            f"error: data.train_store {text}: a file, not a token store's folder")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["export", "preprocess"])
def test_a_folder_replaced_from_beside_it_needs_its_parent_writable(tmp_path, capsys, monkeypatch, multi30k, tiny_run,
                                                                    command):
    """export and preprocess write the folder beside itself and rename it into place: an --out that exists (empty,
    or an earlier one with --overwrite) in a folder that takes no file ended in a traceback (PermissionError on the
    staging folder), where a new --out there was refused in one line."""
    import os

    parent = tmp_path / "ro"
    out = parent / "empty"
    out.mkdir(parents=True)
    parent.chmod(0o555)
    if os.geteuid() == 0:  # root writes into any folder: the check is told what another account would find
        access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: access(p, mode) and not (p == parent and mode & os.W_OK))
    argv = (["export", str(tiny_run), "--out", str(out)] if command == "export" else
            ["preprocess", "tiny", "--out", str(out), "--spm", str(tiny_run), "--set",
             f'data.train_src="{multi30k / "val.en.gz"}"', "--set", f'data.train_tgt="{multi30k / "val.de.gz"}"'])
    try:
        refused(capsys, argv, f"error: --out {out}: the folder {parent} is not writable\n")
    finally:
        parent.chmod(0o755)
