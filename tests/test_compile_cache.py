"""benchmarks/compile_cache.sh: torch.compile's caches carried from one GPU visit to the next."""
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "compile_cache.sh"

COMPILE = """
import json, torch
from torch._dynamo.utils import counters
model = torch.compile(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.LayerNorm(16)))
model(torch.randn(4, 16, requires_grad=True)).sum().backward()
print(json.dumps({k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}))
"""


def cache(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=os.environ | env)


def compiled(cache_dir: Path) -> dict:
    """Inductor's cache counters of a small model's compiled forward and backward, in a process of its own."""
    done = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, timeout=300,
                          env=os.environ | {"TORCHINDUCTOR_CACHE_DIR": str(cache_dir)})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_packed_cache_unpacked_elsewhere_loads_the_compiled_graphs(tmp_path):
    """What one visit compiled, packed, carried to another place (a fresh machine's checkout) and unpacked,
    is loaded there, not compiled again: both graphs (forward, backward) hit Inductor's cache."""
    first = compiled(tmp_path / "visit1" / "inductor")
    assert first.get("fxgraph_cache_miss") == 2 and not first.get("fxgraph_cache_hit"), first
    assert cache("pack", str(tmp_path / "visit1" / "inductor"), str(tmp_path / "inductor.tgz")).returncode == 0
    done = cache("unpack", str(tmp_path / "inductor.tgz"), str(tmp_path / "visit2" / "inductor"))
    assert done.returncode == 0, done.stderr
    again = compiled(tmp_path / "visit2" / "inductor")
    assert again.get("fxgraph_cache_hit") == 2 and not again.get("fxgraph_cache_miss"), again


def test_unpack_refuses_a_cut_or_foreign_archive_and_keeps_the_cache(tmp_path):
    kept = tmp_path / "runs" / "inductor"
    kept.mkdir(parents=True)
    (kept / "entry").write_text("compiled before")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("not a cache")
    foreign = tmp_path / "foreign.tgz"
    with tarfile.open(foreign, "w:gz") as tar:
        tar.add(tmp_path / "other", arcname="other")
    whole = tmp_path / "whole.tgz"
    with tarfile.open(whole, "w:gz") as tar:
        tar.add(kept, arcname="inductor")
    cut = tmp_path / "cut.tgz"
    cut.write_bytes(whole.read_bytes()[:-40])
    for archive, said in ((foreign, "outside inductor/"), (cut, "not a whole .tgz")):
        done = cache("unpack", str(archive), str(kept))
        assert done.returncode == 1 and said in done.stderr, done.stderr
        assert (kept / "entry").read_text() == "compiled before"


def test_pack_over_its_limit_leaves_the_archive_as_it_was(tmp_path):
    (tmp_path / "inductor").mkdir()
    (tmp_path / "inductor" / "kernel").write_bytes(os.urandom(1 << 20))  # does not compress
    archive = tmp_path / "inductor.tgz"
    archive.write_text("the last packing")
    done = cache("pack", str(tmp_path / "inductor"), str(archive), LIMIT_MIB="0")
    assert done.returncode == 0 and "over 0" in done.stderr, done.stderr
    assert archive.read_text() == "the last packing"
    assert cache("pack", str(tmp_path / "inductor"), str(archive)).returncode == 0
    with tarfile.open(archive) as tar:
        assert tar.getnames() == ["inductor", "inductor/kernel"]


def test_check_passes_a_whole_archive_of_the_name_only(tmp_path):
    (tmp_path / "inductor").mkdir()
    (tmp_path / "inductor" / "kernel").write_text("compiled")
    archive = tmp_path / "inductor.tgz"
    assert cache("pack", str(tmp_path / "inductor"), str(archive)).returncode == 0
    assert cache("check", str(archive), "inductor").returncode == 0
    done = cache("check", str(archive), "other")
    assert done.returncode == 1 and "outside other/" in done.stderr
