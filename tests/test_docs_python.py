"""docs/python.md's blocks run as written, one after the other, on the tiny preset and Multi30k: a page of
Python API examples that no longer ran (a renamed argument, a moved class) would mislead every user who
copies it."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).parents[1] / "docs" / "python.md"


def blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(encoding="utf-8"), flags=re.S | re.M)


@pytest.mark.slow
def test_the_pages_blocks_run_in_order(multi30k, tmp_path):
    code = "\n".join(blocks())
    # what the page says of the process: sampling moves no global generator; train seeded torch's with train.seed
    code += """
import torch
state = torch.random.get_rng_state()
translator.decode(["A dog runs."], DecodeRequest(sample=True, seed=5))
assert torch.equal(state, torch.random.get_rng_state()), "sampling moved torch's global generator"
assert drawn == translator.decode(["A dog runs."], DecodeRequest(sample=True, topk=10, seed=3, nbest=2))
print("ALL BLOCKS RAN")
"""
    env = {**os.environ, "TRANSFORMER_DATA": str(multi30k.parent)}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and "ALL BLOCKS RAN" in done.stdout, done.stderr[-3000:]
    assert "--sample with --beam" in done.stdout  # the error block printed the refusal
    assert (tmp_path / "runs" / "tiny" / "summary.json").is_file()


def test_the_page_has_blocks_and_links_resolve() -> None:
    assert len(blocks()) >= 5
    for link in re.findall(r"\]\(([^)#]+\.md)\)", PAGE.read_text(encoding="utf-8")):
        assert (PAGE.parent / link).is_file(), link
