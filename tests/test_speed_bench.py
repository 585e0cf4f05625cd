"""benchmarks/speed.py --only SECTION (issue 47's CPU check is --only train): a section measured again
is written into speed.json in place of its keys, the other sections untouched, its provenance beside
them. The measuring itself (minutes of timed runs against fairseq) is stood in for."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import speed  # noqa: E402

TRAINED = {"matmul_peak_gflops": 170.0, "flops_per_tgt_token": 45750000, "mean_lengths": {"en": 16.0, "de": 16.5},
           "train_runs": {"ours": [3000, 3100, 3200], "fairseq": [2800, 2900, 3000]},
           "train": {"ours": {"tokens_per_s": 3100, "min": 3000, "max": 3200, "runs": 3, "updates": 250,
                              "mfu": 0.83},
                     "fairseq": {"tokens_per_s": 2900, "min": 2800, "max": 3000, "runs": 3, "updates": 250,
                                 "mfu": 0.78}},
           "mfu": 0.83, "train_ratios": {"train_vs_fairseq": 1.069, "train_vs_fairseq_min_max": [1.0, 1.143]}}
VERSIONS = {"ctranslate2": "9", "fairseq": "0.12.3.1", "fairseq_torch": "2.13.0+cpu"}


@pytest.fixture
def stood_in(tmp_path, monkeypatch):
    """speed.json as committed in a folder of its own, and every measuring step stood in for."""
    shutil.copy(ROOT / "benchmarks" / "results" / "speed.json", tmp_path / "speed.json")
    calls = []
    monkeypatch.setattr(speed, "open_vocabulary",
                        lambda cfg, src, tgt, path, log, resuming: calls.append(("vocabulary", path)) or FakeTok())
    monkeypatch.setattr(speed, "pieces_and_peers", lambda args, work, tok: (Path("bin"), work / "fairseq_bin", {}))
    monkeypatch.setattr(speed, "peer_versions", lambda bin_dir: dict(VERSIONS))
    monkeypatch.setattr(speed, "training",
                        lambda *a: calls.append(("training", a[1])) or json.loads(json.dumps(TRAINED)))
    return tmp_path, calls


class FakeTok:
    vocab_size = 8000


def state(commit: str, command: str) -> dict:
    return {"date": "2026-11-29", "commit": commit, "uncommitted": [], "command": command,
            "versions": {"torch": "2.13.0+cpu"}}


def test_only_train_replaces_the_training_keys_and_keeps_the_rest(stood_in):
    folder, calls = stood_in
    before = json.loads((folder / "speed.json").read_text(encoding="utf-8"))
    run = folder / "no_run"
    speed.remeasure(argparse.Namespace(run=run, only="train", results=folder),
                    state("abc1234", "benchmarks/speed.py --only train"))

    after = json.loads((folder / "speed.json").read_text(encoding="utf-8"))
    # no model run at --run: a vocabulary alone, trained in a folder of its own
    assert calls == [("vocabulary", run / "speed_train" / "spm.model"), ("training", run / "speed_train")]
    assert after["train"] == TRAINED["train"] and after["train_runs"] == TRAINED["train_runs"]
    assert after["ratios"]["train_vs_fairseq"] == 1.069 and after["matmul_peak_gflops"] == 170.0
    for key in ("translate", "greedy_agreement", "int8", "top_stop", "user_model", "commit", "date"):
        assert after[key] == before[key]
    assert after["ratios"]["translate_b1_vs_ctranslate2"] == before["ratios"]["translate_b1_vs_ctranslate2"]
    assert after["remeasured"]["train"]["commit"] == "abc1234"
    assert after["remeasured"]["train"]["versions"]["fairseq"] == "0.12.3.1"
    assert set(after["remeasured"]) == set(before.get("remeasured", {})) | {"train"}
    md = (folder / "speed.md").read_text(encoding="utf-8")
    training_part = md[md.index("## Training"):md.index("## Translation")]
    assert "Measured apart from the run above" in training_part and "commit\nabc1234" in training_part
    assert "| ours | 3100 (3000–3200)" in training_part


def test_only_translate_replaces_the_translation_keys_and_keeps_the_rest(stood_in, monkeypatch, tiny_run):
    folder, calls = stood_in
    before = json.loads((folder / "speed.json").read_text(encoding="utf-8"))
    translated = {"greedy_agreement": {"ctranslate2_identical": 5, "sentences": 5},
                  "translate": {"ours_b64": {"sents_per_s": 1.0, "tgt_tokens_per_s": 9.0, "seconds": 5.0,
                                             "sentences": 5, "bleu": 1.5}},
                  "sentences": {"b64": 5}, "int8": {"x": 1}, "top_stop": {"x": 2}, "length_norm": {"x": 3},
                  "translate_ratios": {"translate_b64_vs_ctranslate2": 0.5}}
    monkeypatch.setattr(speed, "translating",
                        lambda args, work, tok, b, d: calls.append(("translating", work)) or dict(translated))
    speed.remeasure(argparse.Namespace(run=tiny_run, only="translate", results=folder),
                    state("def5678", "speed.py --only translate"))

    after = json.loads((folder / "speed.json").read_text(encoding="utf-8"))
    assert calls == [("translating", tiny_run / "speed")]  # --run has a model: it is used, not trained again
    for key in ("translate", "greedy_agreement", "int8", "top_stop", "length_norm", "sentences"):
        assert after[key] == translated[key]
    for key in ("train", "train_runs", "user_model", "matmul_peak_gflops"):
        assert after[key] == before[key]
    assert after["ratios"]["translate_b64_vs_ctranslate2"] == 0.5
    assert after["ratios"]["train_vs_fairseq"] == before["ratios"]["train_vs_fairseq"]
    assert after["remeasured"]["translate"]["commit"] == "def5678"
    md = (folder / "speed.md").read_text(encoding="utf-8")
    assert "commit\ndef5678" in md[md.index("## Translation"):] and '"x": 3' in md


def test_a_full_run_writes_every_section_and_no_remeasured(stood_in, monkeypatch, tiny_run):
    """main() without --only: the sections' keys composed into one new speed.json (its glue, which a
    real run reaches only after an hour of measuring)."""
    folder, calls = stood_in
    committed = json.loads((folder / "speed.json").read_text(encoding="utf-8"))
    translated = {k: committed[k] for k in ("greedy_agreement", "translate", "sentences", "int8", "top_stop")}
    translated |= {"length_norm": {"b64_vs_gnmt": 0.9}, "translate_ratios": {"translate_b1_vs_ctranslate2": 0.4}}
    monkeypatch.setattr(speed, "translating", lambda *a: calls.append(("translating", a[1])) or dict(translated))
    monkeypatch.setattr(speed, "user_model", lambda run, work: committed["user_model"])
    monkeypatch.setattr(speed.torch, "set_num_threads", lambda n: None)  # this process keeps its threads
    monkeypatch.setattr(sys, "argv", ["speed.py", "--run", str(tiny_run), "--user-run", str(tiny_run),
                                      "--results", str(folder)])
    speed.main()

    after = json.loads((folder / "speed.json").read_text(encoding="utf-8"))
    assert calls == [("training", tiny_run / "speed"), ("translating", tiny_run / "speed")]
    assert after["ratios"] == {**TRAINED["train_ratios"], "translate_b1_vs_ctranslate2": 0.4}
    assert "remeasured" not in after and after["versions"]["fairseq"] == "0.12.3.1"
    assert after["train"] == TRAINED["train"] and after["length_norm"] == {"b64_vs_gnmt": 0.9}
    assert '"b64_vs_gnmt": 0.9' in (folder / "speed.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("section, other", [
    ("train", "--markdown"), ("train", "--no-peers"), ("train", "--user-run=runs/x"), ("train", "--repeat=2"),
    ("train", "--b1-sentences=50"), ("train", "--train-minutes=5"), ("translate", "--train-runs=2"),
    ("translate", "--train-updates=100"), ("translate", "--no-peers"), ("translate", "--user-run=runs/x"),
    ("user", "--repeat=2"), ("user", "--train-runs=2"), ("user", "--no-peers"), ("user", "--markdown")])
def test_only_refuses_the_options_it_would_ignore_in_one_line(section, other, monkeypatch, capsys):
    monkeypatch.setattr(speed, "remeasure", lambda args, state: pytest.fail("measured despite the refusal"))
    monkeypatch.setattr(sys, "argv", ["speed.py", "--only", section, other])
    with pytest.raises(SystemExit) as exit_:
        speed.main()
    assert exit_.value.code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"--only {section} cannot run with {other.split('=')[0]}" in message


@pytest.mark.parametrize("argv, wanted", [
    (["--only", "train", "--train-runs", "2"], {"train_runs": 2, "train_updates": 250, "repeat": 3}),
    (["--only", "translate", "--repeat", "5", "--train-minutes", "2"], {"repeat": 5, "train_minutes": 2.0,
                                                                       "b1_sentences": 200, "train_runs": 3})])
def test_only_takes_its_own_sections_options_and_the_defaults(argv, wanted, monkeypatch):
    seen = []
    monkeypatch.setattr(speed, "remeasure", lambda args, state: seen.append(args))
    monkeypatch.setattr(speed.torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(sys, "argv", ["speed.py", *argv])
    speed.main()
    assert {k: getattr(seen[0], k) for k in wanted} == wanted


def test_only_user_replaces_the_users_model_and_keeps_the_rest(stood_in, monkeypatch, tiny_run):
    folder, calls = stood_in
    before = json.loads((folder / "speed.json").read_text(encoding="utf-8"))
    measured = {"run": "runs/x", "model": {}, "sentences": 3, "seconds": {"ours": {"median": 1, "min": 1, "max": 2}},
                "bleu": {"ours": 9.5}, "ratios": {"exact_vs_ctranslate2": 0.25}, "startup_s": {}}
    monkeypatch.setattr(speed, "user_model", lambda run, work: calls.append(("user_model", run, work)) or measured)
    run = tiny_run.parent / "speed_run"
    speed.remeasure(argparse.Namespace(run=run, only="user", user_run=tiny_run, results=folder),
                    state("0a1b2c3", "--only user"))

    after = json.loads((folder / "speed.json").read_text(encoding="utf-8"))
    assert calls == [("user_model", tiny_run, run / "speed")]
    assert after["user_model"] == measured and after["remeasured"]["user"]["commit"] == "0a1b2c3"
    for key in ("train", "translate", "ratios", "int8", "matmul_peak_gflops", "commit"):
        assert after[key] == before[key]
    md = (folder / "speed.md").read_text(encoding="utf-8")
    assert "commit\n0a1b2c3" in md[md.index("## The model users train"):] and "0.25" in md


def test_only_user_refuses_a_run_that_did_not_finish(stood_in, tmp_path):
    (tmp_path / "unfinished").mkdir()
    (tmp_path / "unfinished" / "config.toml").write_text("", encoding="utf-8")
    with pytest.raises(SystemExit, match="unfinished: no finished run there"):
        speed.remeasure(argparse.Namespace(run=tmp_path, only="user", user_run=tmp_path / "unfinished",
                                           results=tmp_path), {})


def test_training_alternates_ours_in_fp32_and_bf16_with_fairseq(monkeypatch, tmp_path):
    """Each round trains ours in fp32, ours in bf16, then fairseq; bf16 is set against our fp32 (fairseq
    trains in fp32 on a CPU), with no MFU against the fp32 peak."""
    calls, rates = [], {"fp32": 3000.0, "bf16": 5100.0}
    monkeypatch.setattr(speed, "train_ours", lambda run, updates, precision="fp32": calls.append(
        (run.name, precision)) or [(step, rates[precision] + len(calls)) for step in range(10, 260, 10)])
    monkeypatch.setattr(speed, "train_fairseq", lambda bin_dir, data_bin, work, updates, name: calls.append(
        (name, "fp32")) or [(step, 2500.0) for step in range(10, 260, 10)])
    monkeypatch.setattr(speed, "matmul_peak", lambda: 100.0)
    monkeypatch.setattr(speed, "flops_per_token", lambda *a: 1e7)
    args = argparse.Namespace(train_runs=2, train_updates=250)
    cfg = argparse.Namespace(model=None)
    result = speed.training(args, tmp_path, cfg, 8000, Path("bin"), tmp_path, {"en": 16.0, "de": 16.5})
    assert calls == [("train_ours_0", "fp32"), ("train_ours_bf16_0", "bf16"), ("train_fairseq_0", "fp32"),
                     ("train_ours_1", "fp32"), ("train_ours_bf16_1", "bf16"), ("train_fairseq_1", "fp32")]
    assert result["train_runs"] == {"ours": [3001, 3004], "ours_bf16": [5102, 5105], "fairseq": [2500, 2500]}
    assert result["train"]["ours_bf16"]["mfu"] is None
    assert result["train"]["ours"]["mfu"] == round(3002.5 * 1e7 / 1e11, 4)  # the median run's rate x FLOPs / peak
    ratios = result["train_ratios"]
    assert ratios["train_bf16_vs_fp32"] == round(5104 / 3002, 3)  # medians of two runs: 5103.5 and 3002.5
    assert ratios["train_bf16_vs_fp32_min_max"] == [round(5102 / 3004, 3), round(5105 / 3001, 3)]
    assert ratios["train_vs_fairseq"] == round(3002 / 2500, 3)


def test_translation_goes_in_rounds_and_gives_each_ratio_its_range(monkeypatch, tmp_path):
    """Each round times every system once (a process each, one untimed pass first); a system's rate is
    its best round's, and a ratio's range compares round i with round i."""
    seconds = {"ours": iter([2.0, 1.0, 4.0, 1.0, 1.0, 1.0]), "theirs": iter([1.0, 2.0, 1.0, 1.0, 1.0, 1.0])}
    jobs = []

    def fake_worker(system, name, job, work):
        jobs.append((name, job["batch"], job["repeat"], job["warmup"], len(job["sources"])))
        return {"seconds": next(seconds[name]), "sentences": len(job["sources"]),
                "outputs": [["▁ja"] for _ in job["sources"]]}

    class Tok:
        def vocabulary(self) -> list[str]:
            return ["<pad>", "<unk>", "</s>", "▁ja"]

        def decode(self, ids: list[int]) -> str:
            return "ja"

    monkeypatch.setattr(speed, "worker", fake_worker)
    systems = {"ours": None, "theirs": None}
    runs = speed.translation(systems, [["▁ja"]] * 4, 2, 3, Tok(), ["ja"] * 4, tmp_path)
    assert [j[0] for j in jobs] == ["ours", "theirs"] * 6  # interleaved: ours, theirs, ours, theirs, ...
    assert {j[1:] for j in jobs[:6]} == {(64, 1, 1, 4)} and {j[1:] for j in jobs[6:]} == {(1, 1, 1, 2)}
    assert runs["ours_b64"]["rounds_s"] == [2.0, 1.0, 4.0] and runs["ours_b64"]["sents_per_s"] == 4.0
    assert runs["theirs_b64"]["sents_per_s"] == 4.0 and runs["ours_b1"]["sentences"] == 2
    # best round against best round, 4 / 4; round by round ours ÷ theirs: 1/2, 2/1, 1/4
    assert speed.rate_ratio(runs, "r", "ours_b64", "theirs_b64") == {"r": 1.0, "r_rounds": [0.25, 2.0]}
    assert speed.rate_ratio(runs, "r", "ours_b64", "fairseq_b64") == {"r": None, "r_rounds": None}


def test_the_worker_times_after_its_untimed_passes():
    import speed_worker

    timed = []
    best, outputs = speed_worker.time_best(lambda: timed.append(1) or [["x"]], repeat=2, warmup=3)
    assert len(timed) == 5 and outputs == [["x"]] and best >= 0


def test_only_needs_a_full_run_first(tmp_path):
    with pytest.raises(SystemExit, match="does not exist yet"):
        speed.remeasure(argparse.Namespace(run=tmp_path / "run", only="train", results=tmp_path), {})


def test_the_worker_hands_the_jobs_length_norm_to_the_search(tiny_run, monkeypatch):
    """speed.py's ours_length_norm row: the job's length_norm reaches the search (the default, GNMT's,
    when the job names none)."""
    import speed_worker

    import transformer.decode

    seen = []

    def fake_translate_ids(model, sources, *args, **kwargs):
        seen.append(kwargs)
        return [[] for _ in sources]

    monkeypatch.setattr(transformer.decode, "translate_ids", fake_translate_ids)
    from transformer.tokenizer import Tokenizer

    checkpoint = sorted((tiny_run / "checkpoints").glob("*.safetensors"))[-1]
    piece = Tokenizer(tiny_run / "spm.model").vocabulary()[10]
    job = {"run": str(tiny_run), "checkpoint": str(checkpoint), "sources": [[piece]], "beam": 4, "alpha": 0.6,
           "max_len_offset": 50, "batch": 64, "repeat": 1}
    speed_worker.ours(job | {"length_norm": "length"}, int8=False)
    speed_worker.ours(job, int8=False)
    assert [k["length_norm"] for k in seen] == ["length", "gnmt"]
