"""The benchmark scripts as a person runs them by hand: `--help` and a run folder with nothing trained in it end
in a message, never in a traceback (the workers speed.py starts print their usage)."""

from __future__ import annotations

import json
import os
import re
import runpy
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
def test_help_prints_the_usage(script, monkeypatch, capsys):
    """In this process, as the --results checks below run (a process per script cost seconds each, its imports):
    an error at import or in the parser is an exception here, where a subprocess printed its traceback. What the
    script imports is found as by hand: beside it and in the installed package, not in the checkout pytest runs
    from (a script that needs `tests` puts the checkout on its path itself)."""
    root = BENCHMARKS.parent.resolve()
    monkeypatch.setattr(sys, "path", [str(BENCHMARKS)] + [p for p in sys.path if Path(p or ".").resolve() != root])
    for name in [m for m in sys.modules if m == "tests" or m.startswith("tests.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.chdir(BENCHMARKS.parent)
    monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / script), "--help"])
    with pytest.raises(SystemExit) as stopped:
        runpy.run_path(str(BENCHMARKS / script), run_name="__main__")
    assert stopped.value.code in (0, None) and capsys.readouterr().out.strip()


@pytest.mark.parametrize("script", sorted(NO_RUN))
def test_a_folder_without_checkpoints_is_refused_in_one_line(script, tmp_path):
    done = run(script, *NO_RUN[script], str(tmp_path / "missing"))
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith(f"{tmp_path / 'missing'}: no checkpoints there")


@pytest.mark.parametrize("args", [[], ["ours"], ["ct2_file", "model", "--input", "a"]])
def test_the_speed_worker_by_hand_prints_its_usage(args):
    done = run("speed_worker.py", *args)
    assert done.returncode == 2 and "Traceback" not in done.stderr and "speed_worker.py ct2_file" in done.stderr


WRITERS = sorted(s for s in SCRIPTS if "write_result(" in (BENCHMARKS / s).read_text("utf-8"))
NEEDS = {  # script -> arguments it cannot start without, besides --results
    "ct2_backend.py": ["--run", "unused"], "gpu_decode.py": ["--before", "unused"],
    "gpu_attention.py": ["--device", "cpu"], "gpu_layernorm.py": ["--device", "cpu"],
}


def test_every_script_that_writes_results_takes_the_folder_from_one_option():
    """Each writes its files through provenance.write_result into --results (table3.py's also holds its rows);
    none names the committed folder itself, so a trial run can leave the published readings alone."""
    assert len(WRITERS) >= 20, WRITERS
    for script in WRITERS:
        text = (BENCHMARKS / script).read_text("utf-8")
        assert ("add_results_option(parser" in text or "add_common_arguments(parser)" in text
                or script == "table3.py" and '"--results", type=Path, default=RESULTS' in text), script
        assert 'ROOT / "benchmarks" / "results"' not in text and not re.search(r"^RESULTS = ", text, re.M), script


@pytest.mark.parametrize("script", WRITERS)
def test_a_results_path_that_is_no_folder_is_refused_before_any_work(script, tmp_path, monkeypatch, capsys):
    """Run in this process (a new one per script would cost more than its check): the script stops at the option,
    before any measuring."""
    taken = tmp_path / "a_file"
    taken.write_text("", encoding="utf-8")
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # table3.py on the CPU hides the GPU from the process it runs in
    monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / script), *NEEDS.get(script, []), "--results", str(taken)])
    with pytest.raises(SystemExit) as stopped:
        runpy.run_path(str(BENCHMARKS / script), run_name="__main__")
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"error: --results {taken}: not a folder")


@pytest.mark.parametrize("script, mode", [("speed.py", "--markdown"), ("bf16_decode.py", "--markdown"),
                                          ("multi30k.py", "--markdown"), ("wu2021.py", "--check")])
def test_a_mode_that_reads_the_results_makes_no_folder(script, mode, tmp_path, monkeypatch, capsys):
    """A typo in --results of a mode that only reads what is there was refused, and left an empty folder."""
    typo = tmp_path / "typo"
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / script), mode, "--results", str(typo)])
    with pytest.raises(SystemExit) as stopped:
        runpy.run_path(str(BENCHMARKS / script), run_name="__main__")
    assert stopped.value.code == 2 and not typo.exists()
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"error: --results {typo}: no such folder")


def test_write_result_replaces_the_files_whole(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from provenance import write_result

    write_result(tmp_path, "x", {"a": 1}, lambda r: f"# page {r['a']}\n")
    write_result(tmp_path, "x", {"a": 2})
    assert json.loads((tmp_path / "x.json").read_text("utf-8")) == {"a": 2}
    assert (tmp_path / "x.md").read_text("utf-8") == "# page 1\n"  # no page given: the earlier one stays

    def slip(result: dict) -> str:
        raise KeyError("a key the page reads")

    with pytest.raises(KeyError):  # the reading is kept, the page left as it was
        write_result(tmp_path, "x", {"a": 3}, slip)
    assert json.loads((tmp_path / "x.json").read_text("utf-8")) == {"a": 3}
    assert (tmp_path / "x.md").read_text("utf-8") == "# page 1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json", "x.md"]  # no part file left
    umask = os.umask(0)
    os.umask(umask)
    assert oct((tmp_path / "x.json").stat().st_mode & 0o777) == oct(0o666 & ~umask)  # as a plain write's
