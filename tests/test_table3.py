"""benchmarks/table3.py: the paper's Table 3 values as copied, each row's scaled config, and the script
end to end at a tiny scale (trained rows are read back, not trained again)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import write_slice

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import table3  # noqa: E402

PAPER_TEXT = ROOT.parent / "shared" / "paper" / "attention-is-all-you-need.md"


def printed_table() -> list[list[str]]:
    """The cells of Table 3's rows in the paper's text (header row dropped), tags stripped."""
    text = PAPER_TEXT.read_text(encoding="utf-8")
    start = text.index("<table>", text.index("6.2 Model Variations"))
    body = text[start:text.index("</table>", start)]
    rows = [[re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, re.S)]
            for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)]
    return rows[1:]


def test_paper_values_are_the_papers():
    printed = printed_table()
    assert len(printed) == len(table3.ROWS) == 20
    for name, cells in zip(table3.ROWS, printed):
        ppl, bleu, params = cells[-3:]
        assert (float(ppl), float(bleu)) == table3.PAPER[name][:2], name
        if table3.PAPER[name][2] is not None:
            assert int(params) == table3.PAPER[name][2], name
        elif not name.startswith("A"):  # rows (A) print stray numbers there (see table3.PAPER)
            assert params == "", name
    assert printed[0][:1] == ["base"] and printed[-1][:1] == ["big"]


def test_rows_are_the_papers_scaled_by_one_factor():
    scale = table3.Scale(factor=4, updates=100)
    for row in table3.ROWS:
        ours, paper = table3.row_config(row, 1, scale, [], None), table3.paper_config(row)
        (dk, dv), (pdk, pdv) = ours.model.head_dims, paper.model.head_dims
        assert (ours.model.d_model * 4, ours.model.d_ff * 4, dk * 4, dv * 4) == (paper.model.d_model, paper.model.d_ff,
                                                                                 pdk, pdv), row
        for key in ("n_enc_layers", "n_dec_layers", "n_heads", "p_drop", "positional"):
            assert getattr(ours.model, key) == getattr(paper.model, key), (row, key)
        assert ours.train.eps_ls == paper.train.eps_ls
        assert ours.train.max_steps == (300 if row == "big" else 100)
        assert (ours.decode.beam_size, ours.decode.alpha, ours.decode.average_last) == (4, 0.6, 1)
        assert ours.model.norm == table3.NORM and ours.train.warmup_steps == table3.WARMUP
    assert table3.row_config("A1", 1, scale, [], None).model.head_dims == (128, 128)
    assert table3.row_config("D3", 1, scale, [], None).train.eps_ls == 0.0
    # the rule's reasons are recorded for the rule only: a table at another scale does not claim them
    assert table3.scale_why(table3.Scale()) == table3.SCALE_WHY
    assert table3.scale_why(table3.Scale(factor=2)) != table3.SCALE_WHY
    assert "--pilot" in table3.scale_why(table3.Scale(updates=3600))


def test_each_variant_is_read_against_the_base_prediction_interval():
    band = table3.base_band([{"row": "base", "seed": s, "dev_ppl": p, "dev_bleu": b}
                             for s, p, b in ((1, 8.0, 33.0), (2, 8.2, 33.4), (3, 8.4, 32.6))])
    # mean 33.0, s 0.4, n 3: t(0.975, 2) = 4.303 (a t table), so ± 4.303 · 0.4 · √(4/3) = ± 1.987
    assert band["dev_bleu"] == {"mean": 33.0, "sd": 0.4, "min": 32.6, "max": 33.4, "half_width": 1.987}
    assert band["dev_ppl"]["half_width"] == 0.994 and band["level"] == 0.95
    # the issue's own figure: s.d. 0.47 BLEU over five seeds needs about ± 1.4 to stand out
    five = table3.base_band([{"row": "base", "seed": s, "dev_ppl": 8.0, "dev_bleu": 33.0 + d}
                             for s, d in enumerate((-0.47 * 2 ** 0.5, 0, 0, 0, 0.47 * 2 ** 0.5))])
    assert five["dev_bleu"]["sd"] == 0.47 and 1.42 <= five["dev_bleu"]["half_width"] <= 1.44
    rows = [{"row": "A1", "dev_ppl": 9.3, "dev_bleu": 30.9, "paper_ppl": 5.29, "paper_bleu": 24.9},   # as the paper
            {"row": "C1", "dev_ppl": 7.1, "dev_bleu": 35.5, "paper_ppl": 6.11, "paper_bleu": 23.7},   # against it
            {"row": "E", "dev_ppl": 8.3, "dev_bleu": 33.3, "paper_ppl": 4.92, "paper_bleu": 25.7},    # paper: ~none
            {"row": "A3", "dev_ppl": 8.1, "dev_bleu": 35.0, "paper_ppl": 4.91, "paper_bleu": 25.8},   # paper: no change
            {"row": "A2", "dev_ppl": 8.9, "dev_bleu": 31.5, "paper_ppl": 5.00, "paper_bleu": 25.5}]  # outside the
    # seeds' range (32.6-33.4, 8.0-8.4) but inside the interval: noise
    got = {r["row"]: r for r in table3.readings(rows, band)}
    assert got["A1"]["dev_bleu_delta"] == -2.1 and got["A1"]["paper_bleu_delta"] == -0.9
    assert got["A1"]["dev_bleu_reading"] == got["A1"]["dev_ppl_reading"] == "as the paper"
    assert got["C1"]["dev_bleu_reading"] == got["C1"]["dev_ppl_reading"] == "against the paper"
    assert got["A2"]["dev_bleu_reading"] == got["A2"]["dev_ppl_reading"] == "inside the noise"
    assert got["E"]["dev_ppl_reading"] == "no change, as the paper"  # the paper's E has the base's 4.92
    assert got["A3"]["dev_bleu_reading"] == "changes; the paper: none"
    assert got["A3"]["dev_ppl_reading"] == "no change, as the paper"  # the paper's 4.91 against 4.92: one unit
    # one printed unit (0.01 ppl, 0.1 BLEU) is the paper's "no change" (its E: 25.7 against 25.8); two are a change
    assert got["E"]["paper_bleu_delta"] == -0.1 and got["E"]["dev_bleu_reading"] == "no change, as the paper"
    assert table3.reading(0.1, 0.2, 0.0, 0.1) == "no change, as the paper"
    assert table3.reading(0.5, 0.2, -0.01, 0.01) == "changes; the paper: none"
    assert table3.reading(0.5, 0.2, -0.02, 0.01) == "against the paper"
    assert table3.false_findings(rows, band) == 0.5  # 5 rows × 2 metrics × 5%
    assert table3.readings(rows, table3.base_band([])) == []
    one = table3.base_band([{"row": "base", "seed": 1, "dev_ppl": 8.0, "dev_bleu": 33.0}])
    assert one["dev_bleu"] is None and table3.readings(rows, one) == []  # one seed has no spread to read by


def run_script(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "benchmarks")}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "table3.py"), *args], capture_output=True,
                          text=True, env=env, timeout=600)


def run_here(monkeypatch, capsys, *args: str) -> str:
    """table3.py's main on ``args`` in this process, where it trains nothing (a fresh process would only add
    its start-up); what it printed."""
    monkeypatch.setattr(sys, "argv", [str(ROOT / "benchmarks" / "table3.py"), *args])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", ""))  # main() sets it
    capsys.readouterr()
    table3.main()
    return capsys.readouterr().out


@pytest.mark.slow
def test_two_rows_end_to_end_then_read_back(multi30k: Path, tmp_path: Path, monkeypatch, capsys):
    src, tgt = write_slice(multi30k, tmp_path, "train", 0, 400)
    args = ["--rows", "base,D3", "--factor", "32", "--updates", "6", "--base-seeds", "2", "--val-sentences", "8",
            "--threads", "1", "--results", str(tmp_path / "results"), "--runs", str(tmp_path / "runs"),
            "--figure", str(tmp_path / "table3.png"), "--set", f'data.train_src="{src}"',
            "--set", f'data.train_tgt="{tgt}"', "--set", "data.vocab_size=400"]
    first = run_script(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    result = json.loads((tmp_path / "results" / "table3.json").read_text(encoding="utf-8"))
    assert [(r["row"], r["seed"]) for r in result["rows"]] == [("base", 1), ("base", 2), ("D3", 1)]
    for row in result["rows"]:
        for key in ("params", "paper_params", "updates", "dev_ppl", "dev_bleu", "paper_ppl", "paper_bleu", "seed",
                    "hyperparameters"):
            assert key in row, key
        assert row["updates"] == 6 and row["dev_ppl"] > 1 and 0 <= row["dev_bleu"] <= 100
        assert row["hyperparameters"]["d_model"] == 16 and row["paper_hyperparameters"]["d_model"] == 512
    base, base2, d3 = result["rows"]
    assert (base["paper_ppl"], base["paper_bleu"], base["paper_params"]) == (4.92, 25.8, 65_000_000)
    assert d3["hyperparameters"]["eps_ls"] == 0.0 and d3["paper_params"] is None
    assert not result["complete"] and "A1_seed1" in result["missing"] and "base_seed3" not in result["missing"]
    assert (tmp_path / "table3.png").stat().st_size > 0
    assert [d["row"] for d in result["readings"]] == ["D3"]
    mean = round((base["dev_bleu"] + base2["dev_bleu"]) / 2, 3)
    assert result["readings"][0]["dev_bleu_delta"] == round(d3["dev_bleu"] - mean, 3)
    assert result["base_band"]["dev_bleu"]["half_width"] >= 0 and result["expected_false_findings"] == 0.1
    md = (tmp_path / "results" / "table3.md").read_text(encoding="utf-8")
    assert "| D3 | 1 |" in md and "| D3 | " + f"{result['readings'][0]['dev_ppl_delta']:+}" in md

    shutil.rmtree(tmp_path / "runs")  # a second run must not need them: finished rows are read back
    second = run_here(monkeypatch, capsys, *args)
    assert second.count("read back") == 3 and "training into" not in second
    assert not (tmp_path / "runs").exists()
    assert json.loads((tmp_path / "results" / "table3.json").read_text(encoding="utf-8"))["rows"] == result["rows"]

    # --tabulate trains nothing and keeps saying where the rows were trained
    assert "training into" not in run_here(monkeypatch, capsys, *args, "--tabulate", "--rows", "A1")
    table = json.loads((tmp_path / "results" / "table3.json").read_text(encoding="utf-8"))
    assert table["rows"] == result["rows"] and table["trained_by"] == result["command"]
    assert "--tabulate" in table["command"] and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_sigterm_stops_a_row_in_one_line_and_running_again_resumes_it(multi30k: Path, tmp_path: Path):
    src, tgt = write_slice(multi30k, tmp_path, "train", 0, 400)
    args = [str(ROOT / "benchmarks" / "table3.py"), "--rows", "D3", "--factor", "32", "--updates", "30",
            "--val-sentences", "4", "--threads", "1", "--results", str(tmp_path / "results"), "--runs",
            str(tmp_path / "runs"), "--figure", str(tmp_path / "table3.png"), "--set", f'data.train_src="{src}"',
            "--set", f'data.train_tgt="{tgt}"', "--set", "data.vocab_size=400", "--set", "train.log_every=1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "benchmarks")}
    proc = subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "runs" / "table3" / "D3_seed1" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, "training did not start"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr[-2000:]
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1].startswith("stopped: SIGTERM"), stderr[-2000:]
    assert not (tmp_path / "results" / "table3" / "D3_seed1.json").exists()

    again = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from step_" in again.stderr + again.stdout
    assert json.loads((tmp_path / "results" / "table3" / "D3_seed1.json").read_text(encoding="utf-8"))["updates"] == 30


def refusal(monkeypatch, capsys, *args: str) -> str:
    """What table3.py says as it stops on ``args`` (sys.exit's message: stderr, status 1)."""
    with pytest.raises(SystemExit) as stopped:
        run_here(monkeypatch, capsys, *args)
    assert isinstance(stopped.value.code, str), stopped.value.code
    return stopped.value.code


def test_bad_requests_are_refused_by_name(monkeypatch, capsys):
    assert "no row A9" in refusal(monkeypatch, capsys, "--rows", "base,A9")
    for clash in (["--pilot"], ["--seeds", "4"]):
        assert f"cannot go with {clash[0]}" in refusal(monkeypatch, capsys, "--tabulate", *clash)
    assert "comma-separated integers" in refusal(monkeypatch, capsys, "--rows", "base", "--seeds", "four")
    assert "not divisible" in refusal(monkeypatch, capsys, "--rows", "base", "--factor", "3")
    if not table3.torch.cuda.is_available():
        assert "no CUDA GPU" in refusal(monkeypatch, capsys, "--device", "cuda")
