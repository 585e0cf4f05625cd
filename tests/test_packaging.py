"""What a plain install gets (`pip install .`, a wheel): the presets and the page travel inside the package,
and the commands run from any folder without the checkout. Editable installs, which the README's commands
make, read them from the checkout and hid that a wheel held no preset: every command, --help too, failed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import transformer

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_wheel_holds_the_presets_and_runs_outside_the_checkout(tmp_path: Path) -> None:
    source = tmp_path / "source"  # built from a copy: an in-tree build writes build/ into the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy(ROOT / name, source / name)
    for name in ("transformer", "configs"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(source)], check=True, cwd=tmp_path, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert wheel.name.startswith(f"transformer-{transformer.__version__}-"), wheel.name  # the one version
    with zipfile.ZipFile(wheel) as z:
        held = set(z.namelist())
    presets = {f"transformer/configs/{p.relative_to(ROOT / 'configs')}" for p in (ROOT / "configs").rglob("*.toml")}
    assert presets and presets <= held, sorted(presets - held)
    assert {f"transformer/web/{p.name}" for p in (ROOT / "transformer" / "web").iterdir()} <= held
    assert any(name.endswith("/LICENSE") for name in held)

    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], cwd=elsewhere, env=env, capture_output=True, text=True)

    where = run("-c", "import transformer.config as c; print(c.__file__); print(c.PRESET_DIR)").stdout.split()
    assert where == [str(site / "transformer" / "config.py"), str(site / "transformer" / "configs")]
    said = run("-m", "transformer", "--version")
    assert said.returncode == 0 and said.stdout.startswith(f"transformer {transformer.__version__} (torch "), said
    helped = run("-m", "transformer", "--help")
    assert helped.returncode == 0 and "translate" in helped.stdout, helped.stderr
    for preset in ("tiny", "E", "parse"):  # one of configs/, one of configs/table3/, the one --help reads
        counted = run("-m", "transformer", "params", preset)
        assert counted.returncode == 0 and counted.stdout.startswith(f"{preset}: "), counted.stderr
