"""The command line end to end: train → average → translate → evaluate on real Multi30k pairs."""

import errno
import itertools
import json
import os
import platform
import pty
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import transformer
from transformer.checkpoint import average_checkpoints, list_checkpoints, load_checkpoint
from transformer import cli
from transformer.cli import main
from transformer.config import ConfigError
from transformer.data import encode_for_decoding
from transformer.decode import decode_ids


def run_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "transformer", *args], input=stdin, capture_output=True,
                          text=True, timeout=600)


def login_shell_signals() -> None:
    """A child's SIGHUP and SIGINT as a login shell's: a suite run under nohup ignores SIGHUP, and one run as a
    background job (`... &` in a script) ignores SIGINT, which Python then leaves ignored: the command ran on."""
    for signum in (signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, signal.SIG_DFL)


def run_here(capsys, *args: str) -> tuple[int, str, str]:
    """``main`` on ``args`` in this process: (exit status, stdout, stderr). For the refusals, which a fresh
    interpreter would only slow down (the end-to-end tests above and below run the command itself)."""
    capsys.readouterr()
    try:
        status = main(list(args))
    except SystemExit as e:  # argparse's usage errors
        status = e.code
    said = capsys.readouterr()
    return status, said.out, said.err


@pytest.mark.slow
def test_train_average_translate_evaluate(tmp_path, tiny_overrides, multi30k):
    from transformer.data import read_lines

    test = {"src": multi30k / "test_2016_flickr.en.gz", "tgt": multi30k / "test_2016_flickr.de.gz",
            "tok_ref": multi30k / "tok" / "test_2016_flickr.lc.norm.tok.de.gz"}
    head = {side: tmp_path / f"t.{side}.{'en' if side == 'src' else 'de'}" for side in test}  # its first 20 lines
    for side, path in test.items():
        head[side].write_text("\n".join(read_lines(path)[:20]) + "\n")
    run = tmp_path / "run"
    sets = [x for o in tiny_overrides + ["train.max_steps=40", "train.save_every=10", "train.log_every=10"]
            + [f'data.test_{side}="{path}"' for side, path in head.items()] for x in ("--set", o)]
    result = run_cli("train", "tiny", "--out", str(run), *sets)
    assert result.returncode == 0, result.stderr
    for name in ("config.toml", "spm.model", "train.log", "metrics.jsonl"):
        assert (run / name).exists(), name
    assert len(list_checkpoints(run)) == 4

    avg = tmp_path / "avg.safetensors"
    assert main(["average", str(run), "--last", "3", "--out", str(avg)]) == 0
    expected = average_checkpoints(list_checkpoints(run)[-3:])
    got = load_checkpoint(avg, with_state=False).weights
    for name in expected:
        assert torch.equal(got[name], expected[name])
    stacked = torch.stack([load_checkpoint(p).weights["embed.weight"] for p in list_checkpoints(run)[-3:]])
    torch.testing.assert_close(got["embed.weight"], stacked.mean(0))

    lines = ["A man is riding a bike.", "", "Two dogs play in the snow on a very long and sunny afternoon."]
    result = run_cli("translate", str(run), "--checkpoint", str(avg), "--beam", "2", stdin="\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr
    outputs = result.stdout.split("\n")
    assert len(outputs) == 4 and outputs[1] == "" and outputs[3] == ""  # one line per input line
    result = run_cli("translate", str(run), "--checkpoint", str(avg), "--beam", "2", "--early-stop", "top",
                     stdin="\n".join(lines) + "\n")
    assert result.returncode == 0 and len(result.stdout.split("\n")) == 4, result.stderr

    out_json = tmp_path / "scores.json"
    result = run_cli("evaluate", str(run), "--src", str(head["src"]), "--ref", str(head["tgt"]), "--tok-ref",
                     str(head["tok_ref"]), "--lang", "de", "--json", str(out_json), "--beam", "1", "--paper-bleu")
    assert result.returncode == 0, result.stderr
    assert "BLEU = " in result.stdout and "nrefs:1|case:mixed" in result.stdout and "chrF" in result.stdout
    assert "warning: Moses" not in result.stderr  # it has German rules (a mistyped code is warned of)
    scores = json.loads(out_json.read_text())
    assert {"bleu", "chrf", "signature", "tok_lc_bleu", "paper_bleu"} <= set(scores)
    # and what they are of (the JSON held the scores alone): the weights, the test set, the search
    assert scores["averaged"] and all(Path(p).is_file() and Path(p).parent == (run / "checkpoints").resolve()
                                      for p in scores["averaged"])
    assert (scores["src"], scores["ref"], scores["sentences"]) == (str(Path(head["src"]).resolve()),
                                                                   str(Path(head["tgt"]).resolve()), 20)
    assert scores["decode"]["beam_size"] == 1 and scores["decode"]["alpha"] == 0.6 and scores["int8"] is False
    # and how to score them again: the files' hashes, the tokenized BLEUs' methods, the batch (int8 follows its
    # shape), the averaged weights' hashes, the versions (two procedures of tok_lc_bleu read alike)
    from transformer.checkpoint import checkpoint_record
    from transformer.files import file_sha256

    assert scores["ref_sha256"] == file_sha256(Path(head["tgt"]))
    assert scores["tok_ref"] == str(Path(head["tok_ref"]).resolve())
    assert scores["tok_lc_bleu_method"].startswith("Moses lc+norm+tok, de") and scores["pretokenized"] is False
    assert scores["paper_bleu_method"].startswith("Moses tokenizer, ##AT## compound splitting, cased")
    assert scores["decode"]["batch_size"] > 0 and {"sacrebleu", "sacremoses", "torch"} <= set(scores["versions"])
    assert scores["averaged_sha256"] == [checkpoint_record(Path(p))["files"]["weights"]["sha256"]
                                         for p in scores["averaged"]]
    # without files: the run's own test set, its tokenized references too, named on stderr
    result = run_cli("evaluate", str(run), "--json", str(out_json), "--beam", "1")
    assert result.returncode == 0, result.stderr
    assert f"data.test_tok_ref {head['tok_ref']}" in result.stderr and f"data.test_src {head['src']}" in result.stderr
    assert {k: v for k, v in json.loads(out_json.read_text()).items() if not k.startswith("paper_bleu")} == \
        {k: v for k, v in scores.items() if not k.startswith("paper_bleu")}


def test_config_prints_every_setting_and_reads_back_as_the_same_config(capsys, tmp_path):
    """`transformer config` prints what a run would use (defaults, file, --set), as a run's config.toml: written to
    a file and given back, it is the same config, and `train` would take it."""
    from transformer.config import dump_toml, load_config

    status, out, _ = run_here(capsys, "config", "multi30k_en_de", "--set", "train.max_steps=4000")
    assert status == 0 and out.startswith("# the defaults, then ") and 'then --set "train.max_steps=4000"\n' in out
    assert out.split("\n", 1)[1] == dump_toml(load_config("multi30k_en_de", ["train.max_steps=4000"]))
    (tmp_path / "mine.toml").write_text(out)
    assert load_config(str(tmp_path / "mine.toml")) == load_config("multi30k_en_de", ["train.max_steps=4000"])
    status, _, err = run_here(capsys, "config", "tiny", "--set", "model.n_heads=5")  # validated as train does
    assert status == 1 and "model.n_heads" in err and "Traceback" not in err
    # printed as what a run would use, and train refused it at start: said with it
    status, out, err = run_here(capsys, "config", "tiny", "--set", "train.keep_last=1",
                                "--set", "decode.average_last=3")
    assert status == 0 and "keep_last = 1" in out
    assert err == ("note: train refuses these settings: decode.average_last 3 averages more checkpoints than "
                   "train.keep_last 1 keeps: raise train.keep_last to at least 3\n")
    # a value holding DEL, a file name holding a newline: the header comment was no TOML, the output unreadable
    shutil.copy(tmp_path / "mine.toml", named := tmp_path / "a\nb.toml")
    for argv in (["tiny", "--set", "data.src_lang=x\x7fy"], [str(named)]):
        status, out, _ = run_here(capsys, "config", *argv)
        (tmp_path / "again.toml").write_text(out)
        assert status == 0 and load_config(str(tmp_path / "again.toml")) == load_config(argv[0], argv[2:]), out[:200]


def test_params_cost_recomputes_table_2(capsys):
    assert main(["params", "wmt14_en_de_base", "--cost", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    # Table 2: base 3.3e18 FLOPs = 8 P100 x 12 h x 9.5 TFLOPS
    assert report["table2"]["paper_flops"] == pytest.approx(3.3e18, rel=0.01)
    assert report["tokens_per_step"] == 25_000 and report["steps"] == 100_000
    assert report["total_flops"] == pytest.approx(report["flops_per_token"] * 25_000 * 100_000)
    hours = [r["hours"] for r in report["per_devices"]]
    assert hours[0] == pytest.approx(8 * hours[1])  # time scales with the devices at a fixed MFU


def test_params_cost_says_when_a_device_count_it_refuses_is_its_own_default(capsys):
    assert main(["params", "base", "--cost", "--set", "train.max_tokens=4"]) == 1
    assert capsys.readouterr().err.startswith("error: --devices 8 (of the default 1,8,64): each count must be in 1 .. 4")
    assert main(["params", "base", "--cost", "--devices", "1,0"]) == 1
    assert capsys.readouterr().err.startswith("error: --devices 0: each count")
    assert main(["params", "base", "--mfu", "5"]) == 1  # accepted, and unused without --cost
    assert capsys.readouterr().err == "error: --mfu: for --cost's report; add --cost\n"
    with pytest.raises(SystemExit):  # it said "invalid <lambda> value: 'a,b'"
        main(["params", "base", "--cost", "--devices", "a,b"])
    assert capsys.readouterr().err.endswith("argument --devices: 'a,b': give whole numbers separated by commas, "
                                            "e.g. 1,8,64\n")


def test_params_cost_compares_table_2_for_its_two_models_and_says_the_papers_batch(capsys):
    """Table 2 has the base and the big model: C5 (d_model 1024, base's schedule) was compared with the big's
    3.5 days, and the base preset's default 4,096-token batch was compared without a word about §5.1's 25k."""
    assert main(["params", "C5", "--cost"]) == 0
    out = capsys.readouterr().out
    assert "Table 2 gives the training cost of the base and the big model only" in out and "(big)" not in out
    assert main(["params", "base", "--cost"]) == 0
    out = capsys.readouterr().out
    assert "Table 2 (base)" in out and "the paper trained 100,000 steps of ~25,000 tokens" in out
    assert main(["params", "wmt14_en_fr_big", "--cost"]) == 0  # big's shape, EN-FR's dropout
    out = capsys.readouterr().out
    assert "Table 2 (big)" in out and "the paper trained" not in out
    assert main(["params", "base", "--set", "model.d_k=64", "--set", "model.d_v=64", "--cost"]) == 0
    assert "Table 2 (base)" in capsys.readouterr().out  # d_k 64 written out is d_model / h: base's shape


def test_params_cost_shows_a_small_models_step_hours_and_memory(capsys):
    """tiny's table said 0.0 ms, 0.00 hours and 0.0 GiB on every row: its figures are below the columns' places."""
    assert main(["params", "tiny", "--cost", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["per_devices"]
    assert main(["params", "tiny", "--cost"]) == 0
    table = capsys.readouterr().out.splitlines()[-len(rows):]
    for row, line in zip(rows, table):
        step, hours, memory = (float(cell) for cell in line.split("|")[2:])
        assert step == pytest.approx(1000 * row["step_seconds"], rel=0.05) and step > 0
        assert hours == pytest.approx(row["hours"], rel=0.05) and hours > 0
        assert memory == pytest.approx(row["memory_gib_per_device"], rel=0.05) and memory > 0


def test_params_json(capsys):
    assert main(["params", "base", "--vocab", "40960", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["parameters"] == pytest.approx(65e6, rel=0.01) and out["flops_per_token"] > 6 * 44e6
    for vocab in ("3", "0"):  # counted (44,140,032 at 3) where data.vocab_size of 3 is refused
        assert main(["params", "base", "--vocab", vocab]) == 1
        assert capsys.readouterr().err == (f"error: --vocab {vocab}: must be in 4 .. 2,147,483,647 (padding, end of "
                                           "sentence and unknown take 3; piece ids are int32)\n")


def test_params_and_its_cost_report_quote_one_figure_at_one_length(capsys):
    """params said 381.2 MFLOP "(source and target 30 tokens)", --cost 0.381 GFLOP "(27-token sentences)"."""
    def said(*argv: str) -> str:
        assert main(["params", "base", *argv]) == 0
        return capsys.readouterr().out

    flops = json.loads(said("--json"))["flops_per_token"]
    assert json.loads(said("--cost", "--json"))["flops_per_token"] == flops
    assert f"{flops / 1e6:.1f} MFLOP per target token for training (27-token sentences)" in said()
    assert f"{flops / 1e9:.3g} GFLOP per target token (training, 27-token sentences)" in said("--cost")
    assert said("--cost").startswith("base: 63,082,496 parameters")  # as `params` says it: tiny models were 0.0M


@pytest.mark.parametrize("args, message", [
    (["train", "nonexistent.toml", "--out", "x"], "config file not found"),
    (["train", "tiny", "--out", "{tmp}/r", "--set", "model.d_modle=3"], "did you mean model.d_model"),
    (["translate", "{tmp}"], "not a run folder"),
    (["average", "{tmp}", "--last", "2", "--out", "{tmp}/a.safetensors"], "no checkpoints"),
    (["params", "bsae"], "did you mean 'base'"),
    (["train", "configs/multi30k_en_de.toml", "--out", "{tmp}/r", "--set", 'data.train_src="/nonexistent/x.en"'],
     "data.train_src: data file not found"),
    (["train", "tiny", "--out", "{tmp}/r"], "data.train_src is not set"),
])
def test_user_errors_exit_1_with_one_line(tmp_path, capsys, args, message):
    status, _, err = run_here(capsys, *[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert status == 1, err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "r").exists()  # a run refused for its config or data leaves no folder behind


def test_nproc_with_cuda_graphs_is_refused_before_launching(tmp_path, capsys):
    status, _, err = run_here(capsys, "train", "tiny", "--out", str(tmp_path / "r"), "--nproc", "2", "--set",
                              "train.compile=true", "--set", "train.cuda_graphs=true", "--set", "train.shape_buckets=8")
    assert status == 1 and err.strip() == ("error: --nproc 2 with train.cuda_graphs: CUDA graphs are for one process "
                                           "(with data parallelism the gradients' all-reduce would be captured in "
                                           "the graphs)"), err
    assert not (tmp_path / "r").exists()


def test_usage_errors_exit_2(capsys):
    assert run_here(capsys, "train")[0] == 2
    assert run_here(capsys, "frobnicate")[0] == 2


def test_an_unknown_option_is_told_with_its_commands_usage(capsys):
    """`translate RUN --bogus` printed the top-level usage ("usage: transformer [-h] COMMAND ...")."""
    for command in ("translate", "serve", "params"):
        status, _, err = run_here(capsys, command, "RUN", "--bogus")
        assert status == 2 and err.startswith(f"usage: transformer {command} [-h]"), err
        assert err.endswith(f"transformer {command}: error: unrecognized arguments: --bogus\n"), err
    status, _, err = run_here(capsys, "--bogus", "translate", "RUN")  # before the command: the top level's
    assert status == 2 and err.startswith("usage: transformer [-h] [--version] COMMAND"), err


def test_an_unexpected_error_is_an_internal_error_with_its_traceback_in_a_log(tmp_path, capsys, monkeypatch):
    """A bug is told apart from the user's errors: exit 70, one line that says so (with the first line of
    the error's message) and where the traceback went, and the traceback (with the command) in that file."""
    def bug(path, lines=None):
        raise RuntimeError("an unforeseen failure\n" + "frame #0: ...\n" * 100)

    monkeypatch.setattr("transformer.trees.read_trees", bug)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert main(["evaluate-parse", "--gold", "g.mrg", "--test", "t.mrg"]) == 70
    log = tmp_path / f"transformer-error-{os.getpid()}.log"
    assert capsys.readouterr().err == ("internal error: RuntimeError: an unforeseen failure — please report it "
                                       f"with the traceback in {log}\n")  # the message's first line
    text = log.read_text()
    assert text.startswith(f"transformer evaluate-parse --gold g.mrg --test t.mrg\n{cli.version_line()}\n\n")
    assert "Traceback" in text and "in bug" in text


def test_an_argument_of_bytes_that_are_no_utf8_is_refused_and_an_internal_error_still_logs(tmp_path, capsys,
                                                                                             monkeypatch):
    """`train --out $'bad\\xffname'` ended in a traceback (TensorBoard's writer), and the internal error's own
    log then failed to encode the command: a second traceback, and an empty log."""
    assert main(["train", "tiny", "--out", str(tmp_path / "bad\udcffname")]) == 1
    assert capsys.readouterr().err == (f"error: {tmp_path}/bad\\xffname: not valid UTF-8 (a path or value the run's "
                                       "records could not hold): give it in UTF-8\n")
    assert not list(tmp_path.iterdir())
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert cli.internal_error(RuntimeError("a bug"), ["parse", "x\udcffy"]) == 70
    assert (tmp_path / f"transformer-error-{os.getpid()}.log").read_text().startswith("transformer parse x\\udcffy\n")


@pytest.mark.parametrize("rank, said", [(None, "interrupted\n"), ("0", "interrupted\n"), ("1", "")])
def test_ctrl_c_is_said_once_in_a_data_parallel_job(rank, said, capsys, monkeypatch):
    """Ctrl-C reaches every rank of a job: each said "interrupted"; rank 0 says it for them (exit 130 all)."""
    def interrupted(path, lines=None):
        raise KeyboardInterrupt

    monkeypatch.setattr("transformer.trees.read_trees", interrupted)
    if rank is not None:  # a torchrun job of two
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["evaluate-parse", "--gold", "g.mrg", "--test", "t.mrg"]) == 130
    assert capsys.readouterr().err == said


@pytest.mark.parametrize("signum, status, said", [("SIGTERM", 143, "terminated"), ("SIGHUP", 129, "hangup")])
def test_sigterm_stops_a_command_in_one_line_and_removes_the_output_it_was_writing(tmp_path, signum, status, said):
    """SIGTERM (a batch system's stop, `kill`, `timeout`) outside training's loop: as Ctrl-C, one line, 128 + the
    signal, and the output being written is removed (its default ended the process at once, silently, and left
    `.out.txt.XXXXXXXX.tmp` beside the output: translate --output, prepare's downloads, training's start). SIGHUP,
    the terminal closed under the command, did the same."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys
        from pathlib import Path
        from transformer import files, trees
        from transformer.cli import main

        def read_trees(path, lines=None):
            with files.atomic_path(Path(sys.argv[1]) / "out.txt") as tmp:
                tmp.write_text("half of it")
                os.kill(os.getpid(), signal.{signum})
                sum(range(1000))  # the handler runs between two bytecodes
                raise AssertionError("{signum} did not stop the command")

        trees.read_trees = read_trees
        sys.exit(main(["evaluate-parse", "--gold", "g.mrg", "--test", "t.mrg"]))
    """))
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=120,
                          preexec_fn=login_shell_signals)
    assert (proc.returncode, proc.stderr) == (status, f"{said}\n"), proc.stderr[-2000:]
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("error, said", [
    (OSError(errno.ENOSPC, "No space left on device"), "error: No space left on device (writing an output)\n"),
    (OSError(errno.EDQUOT, "Disk quota exceeded", "out/x.bin"), "error: out/x.bin: Disk quota exceeded\n"),
    (OSError(errno.EACCES, "Permission denied", "/srv/in.mrg"), "error: /srv/in.mrg: Permission denied\n"),
    # a file-size limit (ulimit -f, FAT32's 4 GiB) was "internal error: OSError: [Errno 27] File too large"
    (OSError(errno.EFBIG, "File too large"), "error: File too large (writing an output)\n")])
def test_a_full_disk_met_outside_the_packages_own_writers_is_one_line(error, said, tmp_path, capsys, monkeypatch):
    """A library's or a stream's write on a full disk (CTranslate2's converter, a token store's arrays) said
    "internal error: OSError: [Errno 28] ... please report it": the user's to fix, in one line, exit 1."""
    def full(path, lines=None):
        raise error

    monkeypatch.setattr("transformer.trees.read_trees", full)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert main(["evaluate-parse", "--gold", "g.mrg", "--test", "t.mrg"]) == 1
    assert capsys.readouterr().err == said
    monkeypatch.setattr("transformer.trees.read_trees", lambda path, lines=None: open(tmp_path / "gone" / "x"))  # a bug's
    assert main(["evaluate-parse", "--gold", "g.mrg", "--test", "t.mrg"]) == 70
    assert capsys.readouterr().err.startswith("internal error: FileNotFoundError")


def test_a_run_file_that_is_a_folder_is_one_line(tmp_path, capsys, tiny_overrides):
    """A run folder whose .lock, train.log, metrics.jsonl or config.toml is a folder (or whose tb/ is a file)
    stopped `train` with "internal error: IsADirectoryError ... please report it": what is on the disk is
    the user's to fix, said in one line naming the path, exit 1."""
    run = tmp_path / "run"
    (run / ".lock").mkdir(parents=True)
    argv = ["train", "tiny", "--out", str(run), "--quiet", *[x for s in tiny_overrides for x in ("--set", s)]]
    assert main(argv) == 1
    assert capsys.readouterr().err == (f"error: {run / '.lock'}: Is a directory: a folder where a file is written, "
                                       "or the reverse (in a run folder: something put in place of one of its "
                                       "files); move it away\n")


def test_a_rename_onto_a_folder_names_the_folder(tmp_path, capsys, monkeypatch):
    """An atomic write's rename(tmp, dst) onto a folder names dst, the path in the way, not the temporary file."""
    def onto_a_folder(path, lines=None):
        raise IsADirectoryError(errno.EISDIR, "Is a directory", "run/.config.toml.x1.tmp", None, "run/config.toml")

    monkeypatch.setattr("transformer.trees.read_trees", onto_a_folder)
    assert main(["evaluate-parse", "--gold", "g.mrg", "--test", "t.mrg"]) == 1
    assert capsys.readouterr().err.startswith("error: run/config.toml: Is a directory: ")


@pytest.mark.parametrize("args", [("params", "base"), ("params", "base", "--json"), ("params", "base", "--cost")])
def test_a_report_into_a_closed_pipe_stops_without_a_word(args):
    """`transformer params base | true`: a report printed whole (params, evaluate, …) into a pipe whose
    reader has gone stops the command as `translate`'s lines do, with 141 and not a word (it was an
    internal error)."""
    read, write = os.pipe()
    os.close(read)
    try:
        buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # as a user runs it: the
        # report waits in stdout's buffer, and meets the closed pipe when it is flushed (it exited 120 there)
        done = subprocess.run([sys.executable, "-m", "transformer", *args], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=120, env=buffered)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (cli.READER_GONE, "")


def test_output_lines_cut_short_by_a_reader_that_left_stop_the_command():
    """`translate --input FILE | head -1`: the chunk's lines went out in one write, which the reader's leaving cut
    short without an error; the command ended with 0, as if every line had been written. It stops as at the next
    write, with 141 (``main``)."""
    code = textwrap.dedent("""
        import os
        from transformer import cli
        try:
            with cli._line_sink(None) as write:
                write(["a line of output " * 5] * 5000)  # 440 kB: more than a pipe holds
        except BrokenPipeError:
            os._exit(41)
        os._exit(0)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline().startswith(b"a line of output")
        proc.stdout.close()  # as head -1 does, the writer still blocked on the full pipe
        assert proc.wait(timeout=60) == 41, proc.stderr.read().decode()[-2000:]
    finally:
        proc.kill()


def _closing(fd: int) -> Callable[[], None]:
    return lambda: os.close(fd)


@pytest.mark.parametrize("args", [("params", "tiny"), ("--help",)])
def test_a_command_started_with_stdout_closed_says_so_in_one_line(args):
    """`transformer params tiny >&-`: Python sets sys.stdout to None, and the first print was an AttributeError's
    traceback, raised again while the error was being said."""
    done = subprocess.run([sys.executable, "-m", "transformer", *args], stdin=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=120, preexec_fn=_closing(1))
    assert (done.returncode, done.stderr) == (1, "error: standard output is closed (>&-): give --output FILE where "
                                                 "the command has it, or send it to /dev/null\n")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
@pytest.mark.parametrize("args, status", [(("--help",), 1), (("translate", "--help"), 1), (("translate",), 2)])
def test_help_into_a_full_disk_is_a_failure_said_in_one_line(args, status):
    """argparse drops a failed write of its help: `--help > /dev/full` exited 0 with nothing written. A usage error
    keeps its status (2) when its lines cannot be written either. Buffered (no PYTHONUNBUFFERED, as in a user's
    shell), what the failed flush left in stdout's buffer failed again as Python exited: a second message, 120."""
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "transformer", *args], stdin=subprocess.DEVNULL, stdout=full,
                              stderr=subprocess.PIPE if status == 1 else full, text=True, timeout=120, env=buffered)
    assert done.returncode == status
    if status == 1:
        assert done.stderr == "error: No space left on device (writing an output)\n"


def test_translate_started_with_stderr_closed_writes_its_output(tiny_run, tmp_path):
    """`translate ... --output FILE 2>&-`: its progress and log lines have nowhere to go, and the translation is
    still written (asking the closed stream whether it was a terminal failed the command)."""
    src, out = tmp_path / "in.en", tmp_path / "out.de"
    src.write_text("a dog runs .\ntwo men sit .\n")
    done = subprocess.run([sys.executable, "-m", "transformer", "translate", str(tiny_run), "--input", str(src),
                           "--output", str(out)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
                          timeout=120, preexec_fn=_closing(2))
    assert done.returncode == 0 and len(out.read_text().splitlines()) == 2


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
@pytest.mark.parametrize("command", ["translate", "score"])
def test_a_command_whose_stderr_cannot_be_written_still_gives_its_results(command, tiny_run, tmp_path):
    """`translate RUN 2>/dev/full`: the first log line ("averaging the last ... checkpoint(s)") raised ENOSPC,
    and the command wrote no translation and exited 1; `score` wrote its scores, then exited 1."""
    src = tmp_path / "in.en"
    src.write_text("a dog runs .\ntwo men sit .\n")
    args = {"translate": ["--input", str(src)], "score": ["--src", str(src), "--tgt", str(src)]}[command]
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "transformer", command, str(tiny_run), *args],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=full, text=True, timeout=120)
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 2, done


@pytest.mark.parametrize("encoding", ["latin-1", "ascii"])
def test_a_locale_of_another_encoding_neither_fails_nor_hides_a_line(encoding, tiny_run, tmp_path):
    """Under LANG=de_DE.ISO-8859-1 (or PYTHONIOENCODING), `score --json` met the piece "\u2581" and ended in an
    internal error, and an error naming a file "\u00fc.txt" was dropped whole (exit 1, no word). stdout writes
    UTF-8, as the output files do; stderr escapes what its encoding lacks."""
    env = {**os.environ, "PYTHONIOENCODING": encoding}
    run = [sys.executable, "-m", "transformer"]
    scored = subprocess.run([*run, "score", str(tiny_run), "--json"], capture_output=True, env=env, timeout=120,
                            input="a dog runs .\tein hund läuft .\n".encode())
    assert scored.returncode == 0 and "\u2581".encode() in scored.stdout, scored.stderr[-2000:]
    refused = subprocess.run([*run, "translate", str(tiny_run), "--input", str(tmp_path / "\u00fc.txt")],
                             capture_output=True, env=env, timeout=120)
    assert refused.returncode == 1 and b"error: " in refused.stderr and b".txt: " in refused.stderr, refused


def test_training_started_with_stdout_closed_trains(tiny_overrides, tmp_path):
    """`train ... >&-`: its log lines, train.log's too, have nowhere else to go; the first of them ended training
    with "give --output FILE where the command has it", an option train has not, leaving config.toml behind."""
    run = tmp_path / "run"
    sets = [a for o in tiny_overrides + ["train.max_steps=2"] for a in ("--set", o)]
    done = subprocess.run([sys.executable, "-m", "transformer", "train", "tiny", "--out", str(run), *sets],
                          stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=300,
                          preexec_fn=_closing(1))
    assert done.returncode == 0 and "done: " in (run / "train.log").read_text(), done.stderr[-2000:]


@pytest.mark.parametrize("signum, status, said", [("SIGTERM", 143, "terminated"), ("SIGINT", 130, "interrupted"),
                                                  ("SIGHUP", 129, "hangup")])
def test_a_stop_signal_before_the_command_starts_is_said_in_one_line(signum, status, said):
    """A rank of `train --nproc 2` imports for its first seconds, and its launcher passes Ctrl-C and SIGTERM on to
    it there too: Ctrl-C printed a KeyboardInterrupt traceback, SIGTERM ended it without a word. Here the
    signal comes while the command line is read, before the command runs."""
    code = textwrap.dedent(f"""
        import os, signal
        from transformer import cli
        read = cli.build_parser
        def stopped():
            os.kill(os.getpid(), signal.{signum})
            return read()
        cli.build_parser = stopped
        raise SystemExit(cli.main(["params", "tiny"]))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          preexec_fn=login_shell_signals)
    assert (done.returncode, done.stdout, done.stderr) == (status, "", f"{said}\n")


def test_a_dash_names_stdin_and_stdout(tiny_run, tmp_path, monkeypatch):
    """`--input -` said "-: cannot read", and `--output -` wrote a file called "-"; as in most tools, "-" is the
    standard stream, the option's default."""
    monkeypatch.chdir(tmp_path)
    plain = run_cli("translate", str(tiny_run), stdin="a dog runs .\n")
    dashed = run_cli("translate", str(tiny_run), "--input", "-", "--output", "-", stdin="a dog runs .\n")
    assert dashed.returncode == plain.returncode == 0 and dashed.stdout == plain.stdout != ""
    assert list(tmp_path.iterdir()) == []


def test_a_broken_pipe_that_is_not_stdout_is_an_internal_error(tmp_path, capsys, monkeypatch):
    """Only the reader of stdout going away is the user's doing; a broken pipe elsewhere (a subprocess, a
    socket) is a failure to report."""
    def bug(path, lines=None):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("transformer.trees.read_trees", bug)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert main(["evaluate-parse", "--gold", "g.mrg", "--test", "t.mrg"]) == 70
    assert capsys.readouterr().err.startswith("internal error: BrokenPipeError")


def test_decoding_options_replace_the_runs_own():
    from transformer.cli import _decode_overrides, _request, build_parser

    args = build_parser().parse_args(["serve", "RUN", "--beam", "6", "--alpha", "1.0", "--early-stop", "top",
                                      "--length-norm", "length"])
    assert _decode_overrides(args) == {"beam_size": 6, "alpha": 1.0, "early_stop": "top", "length_norm": "length"}
    assert _request(build_parser().parse_args(["translate", "RUN", "--length-norm", "length"])).length_norm == "length"
    assert _decode_overrides(build_parser().parse_args(["translate", "RUN"])) == {}
    with pytest.raises(SystemExit):  # usage error: not a rule
        build_parser().parse_args(["translate", "RUN", "--early-stop", "first"])


def test_every_command_has_help(capsys):
    """--help of every command, and a help text for each of its arguments (params' preset, plot's run
    folder and evaluate-parse's files had none)."""
    import argparse

    commands = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert {"train", "translate", "evaluate", "average", "params", "serve", "export"} <= set(commands)
    for command, parser in commands.items():
        status, out, _ = run_here(capsys, command, "--help")
        assert status == 0 and "usage:" in out, command
        assert [a.dest for a in parser._actions if not a.help] == [], command


def test_every_command_shows_examples_that_its_parser_takes(capsys):
    """Each command's --help ends with examples, one to a line as written; each `transformer` command line in them
    (a pipe's sides, torchrun's `-m transformer`) parses: an option renamed or removed fails here."""
    import shlex

    for c in cli.COMMANDS:
        assert c.examples, c.name
        _, out, _ = run_here(capsys, c.name, "--help")
        assert "examples:\n" + "".join(f"  {line}\n" for line in c.examples) in out, c.name
        run = set()
        for line in c.examples:
            sides = [words for side in line.split(" | ")  # a redirection's words are the shell's
                     if "transformer" in (words := shlex.split(side.split(" > ")[0]))]
            assert sides, line
            for words in sides:
                args = words[words.index("transformer") + 1:]
                run.add(cli.build_parser().parse_args(args).command)
        assert c.name in run, c.name


def test_serve_help_names_the_schema_path(capsys):
    """serve --help names where the OpenAPI description is: /openapi.json (FastAPI's), which /docs only
    shows as Swagger UI's page (the help had called /docs the description)."""
    status, out, _ = run_here(capsys, "serve", "--help")
    text = " ".join(out.split())
    assert status == 0 and "/openapi.json the OpenAPI description" in text


@pytest.mark.parametrize("missing", ["uvicorn", "fastapi"])
def test_serve_without_its_extra_says_how_to_install_it(missing, capsys, monkeypatch):
    """uvicorn, imported late, was an internal error where fastapi was not; and the hint named a package no index
    holds under that name (pip install 'transformer[serve]')."""
    monkeypatch.setitem(sys.modules, missing, None)  # import fails: what an environment without it does
    monkeypatch.delitem(sys.modules, "transformer.serve", raising=False)
    status, out, err = run_here(capsys, "serve", str(REFERENCE_RUN), "--port", "1")
    assert (status, out) == (1, "") and err.startswith("error: serving needs the optional dependencies: pip install "
                                                       "'fastapi") and "(the [serve] extra) (" in err and missing in err


@pytest.mark.parametrize("missing", ["onnxruntime", "onnx"])
def test_onnx_export_without_onnxruntime_says_how_to_install_it(missing, capsys, monkeypatch, tmp_path):
    """optimum asks for onnx and onnxruntime only once its export is done (to fix the graphs' dynamic shapes): an
    internal error (its RuntimeError) after all the work. Now refused before it, as a missing optimum is."""
    # imported for real before the patch: optimum's modules are lazy, and at import it notes once for the process
    # whether onnxruntime is there (a later ONNX export in this process then failed)
    assert pytest.importorskip("optimum.exporters.onnx").main_export
    monkeypatch.setitem(sys.modules, missing, None)  # import fails: what an environment without it does
    status, out, err = run_here(capsys, "export", str(REFERENCE_RUN), "--format", "onnx", "--out",
                                str(tmp_path / "onnx"))
    assert (status, out) == (1, "") and err.startswith(f"error: {missing}, which optimum's ONNX export needs, is not "
                                                       "installed: pip install ") and err.count("\n") == 1, err
    assert not (tmp_path / "onnx").exists()


@pytest.mark.parametrize("fmt, missing, what", [("ctranslate2", "ctranslate2", "CTranslate2"),
                                                 ("huggingface", "transformers", "transformers")])
def test_an_export_without_its_library_says_so_before_the_work(fmt, missing, what, capsys, monkeypatch, tmp_path):
    """The missing library was found only once the run's average was made (minutes for a big model)."""
    monkeypatch.setitem(sys.modules, missing, None)
    status, out, err = run_here(capsys, "export", str(REFERENCE_RUN), "--format", fmt, "--out", str(tmp_path / "x"))
    assert (status, out) == (1, "") and err.startswith(f"error: {what} is not installed: pip install "), err
    assert "averaging" not in err and not (tmp_path / "x").exists()


def test_the_early_stop_help_names_the_runs_default(capsys):
    """Without --early-stop a search stops by the run's decode.early_stop, as the other search options take the
    run's values; the help called bound the default, which a run whose config says top does not use."""
    for command in ("translate", "evaluate", "serve"):
        status, out, _ = run_here(capsys, command, "--help")
        text = " ".join(out.split())
        assert status == 0 and "(default: the run's decode.early_stop, bound unless it says otherwise)" in text, command


@pytest.mark.parametrize("flag, value, message", [("--alpha", "nan", "--alpha nan: must be a finite number >= 0"),
                                                  ("--alpha", "inf", "--alpha inf: must be a finite number >= 0"),
                                                  ("--alpha", "-0.5", "--alpha -0.5: must be a finite number >= 0"),
                                                  ("--beam", "0", "--beam 0: must be at least 1"),
                                                  ("--max-len-offset", "-1", "--max-len-offset -1: must be >= 0"),
                                                  ("--batch-size", "0", "--batch-size 0: must be at least 1")])
def test_decoding_flags_are_checked_as_the_request(tiny_run, tmp_path, capsys, flag, value, message):
    """A flag's value is checked with the request (``DecodeRequest.verify``): NaN is not a length penalty."""
    (tmp_path / "in.txt").write_text("a dog runs .\n")
    status, out, err = run_here(capsys, "translate", str(tiny_run), "--input", str(tmp_path / "in.txt"), flag, value)
    assert status == 1 and message in err, err
    assert out == "" and len(err.strip().splitlines()) == 1


def test_decoding_commands_take_a_thread_count(tiny_run, tmp_path, capsys, monkeypatch):
    """--threads sets torch's intra-op threads for translate, evaluate, score, serve, attention (only
    OMP_NUM_THREADS could, read when torch starts); 0 is refused."""
    (tmp_path / "in.txt").write_text("a dog runs .\n")
    threads = torch.get_num_threads()
    asked = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: asked.append(n))
    status, out, err = run_here(capsys, "translate", str(tiny_run), "--input", str(tmp_path / "in.txt"), "--threads", "1")
    assert status == 0 and asked == [1] and out.count("\n") == 1, err
    status, out, err = run_here(capsys, "translate", str(tiny_run), "--input", str(tmp_path / "in.txt"), "--threads",
                                "1", "--int8", "--nbest", "2")  # with the others: it is the process's
    assert status == 0 and asked == [1, 1] and out.count(" ||| ") == 4, err
    status, out, err = run_here(capsys, "translate", str(tiny_run), "--threads", "0")
    assert status == 1 and err == "error: --threads 0: give 1 .. 1024 (default: one per core)\n" and asked == [1, 1]
    for command in ("evaluate", "score", "serve", "attention"):
        status, out, _ = run_here(capsys, command, "--help")
        assert "--threads N" in out, command
    assert torch.get_num_threads() == threads


SENTENCES = "a dog runs .\ntwo men are talking on a street .\n\na girl in a red coat .\n"


def test_scores_divided_to_nearly_nothing_still_print_their_digits(tiny_run):
    """At `--length-norm length --alpha 10` (a bound the docs allow) a score is log P / |Y|^10: every one printed
    -0.000000, in n-best lists and in `score`, and the lists' order could not be read from them."""
    nbest = run_cli("translate", str(tiny_run), "--beam", "3", "--nbest", "3", "--length-norm", "length",
                    "--alpha", "10", stdin=SENTENCES)
    assert nbest.returncode == 0, nbest.stderr
    rows = [line.split(" ||| ") for line in nbest.stdout.splitlines() if not line.startswith("2 ")]
    scores = [float(r[2]) for r in rows]
    assert all(x < 0 for x in scores) and len(set(scores)) > 1, rows
    for i in {r[0] for r in rows}:
        mine = [float(r[2]) for r in rows if r[0] == i]
        assert mine == sorted(mine, reverse=True)
    assert [line.split(" ||| ")[2] for line in nbest.stdout.splitlines() if line.startswith("2 ")] == ["0.000000"] * 3


def test_nbest_scores_and_score_agree(tiny_run, tmp_path):
    """translate --nbest: Moses n-best lines, K per input, best first, the first being the plain
    output; --scores gives the same first score; `score` of those outputs gives their scores back."""
    plain = run_cli("translate", str(tiny_run), "--beam", "3", stdin=SENTENCES)
    nbest = run_cli("translate", str(tiny_run), "--beam", "3", "--nbest", "3", stdin=SENTENCES)
    scored = run_cli("translate", str(tiny_run), "--beam", "3", "--scores", stdin=SENTENCES)
    assert plain.returncode == nbest.returncode == scored.returncode == 0, nbest.stderr
    rows = [line.split(" ||| ") for line in nbest.stdout.splitlines()]
    assert [int(r[0]) for r in rows] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]  # K lines for an empty line too
    assert [r[1:] for r in rows if r[0] == "2"] == [["", "0.000000"]] * 3
    firsts = [r for i, r in enumerate(rows) if i == 0 or rows[i - 1][0] != r[0]]
    assert [r[1] for r in firsts] == plain.stdout.splitlines()
    for i in {r[0] for r in rows}:
        scores = [float(r[2]) for r in rows if r[0] == i]
        assert scores == sorted(scores, reverse=True)
    assert [line.split("\t") for line in scored.stdout.splitlines()] == [[r[2], r[1]] for r in firsts]
    src = tmp_path / "src.txt"
    tgt = tmp_path / "tgt.txt"
    keep = rows  # the empty input line too: its empty output scores 0, as translate scored it
    src.write_text("".join(SENTENCES.splitlines(keepends=True)[int(r[0])] for r in keep))
    tgt.write_text("".join(r[1] + "\n" for r in keep))
    result = run_cli("score", str(tiny_run), "--src", str(src), "--tgt", str(tgt))
    assert result.returncode == 0, result.stderr
    assert "perplexity" in result.stderr
    # A search may write pieces that are not the vocabulary's own segmentation of their text ("." where
    # re-encoding gives "▁", "."): `score` reads text, so only the hypotheses written in the canonical
    # segmentation must score as the beam scored them (tests/test_decode.py checks every one, by ids).
    from transformer.tokenizer import Tokenizer
    from transformer.translator import Translator

    translator = Translator(tiny_run, log=lambda m: None, decode={"beam_size": 3})
    tok = Tokenizer(tiny_run / "spm.model")
    lines = [line for line in SENTENCES.splitlines() if line]
    ids = decode_ids(translator.model, encode_for_decoding(lines, tok), beam_size=3, nbest=3)
    canonical = {tok.decode(h.tokens) for hyps in ids for h in hyps if tok.encode(tok.decode(h.tokens)) == h.tokens}
    got = [float(line.split("\t")[0]) for line in result.stdout.splitlines()]
    checked = [(g, float(r[2])) for g, r in zip(got, keep) if r[1] in canonical]
    assert checked and max(abs(g - x) for g, x in checked) < 1e-4
    assert [(g, r[2]) for g, r in zip(got, keep) if r[0] == "2"] == [(0.0, "0.000000")] * 3  # it was -3.5
    stdin = run_cli("score", str(tiny_run), "--json", stdin="".join(
        f"{a.strip()}\t{b.strip()}\n" for a, b in zip(src.read_text().splitlines(), tgt.read_text().splitlines())))
    records = [json.loads(line) for line in stdin.stdout.splitlines()]
    assert [round(r["score"], 6) for r in records] == [float(line.split("\t")[0]) for line in result.stdout.splitlines()]
    assert all(len(r["tokens"]) == len(r["token_log_probs"]) and r["tokens"][-1] == "</s>" for r in records)
    assert all(abs(sum(r["token_log_probs"]) - r["log_prob"]) < 1e-6 for r in records)


def test_prefix_and_sampling_from_the_command_line(tiny_run, tmp_path):
    prefixes = tmp_path / "prefix.txt"
    prefixes.write_text("ein Hund\n\n\nzwei\n")
    result = run_cli("translate", str(tiny_run), "--prefix", str(prefixes), "--nbest", "2", stdin=SENTENCES)
    assert result.returncode == 0, result.stderr
    rows = [line.split(" ||| ") for line in result.stdout.splitlines()]
    assert all(r[1].startswith("ein Hund") for r in rows if r[0] == "0")
    assert all(r[1].startswith("zwei") for r in rows if r[0] == "3")
    runs = [run_cli("translate", str(tiny_run), "--sample", "--seed", seed, "--nbest", "4", stdin=SENTENCES)
            for seed in ("1", "1", "2")]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    assert runs[0].stdout == runs[1].stdout != runs[2].stdout
    greedy = run_cli("translate", str(tiny_run), "--beam", "1", stdin=SENTENCES)
    top1 = run_cli("translate", str(tiny_run), "--sample", "--topk", "1", "--seed", "3", stdin=SENTENCES)
    assert top1.stdout == greedy.stdout


@pytest.mark.slow
@pytest.mark.parametrize("end", ["^D", "closed output"])
def test_each_line_typed_at_a_terminal_is_answered_before_the_next(tiny_run, end):
    """At a terminal `translate` answers a line as soon as it is entered, not at the end of the input, with
    what one batch of the same lines gives. It ends at the terminal's end of input (^D) with status 0, or,
    once what reads its output has closed it (`| head`), at its next line with 141 and not a word."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "transformer", "translate", str(tiny_run), "--batch-size", "1"],
                            stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    os.close(slave)
    got = []
    try:
        for line in SENTENCES.splitlines():
            os.write(master, f"{line}\n".encode())
            ready, _, _ = select.select([proc.stdout], [], [], 120)
            assert ready, f"no answer to {line!r} while the input stays open"
            got.append(proc.stdout.readline().rstrip("\n"))
        if end == "^D":
            os.write(master, b"\x04")
        else:
            proc.stdout.close()
            os.write(master, b"a dog runs .\n")
        status = proc.wait(120)
        said = [line for line in proc.stderr.read().splitlines() if not line.startswith("averaging the last")]
    finally:
        proc.kill()
        proc.wait()
        os.close(master)
    assert (status, said) == ((0, []) if end == "^D" else (cli.READER_GONE, []))
    whole = run_cli("translate", str(tiny_run), "--batch-size", "1", stdin=SENTENCES)
    assert got == whole.stdout.splitlines() and len(got) == 4


@pytest.mark.slow
def test_a_line_written_to_a_pipe_is_answered_while_the_pipe_stays_open(tiny_run):
    """A program that writes a line to `translate`'s stdin and waits for its answer gets it: the lines that
    have come are decoded (no more than a chunk), not held until 10,000 lines or the end of the input; the
    answers are one batch's of the same lines."""
    got = answers_on_a_pipe(["translate", str(tiny_run), "--batch-size", "1"], SENTENCES.splitlines())
    whole = run_cli("translate", str(tiny_run), "--batch-size", "1", stdin=SENTENCES)
    assert got == whole.stdout.splitlines() and len(got) == 4


def answers_on_a_pipe(argv: list[str], lines: list[str]) -> list[str]:
    """`transformer ARGV`'s output lines, each line of ``lines`` written to its stdin, a pipe kept open, only
    once the line before it is answered; the command must then end with 0 and say no more."""
    proc = subprocess.Popen([sys.executable, "-m", "transformer", *argv],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    got = []
    try:
        for line in lines:
            proc.stdin.write(f"{line}\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], 120)
            assert ready, f"no answer to {line!r} while the pipe stays open"
            got.append(proc.stdout.readline().rstrip("\n"))
        proc.stdin.close()
        status = proc.wait(120)
    finally:
        proc.kill()
        proc.wait()
    assert status == 0 and proc.stdout.read() == "", proc.stderr.read()
    return got


@pytest.mark.slow
@pytest.mark.parametrize("stdin_side", ["--tgt -", "--src -", "pairs"])
def test_a_pair_written_to_a_pipe_is_scored_while_the_pipe_stays_open(tiny_run, tmp_path, stdin_side):
    """`translate ... | transformer score RUN --src in.txt --tgt -`: with one side on stdin the pairs were read
    10,000 at a time, so a pipe's pairs waited for its end; they are scored as they come, as pairs given on
    stdin whole (SOURCE<TAB>TARGET) and translate's lines are."""
    sources = SENTENCES.splitlines()
    targets = ["ein hund läuft .", "eine frau", "zwei männer", "ein kind spielt ."][:len(sources)]
    (tmp_path / "src.txt").write_text("".join(f"{s}\n" for s in sources))
    (tmp_path / "tgt.txt").write_text("".join(f"{t}\n" for t in targets))
    given = {"--tgt -": ["--src", str(tmp_path / "src.txt"), "--tgt", "-"],
             "--src -": ["--src", "-", "--tgt", str(tmp_path / "tgt.txt")], "pairs": []}[stdin_side]
    typed = {"--tgt -": targets, "--src -": sources, "pairs": [f"{s}\t{t}" for s, t in zip(sources, targets)]}
    got = answers_on_a_pipe(["score", str(tiny_run), *given], typed[stdin_side])
    whole = run_cli("score", str(tiny_run), "--src", str(tmp_path / "src.txt"), "--tgt", str(tmp_path / "tgt.txt"))
    # the same scores, each pair scored alone against all four in one batch (padding moves the last digit)
    assert [float(x) for line in got for x in line.split("\t")] == pytest.approx(
        [float(x) for line in whole.stdout.splitlines() for x in line.split("\t")], rel=1e-5)
    assert len(got) == len(sources)


def test_a_long_input_is_decoded_and_written_chunk_by_chunk(tiny_run, tmp_path, capsys, monkeypatch):
    """An input longer than a chunk (3 lines here): the outputs of one chunk, n-best lists numbered by
    input line, each line's own prefix across the chunks, and draws that go on from chunk to chunk
    (the same sentence six times, three a chunk: a generator seeded again for each chunk repeats them)."""
    lines = SENTENCES.splitlines() * 2
    prefixes = ["ein", "zwei", "", "drei", "zwei", "ein", "", "drei"]
    (tmp_path / "in.txt").write_text("".join(f"{line}\n" for line in lines))
    (tmp_path / "prefix.txt").write_text("".join(f"{p}\n" for p in prefixes))
    (tmp_path / "same.txt").write_text("a dog runs .\n" * 6)
    nbest = ("translate", str(tiny_run), "--input", str(tmp_path / "in.txt"), "--batch-size", "1", "--nbest", "2",
             "--prefix", str(tmp_path / "prefix.txt"))
    sample = ("translate", str(tiny_run), "--input", str(tmp_path / "same.txt"), "--batch-size", "3", "--sample")
    for page in ("README.md", "docs/decoding.md"):  # what the pages tell users
        assert f"{cli.CHUNK:,} lines at a time" in (Path(__file__).parents[1] / page).read_text()
    whole = run_here(capsys, *nbest)
    monkeypatch.setattr(cli, "CHUNK", 3)
    chunked = run_here(capsys, *nbest)
    assert whole[0] == 0 and chunked[:2] == whole[:2], chunked[2]
    rows = [row.split(" ||| ") for row in chunked[1].splitlines()]
    assert sorted({int(r[0]) for r in rows}) == list(range(8))
    assert all(r[1].startswith(prefixes[int(r[0])]) for r in rows if lines[int(r[0])])
    status, drawn, err = run_here(capsys, *sample)
    assert status == 0 and len(drawn.splitlines()) == 6, err
    assert drawn.splitlines()[:3] != drawn.splitlines()[3:]


def test_an_input_file_that_can_be_read_once_is_translated(tiny_run, tmp_path, capsys):
    """`--input <(zcat corpus.gz)`: a pipe given as a file is not counted first (that would use it up)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "in.txt").write_text(SENTENCES)
    writer = threading.Thread(target=lambda: fifo.write_text(SENTENCES), daemon=True)
    writer.start()
    piped = run_here(capsys, "translate", str(tiny_run), "--input", str(fifo))
    writer.join(60)
    assert piped[0] == 0 and len(piped[1].splitlines()) == 4, piped[2]
    assert piped[1] == run_here(capsys, "translate", str(tiny_run), "--input", str(tmp_path / "in.txt"))[1]


def test_a_prefix_or_constraint_for_an_empty_line_is_refused(tiny_run, tmp_path, capsys):
    """An empty line gets an empty line: its prefix or constraints were dropped without a word."""
    (tmp_path / "in.txt").write_text("a dog runs .\n\na cat .\n")
    (tmp_path / "prefix.txt").write_text("ein\nzwei\n\n")
    (tmp_path / "constraints.txt").write_text("\nHund\n\n")
    for option, file in (("--prefix", "prefix.txt"), ("--constraints", "constraints.txt")):
        status, out, err = run_here(capsys, "translate", str(tiny_run), "--input", str(tmp_path / "in.txt"),
                                    option, str(tmp_path / file))
        assert (status, out) == (1, "") and err.endswith(f"error: {option} line 2: its input line is empty or blank, "
                                                         f"and such a line gets an empty output, which cannot hold "
                                                         f"its {option.removeprefix('--')}\n"), err
    (tmp_path / "in.txt").write_text("a dog runs .\n\u200b \u200b\na cat .\n")  # blank once normalised, as empty
    status, out, err = run_here(capsys, "translate", str(tiny_run), "--input", str(tmp_path / "in.txt"),
                                "--prefix", str(tmp_path / "prefix.txt"))
    assert (status, out) == (1, "") and "--prefix line 2: its input line is empty" in err, err
    (tmp_path / "prefix.txt").write_text("ein\n\nzwei\n")  # none for the empty line: it is answered, empty
    status, out, err = run_here(capsys, "translate", str(tiny_run), "--input", str(tmp_path / "in.txt"),
                                "--prefix", str(tmp_path / "prefix.txt"))
    assert status == 0 and out.split("\n")[1] == "" and out.split("\n")[2].startswith("zwei"), err


def test_a_prefix_the_vocabulary_cannot_write_is_refused(tiny_run, tmp_path, capsys):
    """A character no piece holds becomes "⁇": the output did not start with its prefix (nor hold its
    constraint), and nothing said so."""
    (tmp_path / "in.txt").write_text("a dog runs .\na cat .\n")
    (tmp_path / "prefix.txt").write_text("ein\n🐶 Hund\n")
    status, out, err = run_here(capsys, "translate", str(tiny_run), "--input", str(tmp_path / "in.txt"),
                                "--prefix", str(tmp_path / "prefix.txt"))
    assert (status, out) == (1, "") and err.endswith(
        "error: --prefix line 2: the model's vocabulary has no piece for '🐶', so no output can hold the prefix "
        "as written: leave these characters out or replace them\n"), err


def test_prefixes_for_stdin_are_counted_as_its_lines_come(tiny_run, tmp_path):
    prefixes = tmp_path / "prefix.txt"
    prefixes.write_text("ein\n")
    fewer = run_cli("translate", str(tiny_run), "--prefix", str(prefixes), stdin="a dog .\na cat .\n")
    assert fewer.returncode == 1 and len(fewer.stdout.splitlines()) <= 1, fewer.stderr  # line 1's, if decoded alone
    assert fewer.stderr.splitlines()[-1] == "error: --prefix: 1 given, for more input lines (line 2 has none)"
    prefixes.write_text("ein\nzwei\ndrei\n")
    more = run_cli("translate", str(tiny_run), "--prefix", str(prefixes), stdin="a dog .\na cat .\n")
    assert more.returncode == 1 and more.stderr.splitlines()[-1] == "error: --prefix: 3 given for 2 input lines"
    written = more.stdout.splitlines()  # as they were done, before the input ended
    assert len(written) == 2 and written[0].startswith("ein") and written[1].startswith("zwei")


@pytest.mark.parametrize("args, message", [
    (["--nbest", "5"], "--nbest 5 with the run's beam size 4: an n-best list holds at most the beam's hypotheses"),
    (["--nbest", "0"], "--nbest 0: must be at least 1"),
    (["--topk", "3"], "--topk without --sample: a setting of sampling"),
    (["--sample", "--topp", "1.5"], "--topp 1.5: must be in (0, 1]"),
    (["--sample", "--topp", "0"], "--topp 0.0: must be in (0, 1]"),
    (["--sample", "--topk", "-1"], "--topk -1: must be >= 0"),
    (["--sample", "--temperature", "nan"], "--temperature nan: must be in 1.2e-38 .. 3.4e+38"),
    (["--sample", "--temperature", "1e-40"], "--temperature 1e-40: must be in 1.2e-38 .. 3.4e+38"),
    (["--sample", "--temperature", "1e39"], "--temperature 1e+39: must be in 1.2e-38 .. 3.4e+38"),
    (["--sample", "--seed", str(2**64)], f"--seed {2**64}: must be in 0 .. 2^64 - 1"),
    (["--sample", "--seed", "-1"], "--seed -1: must be in 0 .. 2^64 - 1"),
    (["--prefix", "{tmp}/two_lines.txt"], "--prefix: 2 given for 4 input lines"),
    (["--prefix", "{tmp}/long.txt", "--max-len-offset", "2"], "--prefix line 1:"),
])
def test_decoding_feature_errors_are_one_line(tiny_run, tmp_path, capsys, args, message):
    (tmp_path / "two_lines.txt").write_text("a\nb\n")
    (tmp_path / "long.txt").write_text("ein Hund läuft schnell über die grüne Wiese\n\n\n\n")
    (tmp_path / "in.txt").write_text(SENTENCES)
    status, out, err = run_here(capsys, "translate", str(tiny_run), "--input", str(tmp_path / "in.txt"),
                                *[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert status == 1 and message in err, err
    # the options are checked before the weights load; the files once the input is read, after it
    said = [line for line in err.strip().splitlines() if not line.startswith("averaging the last")]
    assert out == "" and len(said) == 1 and "Traceback" not in err, err
    assert len(said) == len(err.strip().splitlines()) or "{tmp}" in " ".join(args)


def test_evaluates_unreadable_files_are_named_with_their_option(tiny_run, tmp_path, capsys):
    """A Latin-1 --ref was "u/lat.de:1: invalid UTF-8 ...", where translate says "--input x:6: ..." (a file the
    run's config names is said so: the user gave no --ref)."""
    (tmp_path / "src.en").write_text("A dog.\n")
    (tmp_path / "lat.de").write_bytes("Ein Hund läuft.\n".encode("latin-1"))
    status, out, err = run_here(capsys, "evaluate", str(tiny_run), "--src", str(tmp_path / "src.en"),
                                "--ref", str(tmp_path / "lat.de"))
    assert status == 1 and err.startswith(f"error: --ref {tmp_path / 'lat.de'}:1: invalid UTF-8"), err


def test_score_errors_are_one_line(tiny_run, tmp_path):
    (tmp_path / "a.txt").write_text("x\ny\n")
    (tmp_path / "b.txt").write_text("x\n")
    for args, stdin, message in [(["--src", str(tmp_path / "a.txt")], "", "give both --src and --tgt"),
                                 (["--src", str(tmp_path / "a.txt"), "--tgt", str(tmp_path / "b.txt")], "",
                                  "differ in length"),
                                 ([], "no tab here\n", "stdin:1: expected SOURCE<TAB>TARGET")]:
        result = run_cli("score", str(tiny_run), *args, stdin=stdin)
        assert result.returncode == 1 and message in result.stderr, result.stderr
        said = [line for line in result.stderr.strip().splitlines() if not line.startswith("averaging the last")]
        assert len(said) == 1 and "Traceback" not in result.stderr, result.stderr


def test_score_checks_two_files_before_it_writes_a_score(tiny_run, tmp_path, capsys):
    """Files that differ in length, or hold bytes that are no UTF-8, past the first 10,000 lines: score had written
    10,000 lines of scores to stdout when it said so (a believable, half-finished file of exit 1)."""
    (tmp_path / "src").write_text("a\n" * 10_003)
    (tmp_path / "tgt").write_text("b\n" * 10_002)
    status, out, err = run_here(capsys, "score", str(tiny_run), "--src", str(tmp_path / "src"), "--tgt",
                                str(tmp_path / "tgt"))
    assert (status, out) == (1, "") and err.endswith(f"{tmp_path / 'src'} has 10003 lines, {tmp_path / 'tgt'} has "
                                                     "10002\n"), err
    (tmp_path / "tgt").write_bytes(b"b\n" * 10_002 + b"\xff\n")
    status, out, err = run_here(capsys, "score", str(tiny_run), "--src", str(tmp_path / "src"), "--tgt",
                                str(tmp_path / "tgt"))
    assert (status, out) == (1, "") and f"{tmp_path / 'tgt'}:10003: invalid UTF-8" in err, err
    for option in ("--src", "--tgt"):  # a folder: "error: /tmp: cannot read (Is a directory)", no option named
        files = {"--src": str(tmp_path / "src"), "--tgt": str(tmp_path / "tgt"), option: str(tmp_path)}
        status, out, err = run_here(capsys, "score", str(tiny_run), *itertools.chain(*files.items()))
        assert (status, out, err) == (1, "", f"error: {option} {tmp_path}: cannot read (Is a directory)\n")


def test_a_prefix_or_constraints_file_that_cannot_be_read_is_named_by_its_option(tiny_run, tmp_path, capsys):
    """"error: /tmp: cannot read (Is a directory)": which option gave it? --input's errors said so already."""
    (tmp_path / "bad.txt").write_bytes(b"Ein\n\xff\n")
    for option, path, said in (("--prefix", tmp_path / "missing.txt", "cannot read (No such file or directory)"),
                               ("--constraints", tmp_path, "cannot read (Is a directory)"),
                               ("--prefix", tmp_path / "bad.txt", "2: invalid UTF-8")):
        status, out, err = run_here(capsys, "translate", str(tiny_run), option, str(path))
        assert (status, out) == (1, "") and err.startswith(f"error: {option} {path}:") and said in err, err


def test_score_says_its_weights_before_a_later_pair_is_refused(tiny_run):
    """The weights that scored the pairs were said at the end alone: a pair refused midway (a tab too many) left
    scores on stdout with no word of the checkpoints that made them."""
    proc = subprocess.Popen([sys.executable, "-m", "transformer", "score", str(tiny_run)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        proc.stdin.write("A dog runs .\tEin Hund rennt .\n")
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready and proc.stdout.readline().count("\t") == 1
        proc.stdin.write("a\tb\tc\n")
        proc.stdin.close()
        status, err = proc.wait(120), proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
    lines = err.strip().splitlines()
    assert status == 1 and lines[0].startswith("averaging the last") and lines[-1].startswith("error: stdin:2:"), err


def test_alignment_lines_are_pharaoh_pairs_within_the_sentences(tiny_run):
    """A line of zero-width characters alone (blank once normalised) is answered as an empty line is: it
    ended the whole run with "the source sentence is empty"."""
    given = SENTENCES + "\u200b\u200e\n"
    result = run_cli("translate", str(tiny_run), "--alignment", stdin=given)
    assert result.returncode == 0, result.stderr
    rows = result.stdout.splitlines()
    assert len(rows) == 5 and rows[2] == rows[4] == " ||| "  # the blank lines: no output, no links
    for source, row in zip(given.splitlines(), rows):
        text, links = row.split(" ||| ")
        pairs = [tuple(map(int, p.split("-"))) for p in links.split()]
        assert all(0 <= s < len(source.split()) and 0 <= t < len(text.split()) for s, t in pairs)
        assert len({t for _, t in pairs}) == len(text.split())  # every target word is linked


def test_constraints_appear_in_every_output(tiny_run, tmp_path):
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("Hund\tStrand\n\n\nroten Mantel\n")
    result = run_cli("translate", str(tiny_run), "--constraints", str(constraints), "--beam", "5", "--nbest", "2",
                     stdin=SENTENCES)
    assert result.returncode == 0, result.stderr
    rows = [line.split(" ||| ") for line in result.stdout.splitlines()]
    wanted = {"0": ["Hund", "Strand"], "3": ["roten Mantel"]}
    for i, text, _ in rows:
        assert all(phrase in text for phrase in wanted.get(i, [])), (i, text)
    (tmp_path / "three.txt").write_text("a\n\n\n")
    bad = run_cli("translate", str(tiny_run), "--constraints", str(tmp_path / "three.txt"), stdin=SENTENCES)
    assert bad.returncode == 1 and "--constraints: 3 given, for more input lines (line 4 has none)" in bad.stderr
    (tmp_path / "in.txt").write_text(SENTENCES)  # a file is counted before anything is decoded
    bad = run_cli("translate", str(tiny_run), "--constraints", str(tmp_path / "three.txt"), "--input",
                  str(tmp_path / "in.txt"))
    assert bad.returncode == 1 and bad.stdout == "" and "--constraints: 3 given for 4 input lines" in bad.stderr


# --- which options combine: the pair matrix, generated from the one table (request.REFUSED) ----------

# a run trained 3,000 steps (tests/test_search_reference.py's): its outputs are German sentences
REFERENCE_RUN = Path(__file__).resolve().parent / "data" / "decode_reference"
MATRIX_LINES = {"translate": ["a dog runs on the beach .", "two men are talking on a street ."],
                "parse": ["The dog barked .", "Stocks fell sharply yesterday ."]}
PREFIX = {"translate": "Ein Mann", "parse": "(S (NP"}  # for line 0; line 1 has none
PHRASES = ["Wiese", "Gehweg"]  # one per line, in none of the reference run's own outputs of MATRIX_LINES


def option_args(option: str, run: Path, kind: str, tmp_path: Path) -> list[str]:
    """The flags that give ``option`` (``request.OPTIONS``) to `translate` on ``run``, a ``kind`` run."""
    (tmp_path / "prefix.txt").write_text(f"{PREFIX[kind]}\n\n")
    (tmp_path / "constraints.txt").write_text("".join(p + "\n" for p in PHRASES))
    return {"beam": ["--beam", "3"], "early_stop": ["--early-stop", "top"], "nbest": ["--nbest", "2"],
            "scores": ["--scores"], "alignment": ["--alignment"], "prefix": ["--prefix", str(tmp_path / "prefix.txt")],
            "constraints": ["--constraints", str(tmp_path / "constraints.txt")],
            "sample": ["--sample", "--seed", "3", "--temperature", "0.7"], "int8": ["--int8"], "bf16": ["--bf16"],
            "ensemble": ["--ensemble", str(run)], "parse": [], "device": ["--device", "cuda"]}[option]


def read_rows(out: str, given: set[str]) -> list[tuple[int, str, float | None, str | None]]:
    """`translate`'s output lines as (input line, text, score or None, alignment or None)."""
    rows = []
    for i, line in enumerate(out.splitlines()):
        fields = line.split(" ||| ")
        if "nbest" in given:
            index, text, score, *links = int(fields[0]), fields[1], float(fields[2]), *fields[3:]
        elif "scores" in given:
            (score, text), index, links = fields[0].split("\t"), i, fields[1:]
            score = float(score)
        else:
            index, text, score, links = i, fields[0], None, fields[1:]
        rows.append((index, text, score, links[0] if links else None))
    return rows


def took_effect(option: str, rows: list, call: dict, lines: list[str]) -> bool:
    """Whether ``option`` shows in `translate`'s output ``rows`` or in what reached the decoding driver
    (``call``: the arguments `Translator.decode` gave ``decode.decode_ids``)."""
    from transformer.ensemble import Ensemble
    from transformer.sampling import Sampling
    from transformer.trees import TreeConstraint, delinearize

    kind = "parse" if isinstance(call["constraint"], TreeConstraint) else "translate"
    if option == "beam":
        return call["beam_size"] == 3
    if option == "early_stop":
        return call["early_stop"] == "top"
    if option == "nbest":
        return call["nbest"] == 2 and [i for i, *_ in rows] == [0, 0, 1, 1]
    if option == "scores":
        return all(isinstance(score, float) for _, _, score, _ in rows)
    if option == "alignment":  # every output word linked to a word of its input
        links = [[tuple(map(int, p.split("-"))) for p in (a or "").split()] for *_, a in rows]
        return all({t for _, t in pairs} == set(range(len(text.split())))
                   and all(0 <= s < len(lines[i].split()) for s, _ in pairs)
                   for (i, text, _, _), pairs in zip(rows, links))
    if option == "prefix":
        return all(text.startswith(PREFIX[kind]) for i, text, _, _ in rows if i == 0)
    if option == "constraints":
        return all(PHRASES[i] in text for i, text, _, _ in rows)
    if option == "sample":
        s = call["sampling"]
        return isinstance(s, Sampling) and s.generator.initial_seed() == 3 and s.temperature == 0.7
    if option == "int8":
        return any(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in call["model"].modules())
    if option == "bf16":
        return all(p.dtype == torch.bfloat16 for p in call["model"].parameters())
    if option == "ensemble":
        return isinstance(call["model"], Ensemble) and len(call["model"].models) == 2
    if option == "parse":
        return kind == "parse" and all(delinearize(text.split(), lines[i].split())[1] for i, text, _, _ in rows)
    if option == "device":
        return next(call["model"].parameters()).is_cuda
    raise AssertionError(f"no check for {option}: a new option needs one here")


@pytest.fixture
def engine(monkeypatch) -> list[dict]:
    """What each `Translator.decode` hands the decoding driver (``decode_ids``): model, constraint, options."""
    import transformer.translator

    calls: list[dict] = []
    real = transformer.translator.decode_ids

    def spy(model, sources, **options):
        calls.append({"model": model, **options})
        return real(model, sources, **options)

    monkeypatch.setattr(transformer.translator, "decode_ids", spy)
    return calls


def translate_pair(pair: tuple[str, str], tiny_parse_run: Path, tmp_path: Path, capsys) -> tuple[int, str, str, list]:
    """`transformer translate` with both options of ``pair``, in this process: (exit status, stdout,
    stderr, the input lines)."""
    kind = "parse" if "parse" in pair else "translate"
    run, lines = tiny_parse_run if kind == "parse" else REFERENCE_RUN, MATRIX_LINES[kind]
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in lines))
    args = [a for option in pair for a in option_args(option, run, kind, tmp_path)]
    capsys.readouterr()
    code = main(["translate", str(run), "--input", str(tmp_path / "in.txt"), *args])
    out, err = capsys.readouterr()
    return code, out, err, lines


def matrix(accepted: bool, device: bool) -> list[tuple[str, str]]:
    """The pairs of ``request.OPTIONS`` the table accepts (or refuses), with --device cuda (or without)."""
    from transformer.request import OPTIONS, REFUSED

    refused = {frozenset((a, b)) for a, b, _ in REFUSED}
    return [(a, b) for i, a in enumerate(OPTIONS) for b in OPTIONS[i + 1:]
            if (frozenset((a, b)) not in refused) == accepted and ("device" in (a, b)) == device]


@pytest.mark.parametrize("pair", matrix(accepted=True, device=False), ids="+".join)
def test_each_accepted_pair_of_options_works_and_both_take_effect(pair, tiny_parse_run, tmp_path, capsys, engine):
    """Every pair the table (request.REFUSED) does not refuse decodes, and both of its options show: in
    the output (every output starts with its prefix and holds its line's constraint, n lines per
    input, scores, alignments, trees of the input) or in what reached the search (beam, early stop,
    sampling, the int8 or ensemble model)."""
    code, out, err, lines = translate_pair(pair, tiny_parse_run, tmp_path, capsys)
    assert code == 0, err
    rows = read_rows(out, set(pair))
    assert {i for i, *_ in rows} == {0, 1} and engine
    for option in pair:
        assert took_effect(option, rows, engine[0], lines), (option, out)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_each_accepted_pair_with_a_gpu_works_and_both_take_effect(tiny_parse_run, tmp_path, capsys, engine):
    """As the CPU matrix, for the pairs with --device cuda (one test: one skip on a machine without a GPU)."""
    for pair in matrix(accepted=True, device=True):
        engine.clear()
        code, out, err, lines = translate_pair(pair, tiny_parse_run, tmp_path, capsys)
        assert code == 0, (pair, err)
        rows = read_rows(out, set(pair))
        assert all(took_effect(option, rows, engine[0], lines) for option in pair), (pair, out)


@pytest.mark.parametrize("pair", matrix(accepted=False, device=False) + matrix(accepted=False, device=True),
                         ids="+".join)
def test_each_refused_pair_of_options_gives_its_one_line_before_decoding(pair, tiny_parse_run, tmp_path, capsys,
                                                                         engine):
    from transformer.request import CLI, REFUSED

    (a, b, why), = [r for r in REFUSED if {r[0], r[1]} == set(pair)]
    code, out, err, _ = translate_pair(pair, tiny_parse_run, tmp_path, capsys)
    assert code == 1 and out == "" and not engine, err
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {CLI[a]} with {CLI[b]}") and why in err, err


def test_serve_takes_the_tables_ensemble_as_translate_does(tmp_path, capsys, monkeypatch):
    """The table (docs/decoding.md) is the server's too, its --ensemble column included, but `serve` had no
    --ensemble: no accepted pair with it worked there, and alignment with it was not refused in its one line."""
    import socket

    import uvicorn

    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    answers = []

    def served(self, sockets=None) -> None:  # the app `serve` built, asked in-process instead of listening
        with TestClient(self.config.app) as c:
            for body in ({"beam": 3, "nbest": 2}, {"alignment": True}):
                answers.append(c.post("/v1/translate", json={"text": MATRIX_LINES["translate"], **body}))
            answers.append(c.post("/v1/attention", json={"text": MATRIX_LINES["translate"][0]}))
            answers.append(c.get("/health"))
            answers.append(c.get("/"))

    monkeypatch.setattr(uvicorn.Server, "run", served)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = str(REFERENCE_RUN)
    assert main(["serve", run, "--ensemble", run, "--port", str(port)]) == 0, capsys.readouterr().err
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in MATRIX_LINES["translate"]))
    capsys.readouterr()
    assert main(["translate", run, "--ensemble", run, "--beam", "3", "--nbest", "2",
                 "--input", str(tmp_path / "in.txt")]) == 0
    nbest, refused, attention, health, page = answers
    # the page asked for the attention after each translation, and showed the refusal as an error each time
    assert 'id="attention" data-drawn="false"' in page.text and 'attention.dataset.drawn === "true"' in page.text
    # which weights the other run gave (it named the first run's alone)
    assert health.json()["ensemble"] == [{"run": REFERENCE_RUN.name, "weights": health.json()["weights"]}]
    assert nbest.status_code == 200 and capsys.readouterr().out == "".join(
        f"{i} ||| {h['text']} ||| {h['score']:.6f}\n" for i, hyps in enumerate(nbest.json()["nbest"]) for h in hyps)
    assert refused.status_code == 422 and refused.json()["error"] == (
        "alignment with --ensemble: an ensemble has no one attention to align with")
    assert attention.status_code == 422 and "an ensemble has no one attention" in attention.json()["error"]


def test_a_parse_prefix_that_cannot_start_a_tree_exits_1_with_one_line(tiny_parse_run, tmp_path):
    (tmp_path / "prefix.txt").write_text("The dog\n")
    result = run_cli("translate", str(tiny_parse_run), "--prefix", str(tmp_path / "prefix.txt"),
                     stdin="The dog barked .\n")
    assert result.returncode == 1 and result.stdout == "", result.stderr
    said = [line for line in result.stderr.splitlines() if not line.startswith("averaging the last")]
    assert said == ["error: --prefix line 1 on a parsing run: its piece 1, 'The', cannot continue a tree of the "
                    "input (a tree starts with an opening bracket, holds the input's words in order, closes what it "
                    "opens, and fits the length limit)"]


def test_parse_takes_an_ensemble_as_evaluate_does(tiny_parse_run, tiny_run, tmp_path, capsys, engine):
    """`evaluate --ensemble` scored a parsing run's ensemble, and `parse` had no --ensemble to write its trees."""
    from transformer.ensemble import Ensemble
    from transformer.trees import read_trees

    (tmp_path / "words").write_text("The dog barked .\nIt rains .\n")
    status, out, err = run_here(capsys, "parse", str(tiny_parse_run), "--ensemble", str(tiny_parse_run),
                                "--input", str(tmp_path / "words"))
    assert status == 0 and isinstance(engine[-1]["model"], Ensemble), err
    (tmp_path / "trees").write_text(out)
    assert [t.words() for t in read_trees(tmp_path / "trees")] == [["The", "dog", "barked", "."], ["It", "rains", "."]]
    status, out, err = run_here(capsys, "parse", str(tiny_parse_run), "--ensemble", str(tiny_run),
                                "--input", str(tmp_path / "words"))
    assert (status, out) == (1, "") and f"--ensemble {tiny_run}: trained with another vocabulary" in err, err


def test_a_parse_keeps_the_tree_the_beam_wrote_around_words_of_unknown_characters(tiny_parse_run, tmp_path, capsys):
    """Read back from text, an unknown character stood apart ("Zo\u00eb" came back as "Zo \u2047"): the words no
    longer lined up with the input's, and the tree the constrained beam wrote was "repaired", its words moved
    into other constituents and its brackets dropped."""
    from transformer.trees import PLACEHOLDER, linearize, parse_brackets

    lines = ["Zo\u00eb \u00f1 \u00d8yvind .", "The dog ( \u0416uk ) barked .", "I don\u00b4t know ."]
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in lines))
    assert main(["translate", str(tiny_parse_run), "--input", str(tmp_path / "in.txt"), "--threads", "1"]) == 0
    written = capsys.readouterr().out.splitlines()
    assert main(["parse", str(tiny_parse_run), "--input", str(tmp_path / "in.txt"), "--threads", "1"]) == 0
    trees = [parse_brackets(line)[0] for line in capsys.readouterr().out.splitlines()]
    for line, tree, raw in zip(lines, trees, written, strict=True):
        assert tree.words() == line.replace("(", "-LRB-").replace(")", "-RRB-").split()
        if "\u00b4" not in line:  # "don\u00b4t" the model writes as two words, whose leaves are merged
            shape = [t if t[0] in "()" else PLACEHOLDER for t in raw.split()]  # the beam's tree, one token a word
            assert linearize(tree) == shape, (raw, str(tree))
    # each output of the constrained beam is a well-formed tree of its input, read as the model wrote it
    from transformer.translator import Translator

    assert [ok for _, ok in Translator(tiny_parse_run, log=lambda m: None).trees(lines, written)] == [True] * 3


def test_a_blank_line_parses_to_an_empty_line_and_evaluate_names_it(tiny_parse_run, tmp_path, capsys):
    """parse wrote the word None for a blank line (no scorer reads it), and evaluate, given a blank --src line
    beside a gold tree, blamed --ref: "tree 2: the test tree is empty once normalised"."""
    lines = ["The dog barked .", "", "   ", "A cat .", "\u200b"]  # zero-width: "(S (XX \u200b))", an invisible leaf
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in lines))
    for unconstrained in ([], ["--unconstrained"]):
        assert main(["parse", str(tiny_parse_run), "--input", str(tmp_path / "in.txt"), "--beam", "2",
                     "--threads", "1", *unconstrained]) == 0
        out = capsys.readouterr().out.split("\n")
        assert len(out) == 6 and out[1] == out[2] == out[4] == out[5] == "" and out[0].startswith("("), out
    (tmp_path / "gold").write_text("(S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .))\n"
                                   "(S (NP (DT A) (NN cat)) (. .))\n")
    (tmp_path / "words").write_text("The dog barked .\n\n")
    status, out, err = run_here(capsys, "evaluate", str(tiny_parse_run), "--src", str(tmp_path / "words"),
                                "--ref", str(tmp_path / "gold"), "--beam", "2")
    assert (status, out) == (1, ""), err
    assert err == (f"error: --src {tmp_path / 'words'}:2: a blank line, where --ref {tmp_path / 'gold'}'s tree 2 "
                   "holds words (the sentences and the trees go one to one)\n")
    # the reverse, found after decoding every line: "--ref: tree 2: the gold tree is empty once normalised"
    (tmp_path / "gold").write_text("(S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .))\n( (S (-NONE- *T*-1)) )\n")
    (tmp_path / "words").write_text("The dog barked .\nsomething\n")
    status, out, err = run_here(capsys, "evaluate", str(tiny_parse_run), "--src", str(tmp_path / "words"),
                                "--ref", str(tmp_path / "gold"), "--beam", "2")
    assert (status, out) == (1, "") and err.startswith(f"error: --src {tmp_path / 'words'}:2: a sentence, where --ref "
                                                       f"{tmp_path / 'gold'}'s tree 2 holds no words"), err


def test_evaluate_names_a_src_line_whose_words_are_not_the_gold_trees(tiny_parse_run, tmp_path, capsys):
    """A --src line with other words than its gold tree was found after decoding every line, and the error named
    --ref ("tree 2: the test tree's words differ from the gold tree's")."""
    (tmp_path / "gold").write_text("(S (NN x) (NN y))\n(S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .))\n"
                                   "(S (NN a) (-LRB- -LRB-) (NN b) (-RRB- -RRB-))\n")
    (tmp_path / "words").write_text("x y\nThe cat barked .\na ( b )\n")  # brackets: escaped as the model reads them
    status, out, err = run_here(capsys, "evaluate", str(tiny_parse_run), "--src", str(tmp_path / "words"),
                                "--ref", str(tmp_path / "gold"), "--beam", "2")
    assert (status, out) == (1, ""), err
    assert err == (f"error: --src {tmp_path / 'words'}:2: its words differ from --ref {tmp_path / 'gold'}'s tree 2 "
                   "from word 2 (cat barked . vs dog barked .; the sentences and the trees go one to one, in the "
                   "treebank's tokens)\n")
    (tmp_path / "words").write_text("x y\nThe dog barked\na ( b )\n")  # one word short
    status, out, err = run_here(capsys, "evaluate", str(tiny_parse_run), "--src", str(tmp_path / "words"),
                                "--ref", str(tmp_path / "gold"), "--beam", "2")
    assert status == 1 and "tree 2 from word 4 (the line ends vs .;" in err, err


def test_evaluate_parse_reads_parses_blank_lines_as_the_trees_of_blank_inputs(tmp_path, capsys):
    """parse writes a blank input line's tree as an empty line; evaluate-parse read the trees alone and said the
    files differ in length, where evaluate skips the pair (its gold tree being traces alone)."""
    (tmp_path / "g.mrg").write_text("( (S (NN x) (NN y)) )\n( (-NONE- *T*) )\n( (S (NN z) (. .)) )\n")
    (tmp_path / "t.mrg").write_text("(S (XX x) (XX y))\n\n(S (XX z) (XX .))\n")
    status, out, err = run_here(capsys, "evaluate-parse", "--gold", str(tmp_path / "g.mrg"),
                                "--test", str(tmp_path / "t.mrg"), "--json")
    assert status == 0, err
    assert (json.loads(out)["sentences"], json.loads(out)["skipped_empty"], json.loads(out)["f1"]) == (2, 1, 100.0)
    (tmp_path / "g.mrg").write_text("( (S (NN x) (NN y)) )\n( (S (NN w)) )\n( (S (NN z) (. .)) )\n")
    status, out, err = run_here(capsys, "evaluate-parse", "--gold", str(tmp_path / "g.mrg"),
                                "--test", str(tmp_path / "t.mrg"))
    assert (status, out) == (1, "") and ("tree 2: the test tree is empty (a blank line, or traces alone), where the "
                                         "gold tree has words") in err, err  # it said "empty once normalised"
    (tmp_path / "t.mrg").write_text("(S (XX x) (XX y))\n\n")  # a parse killed after two lines: a file cut short
    status, out, err = run_here(capsys, "evaluate-parse", "--gold", str(tmp_path / "g.mrg"),
                                "--test", str(tmp_path / "t.mrg"))
    assert (status, out) == (1, "") and err.endswith(f"has 3 trees but --test {tmp_path / 't.mrg'} has 1\n"), err
    for option, missing in (("--gold", "--test"), ("--test", "--gold")):  # which option gave it: it named the file
        given = {option: str(tmp_path / "nope.mrg"), missing: str(tmp_path / "g.mrg")}
        status, out, err = run_here(capsys, "evaluate-parse", *itertools.chain(*given.items()))
        assert (status, out) == (1, "") and f"error: {option} {tmp_path / 'nope.mrg'}: cannot read" in err, err
    # gold trees of traces alone: scored, it was "F1 = 0.00", 0 sentences, with status 0
    (tmp_path / "g.mrg").write_text("( (S (NP-SBJ (-NONE- *-1)) ) )\n( (-NONE- *T*) )\n")
    status, out, err = run_here(capsys, "evaluate-parse", "--gold", str(tmp_path / "g.mrg"), "--test",
                                str(tmp_path / "g.mrg"), "--json")
    assert (status, out) == (1, "") and err.endswith(f"error: --gold {tmp_path / 'g.mrg'}: no tree with a word once "
                                                     "traces are removed (2 trees empty or of traces alone): nothing "
                                                     "to score\n"), err
    (tmp_path / "g.mrg").write_text("( (S (NN x)) )\n")
    (tmp_path / "t.mrg").write_text("(S (XX x))\n")
    status, out, err = run_here(capsys, "evaluate-parse", "--gold", str(tmp_path / "g.mrg"),
                                "--test", str(tmp_path / "t.mrg"))
    assert status == 0 and "1 sentence (EVALB" in out, out


def test_evaluate_json_counts_the_trees_it_scored_as_its_report_does(tiny_parse_run, tmp_path, capsys):
    """A blank line beside a gold tree that is empty once normalised is skipped: the report said 1 sentence, the
    JSON 2 (the input's lines)."""
    (tmp_path / "gold").write_text("(S (NN x) (NN y))\n( (-NONE- *T*) )\n")
    (tmp_path / "words").write_text("x y\n\n")
    status, out, err = run_here(capsys, "evaluate", str(tiny_parse_run), "--src", str(tmp_path / "words"),
                                "--ref", str(tmp_path / "gold"), "--beam", "2", "--json", "-")
    assert status == 0 and "1 sentence;" in err, err
    assert (json.loads(out)["sentences"], json.loads(out)["skipped_empty"]) == (1, 1)


def test_evaluate_refuses_what_does_not_score_the_run(tiny_run, tiny_parse_run, tmp_path, capsys):
    """--src alone was scored against the run's own test references (BLEU 0.61, one line on stderr said so);
    a parsing run's evaluate ignored BLEU's options (--tok-ref, --paper-bleu, --lang) without a word."""
    (tmp_path / "words").write_text("The dog barked .\n")
    (tmp_path / "gold").write_text("(S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .))\n")
    for given, missing in (("--src", "--ref"), ("--ref", "--src")):
        status, out, err = run_here(capsys, "evaluate", str(tiny_run), given, str(tmp_path / "words"))
        assert (status, out) == (1, "") and err == (f"error: {given} without {missing}: give both, or neither for the "
                                                    "run's own test set (data.test_src and data.test_tgt)\n"), err
    files = ["--src", str(tmp_path / "words"), "--ref", str(tmp_path / "gold")]
    for extra, named in ((["--tok-ref", str(tmp_path / "words")], "--tok-ref"), (["--paper-bleu"], "--paper-bleu"),
                         (["--lang", "en", "--pretokenized"], "--pretokenized, --lang")):
        status, out, err = run_here(capsys, "evaluate", str(tiny_parse_run), *files, *extra)
        assert (status, out) == (1, "") and err == (f"error: {named}: BLEU's, and {tiny_parse_run} is a parsing run, "
                                                    "whose trees are scored by F1 against --ref's gold trees\n"), err


def test_evaluating_a_parsing_run_against_linearised_targets_says_what_ref_takes(tiny_parse_run, tmp_path, capsys):
    """--ref test.wlin (the model's linearised targets) said only "word 'S' outside any bracket"; the hint is for
    such a file alone (every bad --ref was told it)."""
    (tmp_path / "test.words").write_text("The dog barked .\n")
    (tmp_path / "test.wlin").write_text("S (NP XX XX )NP (VP XX )VP XX )S\n")
    status, out, err = run_here(capsys, "evaluate", str(tiny_parse_run), "--src", str(tmp_path / "test.words"),
                                "--ref", str(tmp_path / "test.wlin"))
    assert (status, out) == (1, "") and err.count("\n") == 1, err
    assert "outside any bracket" in err and "(linearised trees, closed as \")NP\": give them bracketed as" in err
    (tmp_path / "test.gold").write_text("(S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .)\n")  # one ")" short
    status, out, err = run_here(capsys, "evaluate", str(tiny_parse_run), "--src", str(tmp_path / "test.words"),
                                "--ref", str(tmp_path / "test.gold"))
    assert (status, out) == (1, "") and err.count("\n") == 1 and "linearised" not in err, err  # not a .wlin's


def test_the_smallest_temperature_samples_the_greedy_output(tmp_path, capsys):
    """A tiny --temperature overflowed every logit to -inf and the draw to NaN before; now each draw is
    the most probable token: greedy search."""
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in MATRIX_LINES["translate"]))
    outputs = []
    for args in (["--beam", "1"], ["--sample", "--temperature", "1.2e-38"]):
        assert main(["translate", str(REFERENCE_RUN), "--input", str(tmp_path / "in.txt"), "--scores", *args]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and outputs[0].count("\n") == 2


def test_the_decoding_commands_the_pages_show_are_taken(monkeypatch):
    """Each `transformer translate|evaluate|parse ...` example in the README and docs/ (not the synopses
    in brackets) parses, and its options combine (request.REFUSED): a user who copies it is not refused."""
    import re
    import shlex

    import transformer.data

    monkeypatch.setattr(transformer.data, "read_lines", lambda path: [])  # the examples' prefix files are not here
    root = Path(__file__).parents[1]
    shown = [(page.name, line) for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]
             for line in page.read_text().splitlines()
             if re.match(r"(echo .*\| )?transformer (translate|evaluate|parse) ", line) and "[" not in line]
    assert len(shown) >= 5, shown
    for page, line in shown:
        argv = shlex.split(line.split("| ")[-1], comments=True)[1:]
        try:
            cli._request(cli.build_parser().parse_args(argv)).verify()
        except ConfigError as e:
            pytest.fail(f"{page}: {line}: {e}")


def test_evaluate_of_an_empty_source_is_one_line(tiny_run, tmp_path, capsys):
    """An empty --src with an empty --ref ended in "internal error: IndexError" inside sacreBLEU."""
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    status, out, err = run_here(capsys, "evaluate", str(tiny_run), "--src", str(empty), "--ref", str(empty))
    assert status == 1 and f"--src {empty}: no sentences to evaluate" in err and "internal" not in err, err


def test_score_perplexity_leaves_out_empty_sources(tiny_run, tmp_path, capsys):
    """An empty pair scores 0 (as translate scores an empty line), but it counted as one certain piece in the
    corpus perplexity, which blank lines then lowered (9.3 against 14.5 in a user's walk)."""
    def perplexity(src: str, tgt: str) -> str:
        (tmp_path / "src").write_text(src)
        (tmp_path / "tgt").write_text(tgt)
        status, out, err = run_here(capsys, "score", str(tiny_run), "--src", str(tmp_path / "src"),
                                    "--tgt", str(tmp_path / "tgt"))
        assert status == 0, err
        return err.strip().splitlines()[-1]

    alone = perplexity("A dog runs.\n", "Ein Hund läuft.\n")
    with_empty = perplexity("A dog runs.\n\n", "Ein Hund läuft.\n\n")
    assert alone.startswith("1 pair, ") and with_empty.startswith("2 pairs (1 with an empty source, left out)")
    assert with_empty.split("), ", 1)[1] == alone.split(", ", 1)[1]  # the same pieces and perplexity
    assert perplexity("\n", "\n").endswith("0 pieces (EOS included): no perplexity")
    # a source of zero-width spaces is blank once normalised, as an empty one: it counted as a sentence
    zero_width = perplexity("A dog runs.\n\u200b\u200b\n", "Ein Hund läuft.\n\u200b\n")
    assert zero_width == with_empty
    assert perplexity("", "") == "0 pairs: nothing to score (the input is empty)"  # it said nothing


def test_score_notes_characters_scored_as_unknown(tiny_run, tmp_path, capsys):
    """A character without a piece was scored as the unknown piece without a word (and --json's tokens show it as
    written): said once, with the number of pairs."""
    (tmp_path / "src").write_text("A dog ☃.\nA cat.\nA dog.\n")
    (tmp_path / "tgt").write_text("Ein Hund.\nEine 漢 Katze ☃.\nEin Hund.\n")
    status, out, err = run_here(capsys, "score", str(tiny_run), "--src", str(tmp_path / "src"),
                                "--tgt", str(tmp_path / "tgt"))
    assert status == 0 and len(out.splitlines()) == 3
    assert err.splitlines()[-1] == ("note: 2 pairs hold characters the model's vocabulary has no piece for ('☃', "
                                    "'漢'): the model reads each as its unknown piece")
    status, out, err = run_here(capsys, "score", str(tiny_run), "--src", str(tmp_path / "src"),
                                "--tgt", str(tmp_path / "src"))
    assert "note:" in err
    (tmp_path / "src").write_text("A dog.\n")
    status, out, err = run_here(capsys, "score", str(tiny_run), "--src", str(tmp_path / "src"),
                                "--tgt", str(tmp_path / "src"))
    assert status == 0 and "note:" not in err


@pytest.mark.parametrize("tgt_lang", ['"fr"', '"fra"', None], ids=["fr", "fra", "recipe-de"])
def test_evaluate_refuses_a_kept_test_set_in_another_language(tmp_path, tiny_overrides, multi30k, capsys, tgt_lang):
    """The README's own-data command moves a German recipe to French with --set but keeps its test set: evaluate
    without files scored French outputs against German references (BLEU 0.00, exit 0). So it did where
    data.tgt_lang was a three-letter code ("fra") or left at the recipe's "de": the training files' names
    say the run's language."""
    from transformer.config import load_config
    from transformer.train import train

    import shutil

    french = []  # the user's own target files, named as French (their text does not matter here)
    for split in ("train", "valid"):
        german = next(o for o in tiny_overrides if o.startswith(f"data.{split}_tgt=")).split("=", 1)[1].strip('"')
        shutil.copy(german, tmp_path / f"{split}.fr")
        french.append(f'data.{split}_tgt="{tmp_path / f"{split}.fr"}"')
    test = [f'data.test_src="{multi30k}/test_2016_flickr.en.gz"', f'data.test_tgt="{multi30k}/test_2016_flickr.de.gz"']
    lang = [] if tgt_lang is None else [f"data.tgt_lang={tgt_lang}"]
    train(load_config("tiny", tiny_overrides + french + test + lang + ["train.max_steps=1"]), tmp_path / "run",
          quiet=True)
    status, out, err = run_here(capsys, "evaluate", str(tmp_path / "run"))
    assert status == 1 and out == "", err
    assert err.startswith(f"error: --ref not given, and the run's data.test_tgt {multi30k}/test_2016_flickr.de.gz is in "
                          f"'de' where its data.train_tgt {tmp_path / 'train.fr'} is in 'fr'"), err
    if tgt_lang is None:  # the test set moved, the tokenized reference kept: the option was named "--tok_ref"
        test = [f'data.test_{side}="{multi30k}/test_2016_flickr.{lang}.gz"'
                for side, lang in (("src", "en"), ("tgt", "fr"))]
        test.append(f'data.test_tok_ref="{multi30k}/tok/test_2016_flickr.lc.norm.tok.de.gz"')
        train(load_config("tiny", tiny_overrides + french + test + ["train.max_steps=1"]), tmp_path / "tok",
              quiet=True)
        status, out, err = run_here(capsys, "evaluate", str(tmp_path / "tok"))
        said = f"error: --tok-ref not given, and the run's data.test_tok_ref {multi30k}/tok/test_2016_flickr"
        assert (status, out) == (1, "") and err.startswith(said), err


def test_evaluate_says_a_training_files_name_chose_the_language_over_tgt_lang(tmp_path, tiny_overrides, capsys):
    """A run of train.jp with data.tgt_lang "ja" was scored as 'jp' text (13a, where sacreBLEU's ja tokenizer
    splits Japanese, written without spaces), said in train.log alone."""
    from transformer.config import load_config
    from transformer.train import train

    train(load_config("tiny", tiny_overrides + ['data.tgt_lang="ja"', "train.max_steps=1"]), tmp_path / "run",
          quiet=True)  # its training files end in .de
    (tmp_path / "src.txt").write_text("A dog runs.\n")
    (tmp_path / "ref.txt").write_text("Ein Hund rennt.\n")
    given = ["evaluate", str(tmp_path / "run"), "--src", str(tmp_path / "src.txt"), "--ref", str(tmp_path / "ref.txt")]
    status, _, err = run_here(capsys, *given)
    assert status == 0 and ("note: scored as 'de' text, the language its file names end in, and the run's "
                            "data.tgt_lang is 'ja' (--lang sets which") in err, err
    status, _, err = run_here(capsys, *given, "--lang", "de")  # said: no note
    assert status == 0 and "note: scored as" not in err, err
    # a three-letter code may be the file's language ('deu' is 'de'): it was noted as another
    train(load_config("tiny", tiny_overrides + ['data.tgt_lang="deu"', "train.max_steps=1"]), tmp_path / "deu",
          quiet=True)
    status, _, err = run_here(capsys, "evaluate", str(tmp_path / "deu"), *given[2:])
    assert status == 0 and "note: scored as" not in err, err


def test_evaluate_does_not_write_over_the_test_set_its_run_names(tmp_path, tiny_overrides, capsys):
    """`evaluate RUN --hyp-out F` (or --json F) where F is the run's own data.test_tgt or test_src wrote over it
    without a word (the same files given as --src/--ref were refused), and every later evaluate scored that."""
    from transformer.config import load_config
    from transformer.train import train

    for side, text in (("en", "A dog runs.\n"), ("de", "Ein Hund rennt.\n")):
        (tmp_path / f"test.{side}").write_text(text)
    test = [f'data.test_src="{tmp_path / "test.en"}"', f'data.test_tgt="{tmp_path / "test.de"}"',
            'data.test_tok_ref=""']
    train(load_config("tiny", tiny_overrides + test + ["train.max_steps=1"]), tmp_path / "run", quiet=True)
    for option, name, field in (("--hyp-out", "test.de", "test_tgt"), ("--json", "test.en", "test_src")):
        status, out, err = run_here(capsys, "evaluate", str(tmp_path / "run"), option, str(tmp_path / name))
        path = tmp_path / name
        said = f"error: {option} {path}: is the run's data.{field} {path}, which the command reads"
        assert (status, out) == (1, "") and said in err, err  # not "--ref", an option the user never gave
    assert [(tmp_path / f"test.{side}").read_text() for side in ("en", "de")] == ["A dog runs.\n", "Ein Hund rennt.\n"]


def test_evaluate_names_the_option_of_a_file_not_found(tiny_run, tmp_path, capsys):
    """evaluate said "data file not found: PATH" where translate and score name their option: which of --src,
    --ref and --tok-ref was it?"""
    (tmp_path / "src").write_text("A dog runs.\n")
    (tmp_path / "ref").write_text("Ein Hund läuft.\n")
    given = {"--src": str(tmp_path / "src"), "--ref": str(tmp_path / "ref"), "--tok-ref": str(tmp_path / "ref")}
    for option in given:
        args = [a for k, v in (given | {option: str(tmp_path / "missing")}).items() for a in (k, v)]
        status, out, err = run_here(capsys, "evaluate", str(tiny_run), *args, "--lang", "de")
        assert status == 1 and out == "", err
        assert err == f"error: {option}: data file not found: {tmp_path / 'missing'}\n"


def test_evaluate_json_names_stdin_as_such_and_a_reference_of_another_language_is_said(tiny_run, tmp_path):
    """--ref - was recorded as "/proc/18164/fd/pipe:[234546]"; a French reference for a German-writing run was
    scored, and tokenized by French rules, without a word."""
    (tmp_path / "src.en").write_text("A dog runs.\n")
    (tmp_path / "ref.fr").write_text("Un chien court.\n")
    result = run_cli("evaluate", str(tiny_run), "--src", str(tmp_path / "src.en"), "--ref", "-", "--beam", "1",
                     "--json", str(tmp_path / "s.json"), stdin="Ein Hund läuft.\n")
    assert result.returncode == 0, result.stderr
    scores = json.loads((tmp_path / "s.json").read_text())
    assert scores["ref"] == "-" and "ref_sha256" not in scores and len(scores["src_sha256"]) == 64
    result = run_cli("evaluate", str(tiny_run), "--src", str(tmp_path / "src.en"), "--ref", str(tmp_path / "ref.fr"),
                     "--beam", "1")
    assert result.returncode == 0, result.stderr
    assert f"note: --ref {tmp_path / 'ref.fr'} says 'fr', and {tiny_run} translates into 'de'" in result.stderr


def test_evaluate_json_names_an_ensembles_weights(tiny_run, tmp_path, capsys):
    """evaluate --json of an --ensemble named the first run's weights alone: its scores read as one model's."""
    (tmp_path / "src").write_text("A dog runs.\n")
    (tmp_path / "ref").write_text("Ein Hund läuft.\n")
    status, _, err = run_here(capsys, "evaluate", str(tiny_run), "--src", str(tmp_path / "src"), "--ref",
                              str(tmp_path / "ref"), "--beam", "1", "--ensemble", str(tiny_run), "--json",
                              str(tmp_path / "s.json"))
    assert status == 0, err
    scores = json.loads((tmp_path / "s.json").read_text())
    assert scores["ensemble"] == [{"run": str(tiny_run.resolve()), "averaged": scores["averaged"],
                                   "averaged_sha256": scores["averaged_sha256"]}]  # the members' files pinned too
    assert "checkpoint_step" not in scores  # an average's files name their steps
    # given the optimizer state's file of a checkpoint, the weights read are its record's weights file
    state = sorted((tiny_run / "checkpoints").glob("*.state.safetensors"))[-1]
    status, _, err = run_here(capsys, "evaluate", str(tiny_run), "--src", str(tmp_path / "src"), "--ref",
                              str(tmp_path / "ref"), "--beam", "1", "--json", str(tmp_path / "s.json"),
                              "--checkpoint", str(state))
    scores = json.loads((tmp_path / "s.json").read_text())
    assert status == 0 and "ensemble" not in scores, err
    assert scores["checkpoint"] == str(state.with_name(state.name.replace(".state", "")).resolve())
    # and which weights those were, as best.safetensors, rewritten as a run goes on, cannot say by its name
    record = json.loads(state.with_name(state.name.replace(".state.safetensors", ".json")).read_text())
    assert (scores["checkpoint_step"], scores["checkpoint_sha256"]) == (record["step"],
                                                                        record["files"]["weights"]["sha256"])
    # a file of `average`'s has no one step (null): the checkpoints it is the mean of are named
    assert main(["average", str(tiny_run), "--last", "2", "--out", str(tmp_path / "avg.safetensors")]) == 0
    status, _, err = run_here(capsys, "evaluate", str(tiny_run), "--src", str(tmp_path / "src"), "--ref",
                              str(tmp_path / "ref"), "--beam", "1", "--json", str(tmp_path / "s.json"),
                              "--checkpoint", str(tmp_path / "avg.safetensors"))
    scores = json.loads((tmp_path / "s.json").read_text())
    assert status == 0 and scores["checkpoint_step"] is None, err
    # whole, as a run's own average's are (the record's bare names said nothing of which run)
    assert scores["checkpoint_averaged"] == [str(p) for p in sorted((tiny_run.resolve() / "checkpoints").glob(
        "step_*.json"))][-2:] != [], scores


def test_average_refuses_a_record_that_translate_refuses(tiny_run, tmp_path, capsys):
    """A record edited by hand (model.n_heads, so its model_hash is another's; or decode.average_last = 0) was
    averaged, exit 0, with a false reason for averaging fewer ("of another model (a resume with a model change)"),
    and the file written was refused by translate, as the run itself was. Both refuse it, naming the record."""
    import shutil

    for section, key, value, said in (("model", "n_heads", 1, "its model config (hash "),
                                      ("decode", "average_last", 0, "its config: decode.average_last")):
        run = tmp_path / key
        shutil.copytree(tiny_run, run)
        record = sorted((run / "checkpoints").glob("step_*.json"))[-1]
        meta = json.loads(record.read_text())
        meta["config"][section][key] = value
        record.write_text(json.dumps(meta))
        for command in (["average", str(run), "--last", "2", "--out", str(tmp_path / f"{key}.safetensors")],
                        ["translate", str(run)]):
            status, out, err = run_here(capsys, *command)
            assert (status, out) == (1, "") and f"{record}: {said}" in err, err
        assert not (tmp_path / f"{key}.safetensors").exists()


def test_evaluate_warns_of_a_language_moses_has_no_rules_for(tiny_run, tmp_path, capsys):
    """A mistyped --lang ("dee") was taken without a word, and Moses tokenized the outputs with its defaults
    (English abbreviations): the tokenized scores changed silently. It is scored so, after a warning."""
    (tmp_path / "src").write_text("A dog runs.\nTwo men talk.\n")
    (tmp_path / "ref").write_text("Ein Hund läuft.\nZwei Männer reden.\n")
    (tmp_path / "tok").write_text("ein hund läuft .\nzwei männer reden .\n")
    files = ["--src", str(tmp_path / "src"), "--ref", str(tmp_path / "ref"), "--tok-ref", str(tmp_path / "tok"),
             "--beam", "1"]
    status, out, err = run_here(capsys, "evaluate", str(tiny_run), *files, "--lang", "dee")
    assert status == 0 and "tokenized lowercased BLEU" in out, err
    assert "warning: Moses has no rules for language 'dee'" in err and "capital letters" not in err
    for lang in ("de", "de-DE"):  # a tag's first subtag: Moses took English rules for "pt-BR"
        status, out, err = run_here(capsys, "evaluate", str(tiny_run), *files, "--lang", lang)
        assert status == 0 and "warning" not in err, err
    for lang in ("", "de de"):  # "" was taken for no --lang, "de de" scored as a language of that name
        status, out, err = run_here(capsys, "evaluate", str(tiny_run), *files, "--lang", lang)
        assert status == 2 and f"--lang: {lang!r}: not a language tag" in err, err
    # the detokenized cased reference given as --tok-ref: it scored near 0 against lowercased outputs, unsaid
    status, out, err = run_here(capsys, "evaluate", str(tiny_run), *files[:4], "--tok-ref", str(tmp_path / "ref"),
                                "--beam", "1")
    assert status == 0 and (f"note: --tok-ref {tmp_path / 'ref'}: 2 of its 2 lines hold capital letters, which a "
                            "lowercased reference has not") in err, err


def test_a_long_decode_into_a_log_says_it_is_under_way(tiny_run, tmp_path, capsys, monkeypatch):
    """stderr into a file (nohup, a batch job): no progress bar, so evaluate said nothing until its scores, and
    a parsing run's minutes of decoding looked hung. It now says what it decodes first (here a "long" input is
    more than 2 lines, not 100, to keep the test short)."""
    monkeypatch.setattr(cli, "BAR_LINES", 2)
    src, ref = tmp_path / "src.en", tmp_path / "ref.de"
    src.write_text("A dog runs.\nTwo men talk.\nA girl sings.\n")
    ref.write_text("Ein Hund läuft.\nZwei Männer reden.\nEin Mädchen singt.\n")
    status, out, err = run_here(capsys, "evaluate", str(tiny_run), "--src", str(src), "--ref", str(ref), "--beam", "1")
    assert status == 0 and "BLEU = " in out
    assert "decoding 3 sentences (no progress bar: stderr is not a terminal)" in err.splitlines(), err
    status, out, err = run_here(capsys, "translate", str(tiny_run), "--input", str(src), "--beam", "1")  # so too
    assert status == 0 and len(out.splitlines()) == 3
    assert "decoding 3 sentences (no progress bar: stderr is not a terminal)" in err.splitlines(), err


def test_training_draws_its_progress_bar_at_a_terminal_only(tmp_path, tiny_overrides, capsys):
    """stderr into a file (nohup, a batch job's log): the bar's redraws, a carriage return and a line's worth of
    bytes each second of the run, filled the log between its lines (decoding draws none there already). The
    log lines still come, on stdout."""
    sets = [a for o in tiny_overrides + ["train.max_steps=4", "train.log_every=2"] for a in ("--set", o)]
    status, out, err = run_here(capsys, "train", "tiny", "--out", str(tmp_path / "run"), *sets)
    assert status == 0 and "step=2 " in out and "step=4 " in out, out
    assert "%|" not in err and "\r" not in err, err


def test_train_log_lines_reach_a_pipe_as_they_are_said(tmp_path, tiny_overrides):
    """Under nohup, `| tee` or a batch system, stdout is a pipe or a file: each log line reaches it when it is
    said, not in one block when the process ends (tqdm.write does not flush). Run without PYTHONUNBUFFERED,
    as users run it: the first step's line arrives while training goes on (buffered, it came with some 50 more,
    when 8 KiB had gathered), and SIGTERM then stops it."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    sets = [a for o in tiny_overrides + ["train.max_steps=100000", "train.log_every=2", "train.eval_every=1000"]
            for a in ("--set", o)]
    proc = subprocess.Popen([sys.executable, "-m", "transformer", "train", "tiny", "--out", str(tmp_path / "run"),
                             *sets], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        first = next(line for line in proc.stdout if line.startswith("step="))
        logged = (tmp_path / "run" / "train.log").read_text().count(" step=")
        assert first.startswith("step=2 ") and logged < 25, f"step=2 came when train.log had {logged} step lines"
    finally:
        proc.terminate()
        proc.communicate(timeout=120)


def test_the_search_options_cite_the_papers_values_for_their_task():
    """parse's --beam, --alpha and --max-len-offset cited §6.1's translation values (4, 0.6, 50); a parsing run
    decodes with §6.3's (beam 21, α 0.3, input + 300: the parse preset's). And the help is built without torch,
    which a config's validation would import (a second for `--help`)."""
    code = ("import sys; from transformer import cli; p = cli.build_parser(); "
            "print('torch' in sys.modules); p.parse_args([sys.argv[1], '--help'])")
    for command, cited in (("parse", ("§6.3: 21", "§6.3: 0.3", "§6.3: 300")),
                           ("translate", ("§6.1: 4", "§6.1: 0.6", "§6.1: 50"))):
        shown = subprocess.run([sys.executable, "-c", code, command], capture_output=True, text=True,
                               env={**os.environ, "COLUMNS": "400"}).stdout
        assert shown.startswith("False\n") and all(c in shown for c in cited), shown


def test_an_ensemble_list_that_took_the_run_folder_says_so(tmp_path, capsys):
    """`translate --ensemble A B RUN_DIR`: the list took RUN_DIR too, and argparse said only that run_dir is
    required, which the user had given. The line says why; ending the list with -- (options before it) works."""
    status, out, err = run_here(capsys, "translate", "--ensemble", str(REFERENCE_RUN), str(REFERENCE_RUN))
    assert status == 2 and "required: run_dir (--ensemble takes every folder after it: give RUN_DIR first" in err, err
    (tmp_path / "in.txt").write_text("A dog runs.\n")
    status, out, err = run_here(capsys, "translate", "--input", str(tmp_path / "in.txt"), "--ensemble",
                                str(REFERENCE_RUN), "--", str(REFERENCE_RUN))
    assert status == 0 and out.count("\n") == 1, err


def test_a_dash_is_stdin_or_stdout_where_the_default_is_another(tiny_run, tmp_path, capsys, monkeypatch):
    """`score --tgt -` read a file called "-" (`translate ... | score RUN --src in --tgt -`), and `evaluate --json -`
    wrote one, so that no option gave evaluate's scores alone on stdout; "-" is the standard stream, and
    evaluate's report goes to stderr when stdout carries the JSON or the translations."""
    monkeypatch.chdir(tmp_path)
    src, ref = tmp_path / "src.en", tmp_path / "ref.de"
    src.write_text("A dog runs.\nTwo men talk.\n")
    ref.write_text("Ein Hund läuft.\nZwei Männer reden.\n")
    files = run_cli("score", str(tiny_run), "--src", str(src), "--tgt", str(ref))
    piped = run_cli("score", str(tiny_run), "--src", str(src), "--tgt", "-", stdin=ref.read_text())
    assert files.returncode == piped.returncode == 0 and piped.stdout == files.stdout != "", piped.stderr
    status, out, err = run_here(capsys, "score", str(tiny_run), "--src", "-", "--tgt", "-")
    assert status == 1 and err.startswith("error: --src - and --tgt -: stdin can be one side"), err
    status, out, err = run_here(capsys, "evaluate", str(tiny_run), "--src", str(src), "--ref", str(ref), "--json", "-")
    assert status == 0 and json.loads(out)["sentences"] == 2 and "BLEU = " in err, (out, err)
    status, out, err = run_here(capsys, "evaluate", str(tiny_run), "--src", str(src), "--ref", str(ref), "--hyp-out",
                                "-", "--beam", "1")
    assert status == 0 and len(out.splitlines()) == 2 and "BLEU = " not in out and "BLEU = " in err, (out, err)
    status, out, err = run_here(capsys, "evaluate", str(tiny_run), "--src", str(src), "--ref", str(ref), "--json", "-",
                                "--hyp-out", "-")
    assert status == 1 and "one file cannot hold both outputs" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref.de", "src.en"]


def test_a_command_started_with_stdin_closed_says_so(tiny_run):
    """`translate RUN <&-`: "/dev/stdin: cannot read (No such file or directory)", a file it had not been given."""
    done = subprocess.run([sys.executable, "-m", "transformer", "translate", str(tiny_run)], capture_output=True,
                          text=True, timeout=120, preexec_fn=_closing(0))
    assert (done.returncode, done.stderr.splitlines()[-1]) == (1, "error: standard input is closed (<&-): give the "
                                                                  "input as a file, or pipe it in"), done.stderr


def test_unconstrained_on_a_translation_run_is_refused(tiny_run, tmp_path, capsys):
    """`evaluate RUN --unconstrained` on a translation run: taken without a word, though it lifts a parsing run's
    tree constraint, which a translation run's search has not."""
    src = tmp_path / "src.en"
    src.write_text("A dog runs.\n")
    status, out, err = run_here(capsys, "evaluate", str(tiny_run), "--src", str(src), "--ref", str(src),
                                "--unconstrained")
    assert (status, out) == (1, "") and err == (f"error: --unconstrained: {tiny_run} is a translation run (data.task "
                                                "= 'translate'), whose search has no tree constraint to lift\n"), err


def test_stdin_is_named_stdin_in_errors(tiny_run):
    """Invalid UTF-8 on translate's stdin was said of "/dev/stdin:2", a path the user never gave, where score's
    stdin errors said "stdin line 1"; both say stdin:LINE, as a file's say FILE:LINE."""
    done = subprocess.run([sys.executable, "-m", "transformer", "translate", str(tiny_run)], input=b"a dog .\n\xff\n",
                          capture_output=True, timeout=120)
    assert done.returncode == 1 and done.stderr.decode().splitlines()[-1].startswith(
        "error: stdin:2: invalid UTF-8"), done.stderr


def test_stdin_is_named_stdin_in_evaluations(tiny_run, tmp_path):
    """`evaluate-parse --gold -` and `evaluate --ref -` named their stdin "/dev/stdin" in errors, and a file of
    blank lines was "empty"."""
    two = tmp_path / "two.txt"
    two.write_text("(S (NN a))\n(S (NN b))\n")
    for command, stdin, said in (
            (["evaluate-parse", "--gold", "-", "--test", str(two)], "\n\n",
             "error: --gold stdin: no trees in it (the file holds blank lines alone)"),
            (["evaluate-parse", "--gold", "-", "--test", str(two)], "(S (NN a))\n",
             f"error: --gold stdin has 1 tree but --test {two} has 2"),
            (["evaluate", str(tiny_run), "--src", str(two), "--ref", "-"], "x\n",
             f"error: --src {two} has 2 lines but --ref stdin has 1")):
        done = subprocess.run([sys.executable, "-m", "transformer", *command], input=stdin, capture_output=True,
                              text=True, timeout=120)
        assert (done.returncode, done.stderr.splitlines()[-1]) == (1, said), done.stderr


@pytest.mark.parametrize("taken, left", [(10, b"first line\tA\n"), (13, b"first line\tA\n"), (0, b"")],
                         ids=["mid-line", "at-a-line-end", "nothing-yet"])
def test_a_stop_while_a_slow_reader_holds_stdout_finishes_the_line_under_way(monkeypatch, taken, left):
    """SIGTERM while a pipe's reader was slow left stdout ending in half a line ("-20.591740<TAB>": a score
    whose translation was cut off, read as an empty one). The line under way is finished, then the stop goes on."""
    from transformer.errors import Terminated

    read_end, write_end = os.pipe()
    real, calls = os.write, []

    def slow(fd: int, data) -> int:  # the signal comes during the write, and the reader takes ``taken`` bytes
        calls.append(len(data))
        if len(calls) == 1:
            signal.raise_signal(signal.SIGTERM)  # held (errors.stops_held) until the write has returned
            return real(fd, bytes(data[:taken]))
        return real(fd, data)

    def terminated(signum, frame):  # as cli.sigterm_raises's handler
        raise Terminated(signum)

    class Stdout:
        encoding, errors = "utf-8", "strict"

        def fileno(self) -> int:
            return write_end

        def flush(self) -> None:
            pass

    monkeypatch.setattr(sys, "stdout", Stdout())
    monkeypatch.setattr(os, "write", slow)
    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        with pytest.raises(Terminated):
            cli._write_whole_lines("first line\tA\nsecond\nthird\n")
    finally:
        signal.signal(signal.SIGTERM, previous)
    monkeypatch.undo()
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        assert f.read() == left


def test_evaluate_scores_a_tokenized_runs_outputs_as_they_are(tiny_run, tmp_path, capsys, monkeypatch):
    """A run trained on Multi30k's tokenized lowercased files writes that form: `evaluate --tok-ref` tokenized
    its outputs again (&apos; -> &amp; apos ;) and reported a fifth of the score the benchmark reported."""
    import transformer.evaluate
    from transformer.evaluate import tok_lc_bleu, writes_tokenized

    assert writes_tokenized("multi30k/tok/train.lc.norm.tok.de.gz") and writes_tokenized("/data/tok/train.de")
    assert not writes_tokenized("multi30k/train.de.gz") and not writes_tokenized("mine/train.tok.de")
    assert not writes_tokenized("/home/tok/corpus/train.de")  # a tok/ above the file's folder: cased text
    hyps = ["un homme dans l&apos; eau , avec un &quot; chapeau &quot; ."]
    assert tok_lc_bleu(hyps, hyps, "fr", pretokenized=True) == pytest.approx(100.0)
    assert tok_lc_bleu(hyps, hyps, "fr") < 50  # escaped again: &amp; apos ;
    seen = []
    monkeypatch.setattr(transformer.evaluate, "tok_lc_bleu", lambda *a: seen.append(a[3]) or 50.0)
    (tmp_path / "src.en").write_text("A dog runs.\n")
    (tmp_path / "ref.de").write_text("Ein Hund rennt.\n")
    (tmp_path / "tok.de").write_text("ein hund rennt .\n")
    common = ["evaluate", str(tiny_run), "--src", str(tmp_path / "src.en"), "--ref", str(tmp_path / "ref.de"),
              "--tok-ref", str(tmp_path / "tok.de"), "--beam", "1"]
    for flag, pretokenized, said in (([], False, "Moses lc+norm+tok, de"),
                                     (["--pretokenized"], True, "outputs as written, --pretokenized, de")):
        status, out, err = run_here(capsys, *common, *flag)
        assert status == 0 and seen[-1] is pretokenized and f"tokenized lowercased BLEU = 50.00  ({said})" in out, err
    # the pairs: without a tokenized reference it has nothing to act on, and is refused before any decoding; beside
    # --paper-bleu both take effect (the paper's BLEU tokenizes the outputs as ever)
    no_tok = [a for a in common if a not in ("--tok-ref", str(tmp_path / "tok.de"))]
    status, out, err = run_here(capsys, *no_tok, "--pretokenized")
    assert (status, out) == (1, "") and err == ("error: --pretokenized without --tok-ref: it says how the tokenized "
                                                "BLEU reads the outputs, and there is no tokenized reference to score "
                                                "them against\n"), err
    status, out, err = run_here(capsys, *common, "--pretokenized", "--paper-bleu")
    assert status == 0 and seen[-1] is True and "tokenized BLEU = " in out and "(outputs as written" in out, err


def test_version_names_this_package_torch_and_python_without_importing_torch():
    """`transformer --version`, what a bug report starts with: argparse said only that COMMAND is required."""
    code = ("import sys; from transformer import cli\n"
            "try:\n    cli.main(['--version'])\nexcept SystemExit as e:\n    print(e.code, 'torch' in sys.modules)")
    said = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert said.stdout == (f"transformer {transformer.__version__} (torch {torch.__version__}, Python "
                           f"{platform.python_version()})\n0 False\n"), said


def test_the_command_lines_own_process_ignores_a_ctrl_c_once_its_work_is_done():
    """A Ctrl-C as the interpreter shut down after `translate --output` had written its file: "Exception ignored in
    atexit callback" and torch's traceback, exit 0; or exit 130 without a word. A call with arguments (a program's,
    a test's) leaves the process's handler as it was."""
    code = ("import signal, sys; from transformer import cli\n"
            "sys.argv = ['transformer', 'params', 'tiny', '--vocab', '100']\n"
            "status = cli.main(); print(status, signal.getsignal(signal.SIGINT) is signal.SIG_IGN)\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "print(cli.main(['params', 'tiny', '--vocab', '100']), signal.getsignal(signal.SIGINT) is signal.SIG_IGN)")
    said = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert said.stdout.splitlines()[1::2] == ["0 True", "0 False"], said  # each after params' line


def test_building_the_parser_leaves_the_version_unread(monkeypatch):
    """The version line (a metadata lookup for torch) is read when --version is given, not at every command."""
    def unread() -> str:
        raise AssertionError("version_line called while building the parser")
    monkeypatch.setattr(cli, "version_line", unread)
    parsed = cli.build_parser().parse_args(["average", "runs/x", "--last", "2", "--out", "a.safetensors"])
    assert parsed.command == "average"


def test_evaluate_evaluate_parse_and_linearize_read_stdin_once(tiny_run, tmp_path, capsys):
    """"-" was a file of that name to evaluate ("data file not found: -"), evaluate-parse and linearize
    ("-: cannot read"), where translate, score and parse read stdin; stdin is one input, so naming it twice is
    refused rather than read as empty the second time."""
    gold = "(S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .))\n"
    (tmp_path / "g.mrg").write_text(gold)
    (tmp_path / "ref.de").write_text("Ein Hund rennt .\n")
    said = run_cli("evaluate-parse", "--gold", "-", "--test", str(tmp_path / "g.mrg"), stdin=gold)
    assert said.returncode == 0 and "F1        = 100.00" in said.stdout, said.stderr
    said = run_cli("linearize", "-", "--out", str(tmp_path / "x"), stdin=gold + "( (-NONE- *T*) )\n")
    assert said.returncode == 0 and said.stdout.endswith(f"{tmp_path / 'x.gold'}: 1 line\n"), said.stderr
    assert "(stdin: tree 2): score" in said.stderr, said.stderr  # "(/dev/stdin: tree 2)": a name not given
    said = run_cli("evaluate", str(tiny_run), "--src", "-", "--ref", str(tmp_path / "ref.de"), "--beam", "1",
                   "--threads", "1", stdin="A dog runs .\n")
    assert said.returncode == 0 and said.stdout.startswith("BLEU = "), said.stderr
    for args, named in ((["evaluate-parse", "--gold", "-", "--test", "-"], "--gold and --test"),
                        (["linearize", "-", str(tmp_path / "g.mrg"), "-", "--out", str(tmp_path / "y")], "trees"),
                        (["evaluate", str(tiny_run), "--src", "-", "--ref", str(tmp_path / "ref.de"), "--tok-ref", "-"],
                         "--src and --tok-ref")):
        status, out, err = run_here(capsys, *args)
        assert (status, out) == (1, "") and err == (f"error: {named}: - (stdin) given more than once; it holds one "
                                                    "input: give the others as files\n"), err


@pytest.mark.parametrize("command", ["translate", "parse"])
def test_an_input_that_cannot_be_read_is_named_with_its_option(command, tmp_path, capsys):
    """"in.txt: cannot read", where evaluate names its options: which file of the command's was it?"""
    status, out, err = run_here(capsys, command, str(REFERENCE_RUN), "--input", str(tmp_path / "in.txt"))
    assert (status, out) == (1, "") and err == f"error: --input {tmp_path / 'in.txt'}: cannot read (No such file or " \
                                               "directory)\n"
    status, out, err = run_here(capsys, command, str(REFERENCE_RUN), "--input", str(tmp_path))  # a folder too
    assert (status, out) == (1, "") and err == f"error: --input {tmp_path}: cannot read (Is a directory)\n"
    (tmp_path / "here.txt").write_text("A dog runs.\n")
    for missing in ("--src", "--tgt"):  # score's, named before the model loads
        given = {"--src": str(tmp_path / "here.txt"), "--tgt": str(tmp_path / "here.txt"),
                 missing: str(tmp_path / "in.txt")}
        status, out, err = run_here(capsys, "score", str(REFERENCE_RUN), *[a for kv in given.items() for a in kv])
        assert (status, out) == (1, "") and err == (f"error: {missing} {tmp_path / 'in.txt'}: cannot read (No such "
                                                    "file or directory)\n"), err
