"""The skip policy of tests/skips.py, run on small test files in a separate pytest process."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_pytest(tmp_path: Path, body: str, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_example.py").write_text("import pytest\n\n" + body)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.skips", "-q", "-p", "no:cacheprovider",
                           str(tmp_path / "test_example.py")], cwd=tmp_path, capture_output=True, text=True,
                          env=os.environ | {"PYTHONPATH": str(ROOT), **env}, timeout=120)


def test_a_skip_for_missing_data_fails_the_run(tmp_path):
    proc = run_pytest(tmp_path, "def test_a():\n    pytest.skip('Multi30k not found under /x')\n\n"
                                "def test_b():\n    pass\n")
    assert proc.returncode == 1, proc.stdout
    assert "skipped for a reason not allowed" in proc.stdout and "Multi30k not found under /x" in proc.stdout


def test_a_missing_dependency_fails_the_run(tmp_path):
    proc = run_pytest(tmp_path, "pytest.importorskip('a_module_that_is_not_there')\n\ndef test_a():\n    pass\n")
    assert proc.returncode == 1, proc.stdout
    assert "a_module_that_is_not_there" in proc.stdout


def test_an_allowed_skip_passes_and_is_named(tmp_path):
    proc = run_pytest(tmp_path, "def test_a():\n    pytest.skip('chromium could not be installed (see log)')\n",
                      TRANSFORMER_SKIP_BROWSER="1")
    assert proc.returncode == 0, proc.stdout
    assert "WARNING: the browser test of the web page did not run" in proc.stdout


def test_an_allowed_reason_is_refused_where_its_condition_does_not_hold(tmp_path):
    proc = run_pytest(tmp_path, "def test_a():\n    pytest.skip('chromium could not be installed')\n",
                      TRANSFORMER_SKIP_BROWSER="")
    assert proc.returncode == 1, proc.stdout
