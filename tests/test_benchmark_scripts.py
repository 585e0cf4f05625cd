"""The benchmark scripts as a person runs them by hand: `--help` and a run folder with nothing trained in it end
in a message, never in a traceback (the workers speed.py starts print their usage)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if 'if __name__ == "__main__":' in p.read_text("utf-8"))
NO_RUN = {  # script -> its arguments naming a run folder
    "bf16_decode.py": ["--run"], "compile_step.py": ["--run"], "ct2_backend.py": ["--run"],
    "decode_reference.py": ["--run"], "decoding_features.py": ["--run"], "export.py": ["--run"],
    "search_work.py": [], "serve_load.py": ["--run"],
}


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True,
                          timeout=300, cwd=BENCHMARKS.parent)


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_prints_the_usage(script):
    done = run(script, "--help")
    assert done.returncode == 0 and "Traceback" not in done.stderr and done.stdout.strip(), done.stderr[-2000:]


@pytest.mark.parametrize("script", sorted(NO_RUN))
def test_a_folder_without_checkpoints_is_refused_in_one_line(script, tmp_path):
    done = run(script, *NO_RUN[script], str(tmp_path / "missing"))
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith(f"{tmp_path / 'missing'}: no checkpoints there")


@pytest.mark.parametrize("args", [[], ["ours"], ["ct2_file", "model", "--input", "a"]])
def test_the_speed_worker_by_hand_prints_its_usage(args):
    done = run("speed_worker.py", *args)
    assert done.returncode == 2 and "Traceback" not in done.stderr and "speed_worker.py ct2_file" in done.stderr
