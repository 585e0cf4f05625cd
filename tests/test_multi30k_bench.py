"""benchmarks/multi30k.py: every candidate of every pair's search is a valid assignment of its config."""

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
    result = {"candidates": [{"val_tok_lc_bleu": b} for b in (40.0, 41.0, 37.0)],
              "decoding_candidates": [{"val_tok_lc_bleu": b} for b in (41.05, 41.0)]}
    text = multi30k.margins(result)
    band = multi30k.json.loads((multi30k.RESULTS / "table3.json").read_text(encoding="utf-8"))["base_band"]
    sd, n = band["dev_bleu"]["sd"], len(band["seeds"])
    assert "leads the next by 1.0 val BLEU (41.0)" in text and f"s.d. of {sd} BLEU" in text
    assert ("inside that noise" in text) == (1.0 < t.ppf(0.975, n - 1) * sd * 2 ** 0.5)
    assert text.endswith("leads the next by 0.05 (41.05) on the same model's val translations: a tie.")
    wide = multi30k.margins(result | {"candidates": [{"val_tok_lc_bleu": b} for b in (30.0, 41.0)]})
    assert "11.0 val BLEU" in wide and "outside that noise" in wide
    assert multi30k.margins(result | {"candidates": result["candidates"][:1]}) == ""
