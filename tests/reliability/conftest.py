"""The reliability suite's fixtures: the ledger every test records its damage in (tests/reliability/ledger.py,
loaded as a plugin for every run) and the small model the fuzzing translates with."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.ledger import LEDGER, Ledger


@pytest.fixture
def ledger() -> Ledger:
    return LEDGER


@pytest.fixture(scope="session")
def fuzz_run(tmp_path_factory, multi30k: Path) -> Path:
    """A run folder with a tiny model (30 steps, 300 pieces) whose outputs stop at input + 5 pieces:
    fast enough to decode hundreds of fuzzed lines, shared by the translate and the server tests."""
    from tests.conftest import write_slice
    from transformer.config import load_config
    from transformer.train import train

    out = tmp_path_factory.mktemp("fuzz")
    src, tgt = write_slice(multi30k, out, "train", 0, 400)
    cfg = load_config("tiny", [f'data.train_src="{src}"', f'data.train_tgt="{tgt}"', f'data.valid_src="{src}"',
                               f'data.valid_tgt="{tgt}"', "data.vocab_size=300", "train.max_steps=30",
                               "train.threads=1", "decode.max_len_offset=5"])
    train(cfg, out / "run", quiet=True)
    return out / "run"


@pytest.fixture(scope="session")
def fuzz_translator(fuzz_run: Path):
    """The ``fuzz_run`` model, loaded once."""
    from transformer.translator import Translator

    return Translator(fuzz_run, log=lambda m: None)
