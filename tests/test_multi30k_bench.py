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
