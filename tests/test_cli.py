"""The command line end to end: train → average → translate → evaluate on real Multi30k pairs."""

import json
import subprocess
import sys

import pytest
import torch

from transformer.checkpoint import average_checkpoints, list_checkpoints, load_checkpoint
from transformer.cli import main


def run_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "transformer", *args], input=stdin, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_train_average_translate_evaluate(tmp_path, tiny_overrides, multi30k):
    run = tmp_path / "run"
    sets = [x for o in tiny_overrides + ["train.max_steps=40", "train.save_every=10", "train.log_every=10"]
            for x in ("--set", o)]
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
    test_src, test_ref = multi30k / "test_2016_flickr.en.gz", multi30k / "test_2016_flickr.de.gz"
    head_src, head_ref = tmp_path / "t.en", tmp_path / "t.de"
    from transformer.data import read_lines
    head_src.write_text("\n".join(read_lines(test_src)[:20]) + "\n")
    head_ref.write_text("\n".join(read_lines(test_ref)[:20]) + "\n")
    tok_ref = tmp_path / "t.tok.de"
    tok_ref.write_text("\n".join(read_lines(multi30k / "tok" / "test_2016_flickr.lc.norm.tok.de.gz")[:20]) + "\n")
    result = run_cli("evaluate", str(run), "--src", str(head_src), "--ref", str(head_ref), "--tok-ref",
                     str(tok_ref), "--lang", "de", "--json", str(out_json), "--beam", "1", "--paper-bleu")
    assert result.returncode == 0, result.stderr
    assert "BLEU = " in result.stdout and "nrefs:1|case:mixed" in result.stdout and "chrF" in result.stdout
    scores = json.loads(out_json.read_text())
    assert {"bleu", "chrf", "signature", "tok_lc_bleu", "paper_bleu"} <= set(scores)


def test_params_cost_recomputes_table_2(capsys):
    assert main(["params", "wmt14_en_de_base", "--cost", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    # Table 2: base 3.3e18 FLOPs = 8 P100 x 12 h x 9.5 TFLOPS
    assert report["table2"]["paper_flops"] == pytest.approx(3.3e18, rel=0.01)
    assert report["tokens_per_step"] == 25_000 and report["steps"] == 100_000
    assert report["total_flops"] == pytest.approx(report["flops_per_token"] * 25_000 * 100_000)
    hours = [r["hours"] for r in report["per_devices"]]
    assert hours[0] == pytest.approx(8 * hours[1])  # time scales with the devices at a fixed MFU


def test_params_json(capsys):
    assert main(["params", "base", "--vocab", "40960", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["parameters"] == pytest.approx(65e6, rel=0.01) and out["flops_per_token"] > 6 * 44e6


@pytest.mark.parametrize("args, message", [
    (["train", "nonexistent.toml", "--out", "x"], "config file not found"),
    (["train", "tiny", "--out", "{tmp}/r", "--set", "model.d_modle=3"], "did you mean model.d_model"),
    (["translate", "{tmp}"], "not a run folder"),
    (["average", "{tmp}", "--last", "2", "--out", "{tmp}/a.safetensors"], "no checkpoints"),
    (["params", "bsae"], "did you mean 'base'"),
    (["train", "configs/multi30k_en_de.toml", "--out", "{tmp}/r", "--set", 'data.train_src="/nonexistent/x.en"'],
     "data file not found"),
])
def test_user_errors_exit_1_with_one_line(tmp_path, args, message):
    result = run_cli(*[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert result.returncode == 1, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_usage_errors_exit_2():
    assert run_cli("train").returncode == 2
    assert run_cli("frobnicate").returncode == 2


def test_decoding_options_replace_the_runs_own():
    from transformer.cli import _decode_overrides, build_parser

    args = build_parser().parse_args(["serve", "RUN", "--beam", "6", "--alpha", "1.0", "--early-stop", "top"])
    assert _decode_overrides(args) == {"beam_size": 6, "alpha": 1.0, "early_stop": "top"}
    assert _decode_overrides(build_parser().parse_args(["translate", "RUN"])) == {}
    with pytest.raises(SystemExit):  # usage error: not a rule
        build_parser().parse_args(["translate", "RUN", "--early-stop", "first"])


def test_every_command_has_help():
    for command in ("train", "translate", "evaluate", "average", "params"):
        result = run_cli(command, "--help")
        assert result.returncode == 0 and "usage:" in result.stdout, command


@pytest.mark.parametrize("flag, value, message", [("--alpha", "nan", "decode.alpha must be a finite number"),
                                                  ("--alpha", "inf", "decode.alpha must be a finite number"),
                                                  ("--alpha", "-0.5", "decode.alpha and decode.max_len_offset must be"),
                                                  ("--beam", "0", "decode.beam_size must be positive")])
def test_decoding_flags_are_checked_like_the_config(tiny_run, flag, value, message):
    """A flag's value passes the same checks as the run's config: NaN is not a length penalty."""
    result = run_cli("translate", str(tiny_run), flag, value, stdin="a dog runs .\n")
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1
