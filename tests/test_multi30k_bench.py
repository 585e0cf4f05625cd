"""benchmarks/multi30k.py: every candidate of every pair's search is a valid assignment of its config."""

import json
import sys
from pathlib import Path

import pytest

from transformer.config import load_config

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import multi30k  # noqa: E402


@pytest.mark.parametrize("pair", sorted(multi30k.SEARCH))
def test_candidates_load_and_differ(pair: str) -> None:
    config = ROOT / "configs" / f"multi30k_{pair}.toml"
    keys = {frozenset(multi30k.DEFAULTS.keys() | v.keys()) for v in multi30k.SEARCH[pair].values()}
    assert len(keys) == 1, f"{pair}: candidates name different keys"
    seen = set()
    for name, values in multi30k.SEARCH[pair].items():
        cfg = load_config(str(config), multi30k.overrides_of(values))  # an unknown key or bad value raises
        got = multi30k.recipe_values(cfg, sorted(multi30k.DEFAULTS | values))
        assert got == multi30k.DEFAULTS | values, name
        seen.add(tuple(sorted(got.items())))
    assert len(seen) == len(multi30k.SEARCH[pair]), f"{pair}: two candidates are the same setting"


def test_a_run_that_names_no_test_set_is_refused_in_one_line() -> None:
    """A run of one's own data (data.test_tok_ref = "", as the README trains one) read "" as the current folder:
    bf16_decode.py, decoding_features.py and export.py ended in a traceback."""
    import common

    with pytest.raises(SystemExit, match=r"^the run's config names no data.test_tok_ref: this benchmark scores"):
        common.test_set(load_config("multi30k_en_de", ['data.test_tok_ref=""']))
    with pytest.raises(SystemExit, match="names no data.test_tok_ref"):
        common.Split(load_config("multi30k_en_de", ['data.test_tok_ref=""']), "test")


def test_a_run_of_another_config_is_refused_not_read_back(tmp_path: Path) -> None:
    import common
    from transformer.config import dump_toml

    config = str(ROOT / "configs" / "multi30k_en_de_quick.toml")
    (tmp_path / "config.toml").write_text(dump_toml(load_config(config, ["model.d_ff=512"])), encoding="utf-8")
    (tmp_path / "summary.json").write_text('{"step": 5}', encoding="utf-8")
    with pytest.raises(SystemExit, match="another config"):
        common.train_or_resume(load_config(config, ["model.d_ff=256"]), tmp_path)
    # the same training with another [decode] and thread count is read back
    same = load_config(config, ["model.d_ff=512", "decode.beam_size=5", "train.threads=1"])
    assert common.train_or_resume(same, tmp_path) == {"step": 5}


def test_every_pair_says_where_its_choices_were_made_and_reads_its_margins() -> None:
    from scipy.stats import t

    assert set(multi30k.HISTORY) == set(multi30k.SEARCH)
    result = {"pair": "en_de", "candidates": [{"val_tok_lc_bleu": b} for b in (40.0, 41.0, 37.0)],
              "decoding_candidates": [{"val_tok_lc_bleu": b} for b in (41.05, 41.0)]}
    text = multi30k.margins(result)
    assert "seeds on the same val set" in text
    # Table 3's seeds are EN→DE's: EN→FR read their spread as on "the same val set"
    assert "seeds on EN→DE's val, not this pair's" in multi30k.margins(result | {"pair": "en_fr"})
    band = multi30k.json.loads((multi30k.RESULTS / "table3.json").read_text(encoding="utf-8"))["base_band"]
    sd, n = band["dev_bleu"]["sd"], len(band["seeds"])
    assert "leads the next by 1.0 val BLEU (41.0)" in text and f"s.d. of {sd} BLEU" in text
    assert ("inside that noise" in text) == (1.0 < t.ppf(0.975, n - 1) * sd * 2 ** 0.5)
    assert text.endswith("leads the next by 0.05 (41.05) on the same model's val translations: a tie.")
    wide = multi30k.margins(result | {"candidates": [{"val_tok_lc_bleu": b} for b in (30.0, 41.0)]})
    assert "11.0 val BLEU" in wide and "outside that noise" in wide
    assert multi30k.margins(result | {"candidates": result["candidates"][:1]}) == ""


import wu2021  # noqa: E402


def test_wu2021_runs_load_and_name_the_same_settings() -> None:
    keys = {frozenset(wu2021.settings_of(v)) for v in wu2021.RUNS.values()}
    assert len(keys) == 1, "the runs must assign the same keys (train.seed aside)"
    seen = set()
    for name, values in wu2021.RUNS.items():
        cfg = load_config(str(wu2021.CONFIG), wu2021.overrides_of(values))  # an unknown key or bad value raises
        seen.add(cfg.sha256())
    assert len(seen) == len(wu2021.RUNS), "two runs are the same config"
    assert wu2021.RUNS["wu_ls0"] == wu2021.THEIRS and set(wu2021.REPLICATION) <= set(wu2021.RUNS)
    # the fork's reading is the config as committed: its overrides change nothing
    assert wu2021.RUNS["wu_fork_epochs"] == wu2021.FORK
    assert load_config(str(wu2021.CONFIG), wu2021.overrides_of(wu2021.FORK)).sha256() == \
        load_config(str(wu2021.CONFIG)).sha256()


def test_wu2021_results_are_keyed_by_training_alone() -> None:
    """The config's [decode] does not key a run (every run is scored under every decoding), and each
    stored result still matches its run as RUNS spells it: none would be retrained."""
    cfg = load_config(str(wu2021.CONFIG))
    assert (cfg.decode.length_norm, cfg.decode.alpha) == ("length", 1.0)  # generate.py's score / |Y|
    assert wu2021.with_decoding(cfg, "theirs_lenpen").decode == cfg.decode
    assert wu2021.run_key(cfg) == wu2021.run_key(wu2021.with_decoding(cfg, "paper"))
    assert wu2021.run_key(cfg) != wu2021.run_key(load_config(str(wu2021.CONFIG), ["train.eps_ls=0.0"]))
    stored = sorted((wu2021.RESULTS / wu2021.SELECTION).glob("*.json"))
    assert stored
    for path in stored:
        run = load_config(str(wu2021.CONFIG), wu2021.overrides_of(wu2021.RUNS[path.stem]))
        assert json.loads(path.read_text(encoding="utf-8"))["config_sha256"] == wu2021.run_key(run), path.name


def test_wu2021_pick_averages_seeds_and_the_committed_recipe_is_the_pick() -> None:
    def done(name: str, bleu: dict[str, float]) -> dict:
        return {"name": name, "values": wu2021.RUNS[name], "val": {d: {"tok_lc_bleu": b} for d, b in bleu.items()}}

    # one seed's 42.0 does not beat two seeds averaging 41.5 unless it is better on average
    runs = {"ours": done("ours", {"theirs": 41.0}), "ours_seed2": done("ours_seed2", {"theirs": 42.0}),
            "wu_ls0.1": done("wu_ls0.1", {"theirs": 41.4, "paper": 41.6})}
    best, ranked = wu2021.pick(runs)
    assert (best["runs"], best["decoding"], best["val_tok_lc_bleu"]) == (["wu_ls0.1"], "paper", 41.6)
    assert [r["val_tok_lc_bleu"] for r in ranked] == [41.6, 41.5, 41.4]
    # benchmarks/results/multi30k_en_de_wu2021.json's pick is what configs/multi30k_en_de_8k.toml holds
    wu2021.check(wu2021.RESULTS)


def test_wu2021_test2016_is_decoded_by_a_seed_at_hand(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wu2021, "ROOT", tmp_path)
    runs = {n: {"name": n, "run": f"runs/wu2021/{n}"} for n in ("ours_qkv", "ours_qkv_seed2")}
    best = {"runs": ["ours_qkv", "ours_qkv_seed2"]}
    assert wu2021.test_member(best, runs)["name"] == "ours_qkv"  # neither folder here: the first seed
    (tmp_path / "runs" / "wu2021" / "ours_qkv_seed2").mkdir(parents=True)
    assert wu2021.test_member(best, runs)["name"] == "ours_qkv_seed2"


def test_wu2021_report_names_the_runs_not_trained_yet() -> None:
    result = json.loads((wu2021.RESULTS / "multi30k_en_de_wu2021.json").read_text(encoding="utf-8"))
    assert "Not trained yet" not in wu2021.markdown(result | {"not_trained": []})
    assert "Not trained yet, so in neither table nor the pick: wu_ls0.1_lctok_seed2." in \
        wu2021.markdown(result | {"not_trained": ["wu_ls0.1_lctok_seed2"]})


def test_wu2021_reading_names_what_a_run_changes_from_the_committed_config() -> None:
    assert wu2021.reading(wu2021.RUNS["wu_fork_epochs"]) == "the config as committed"
    assert wu2021.reading(wu2021.RUNS["wu_fork"]) == "checks every 50 steps"
    assert wu2021.reading(wu2021.RUNS["wu_fork_seed2"]) == "train.seed=2, checks every 50 steps"
    assert wu2021.reading(wu2021.RUNS["wu_ls0.1_smoothed_patience"]) == "train.beta2=0.999, checks every 50 steps"
    assert wu2021.reading(wu2021.RUNS["wu_fork_qkv"]) == "train.init_qkv_gain=0.7071"  # 4 significant digits
    assert wu2021.reading(wu2021.RUNS["wu_ls0.1_adam98"]) == \
        "train.adam_eps=1e-09, train.keep_best=valid_loss, checks every 50 steps"
    assert wu2021.reading(wu2021.RUNS["wu_ls0.1_lctok"]) == \
        "train.beta2=0.999, train.keep_best=valid_loss, lowercased tokenized text, checks every 50 steps"


def test_prediction_interval_is_the_t_band_of_one_more_run() -> None:
    import common

    band = common.prediction_interval([1.0, 2.0, 3.0])
    # mean 2, s 1, t(0.975, 2) = 4.3027: 4.3027 · 1 · √(4/3) = 4.968
    assert (band["n"], band["mean"], band["sd"], band["min"], band["max"]) == (3, 2.0, 1.0, 1.0, 3.0)
    assert band["half_width"] == pytest.approx(4.968, abs=1e-3)


def test_wu2021_seed_band_pools_the_label_smoothed_runs_and_reads_the_published_run() -> None:
    def row(name: str, eps: float, bleu: float) -> dict:
        return {"run": name, "values": {"train.eps_ls": eps}, "test_theirs": {"tok_lc_bleu": bleu}}

    rows = [row("a", 0.1, 39.0), row("b", 0.1, 40.0), row("c", 0.0, 36.0), row("d", 0.1, 39.5)]
    band = wu2021.seed_band(rows, 41.02)
    assert band["runs"] == ["a", "b", "d"] and band["mean"] == 39.5
    # s 0.5, t(0.975, 2) = 4.303: half width 2.484, so 41.02 is inside 37.02–41.98
    assert (band["low"], band["high"], band["published_inside"]) == (37.02, 41.98, True)
    assert wu2021.seed_band(rows, 42.0)["published_inside"] is False
    assert wu2021.seed_band(rows[2:3], 41.02) is None
    # read in another decoding: the runs so decoded alone (the band had been read in GNMT's α = 1 alone, though
    # the published run and generate.py decode with score / |Y|)
    rows[0]["test_theirs_lenpen"], rows[1]["test_theirs_lenpen"] = {"tok_lc_bleu": 40.0}, {"tok_lc_bleu": 41.0}
    lenpen = wu2021.seed_band(rows, 41.02, "theirs_lenpen")
    assert (lenpen["runs"], lenpen["decoding"], lenpen["mean"]) == (["a", "b"], "theirs_lenpen", 40.5)
    assert band["decoding"] == "theirs"
    # rows of before batch orders were recorded drew theirs seeded with seed + epoch: the band says so
    assert band["batch_orders"] == [1]
    rows[1]["batch_order"] = 2
    assert wu2021.seed_band(rows, 41.02)["batch_orders"] == [1, 2]


def test_wu2021_gap_rows_split_bleu_into_precisions_and_length() -> None:
    published = json.loads((wu2021.RESULTS / "published.json").read_text(encoding="utf-8"))[wu2021.PUBLISHED]
    parts = published["tok_lc_parts"]
    # the published line's parts give its BLEU back: geometric mean of the precisions times the penalty
    assert wu2021.precision_mean(parts) * parts["bp"] == pytest.approx(published["tok_lc_bleu"], abs=0.05)
    shorter = {"precisions": parts["precisions"], "bp": 0.986, "sys_len": 11929, "ref_len": 12103}
    longer = {"precisions": [69.5, 45.8, 32.7, 23.4], "bp": 1.0, "sys_len": 12177, "ref_len": 12103}
    rows = [{"run": "a", "test_theirs_lenpen": {"tok_lc_bleu": 40.5, "tok_lc_parts": shorter}},
            {"run": "b", "test_theirs_lenpen": {"tok_lc_bleu": 39.5, "tok_lc_parts": longer}},
            {"run": "c", "test_theirs": {"tok_lc_bleu": 39.0}}]  # no parts: not in the table
    gap = wu2021.gap_parts(rows, published)
    assert [x["run"] for x in gap["runs"]] == ["a", "b"] and gap["published"] == {"precision_mean": 41.03,
                                                                                 "length_ratio": 0.999}
    table, sentence = wu2021.gap_rows({"published": published, "replication": rows, "gap": gap})
    lines = table.splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["| published (41.02)", "| a", "| b"]
    assert lines[1].endswith("| 71.0 / 47.5 / 34.3 / 24.5 | 41.03 | 0.986 | 0.986 |")
    assert "averages 40.27 (from 39.51 to 41.03; published 41.03)" in sentence
    assert "ratio 0.996 (0.986 to 1.006; published 0.999)" in sentence
    assert wu2021.gap_parts(rows[2:], published) is None
    assert wu2021.gap_rows({"published": published, "replication": rows[2:], "gap": None}) == ("", "")
