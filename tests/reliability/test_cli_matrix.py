"""Every command under bad values (issue 44), generated from the parser: each path option of every
command (missing, a folder where a file is expected and the reverse, an empty input, a file of another
kind, an output of the wrong kind) and each number option (NaN, inf, -1, 0, huge) is refused before
any work, in one line naming the option or the path and exit 1, or by argparse (exit 2: its usage and
one error line); never a traceback, never an internal error (exit 70).

The other arguments are good (``GOOD``, checked to succeed), so only the bad value can be refused:
a copy of the committed run tests/data/decode_reference, a 4-step parsing run, the tiny preset and
small files. A value a command accepts by design (``ACCEPTED``: --alpha 0 is no length penalty) runs
too and must succeed. Where a command would start its long work (training steps, a download, binding
a port) it is stopped (``WorkStarted``): a bad value that got that far was not refused. In-process
(``main``), each case a fraction of a second; counted in the ledger's cli_cases and cli_tracebacks.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import write_slice
from tests.reliability.ledger import Ledger
from transformer.cli import _beside_input, _in_path, _input, _standard, build_parser, main
from transformer.config import ServeLimits

RUN = Path(__file__).parents[1] / "data" / "decode_reference"  # read only: the cases use a copy
ROOT = os.geteuid() == 0  # root writes into any folder: no unwritable one to offer

# Each command's good arguments ({name}: a path of the scene, {tmp}: the case's own folder). A bad value
# replaces its option's value here, or is added.
TRAIN_DATA = ['data.train_src="{train_src}"', 'data.train_tgt="{train_tgt}"', 'data.valid_src="{valid_src}"',
              'data.valid_tgt="{valid_tgt}"', "data.vocab_size=500", "train.threads=1"]
GOOD: dict[str, list[str]] = {
    "train": ["train", "tiny", "--out", "{tmp}/run", "--quiet", *[x for s in TRAIN_DATA for x in ("--set", s)]],
    "translate": ["translate", "{run}", "--input", "{text}", "--output", "{tmp}/out.txt"],
    "score": ["score", "{run}", "--src", "{text}", "--tgt", "{de}", "--output", "{tmp}/scores.txt"],
    "evaluate": ["evaluate", "{run}", "--src", "{text}", "--ref", "{de}", "--json", "{tmp}/bleu.json"],
    "parse": ["parse", "{parse_run}", "--input", "{words}", "--output", "{tmp}/trees.txt"],
    "evaluate-parse": ["evaluate-parse", "--gold", "{tree}", "--test", "{tree}"],
    "linearize": ["linearize", "{tree}", "--out", "{tmp}/split"],
    "average": ["average", "{run}", "--last", "1", "--out", "{tmp}/avg.safetensors"],
    "params": ["params", "tiny"],
    "config": ["config", "tiny"],
    "preprocess": ["preprocess", "tiny", "--out", "{tmp}/store", "--spm", "{run}/spm.model",
                   *[x for s in TRAIN_DATA for x in ("--set", s)]],
    "prepare": ["prepare", "wmt14-en-de", "--dest", "{tmp}/wmt14"],
    "export": ["export", "{run}", "--out", "{tmp}/ct2"],
    "attention": ["attention", "{run}", "--src", "A dog runs.", "--tgt", "Ein Hund rennt.", "--out", "{tmp}/a.png"],
    "plot": ["plot", "{run}", "--out", "{tmp}/training.png"],
    "serve": ["serve", "{run}"],
}
NEEDS = {"--topk": ["--sample"], "--topp": ["--sample"], "--temperature": ["--sample"], "--seed": ["--sample"],
         "--mfu": ["--cost"], "--devices": ["--cost"]}  # options that only count beside another

# What each kind of path is offered: (label, value).
INPUT = [("missing", "{tmp}/missing.txt"), ("a folder", "{folder}"), ("empty", "{empty}")]
MODEL_FILE = [*INPUT, ("text", "{text}")]  # a weights file, a sentencepiece model, a run's weights
RUN_DIR = [("missing", "{tmp}/missing"), ("a file", "{text}"), ("not a run", "{folder}")]
CONFIG = [("missing", "{tmp}/missing.toml"), ("a folder", "{folder}"), ("not TOML", "{text}")]
FOLDER = [("missing", "{tmp}/missing"), ("a file", "{text}")]
UNWRITABLE = [] if ROOT else [("unwritable", "{readonly}/out")]
OUT_FOLDER = [("a file", "{text}"), ("under a file", "{text}/out"), ("empty", ""), *UNWRITABLE]  # "": the cwd
NUMBERS = {int: ["-1", "0", str(10**20)], float: ["nan", "inf", "-1", "0", "1e30"]}
DEVICES = ["cuda:99", "abacus"]

MODEL_FILES = {"--checkpoint", "--spm", "--init-from"}
UNTYPED_PATHS = {"config": CONFIG, "preset": CONFIG, "--mirror": FOLDER}
NUMBER_LISTS = {"--devices": int}  # comma-separated counts
NOT_PATHS_OR_NUMBERS = {"--set", "--host", "--heads", "--lang", "--src", "--tgt"}  # text; --device: DEVICES

# Values a command accepts by design, with why; they run too and must succeed. ("*": every command.)
ACCEPTED: dict[tuple[str, str, str], str] = {
    ("*", "--alpha", "0"): "no length penalty",
    **{(command, "--max-len-offset", "0"): "outputs no longer than their inputs"  # a parsing run's trees need more
       for command in ("translate", "evaluate", "attention", "serve")},
    ("*", "--batch-size", str(10**20)): "every sentence in one batch",
    ("translate", "--topk", "0"): "every token (the default)",
    ("translate", "--topk", str(10**20)): "every token",
    ("translate", "--seed", "0"): "a seed like any other",
    ("translate", "--temperature", "1e30"): "draws from the uniform distribution",
    ("translate", "--input", "empty"): "no lines in, none out",
    ("parse", "--input", "empty"): "no lines in, none out",
    ("average", "--last", str(10**20)): "every checkpoint there is, and says how many",
    ("serve", "--max-wait-ms", "0"): "batches what is queued, waiting for nothing",
    # the server's limits, but --max-wait-ms: a request waiting past --queue-timeout for others would time out
    **{("serve", "--" + f.name.replace("_", "-"), str(10**20) if f.type == "int" else "1e30"): "no bound in effect"
       for f in dataclasses.fields(ServeLimits) if "help" in f.metadata and f.name != "max_wait_ms"},
}


class WorkStarted(BaseException):
    """Raised where a command starts its long work: every check before it passed."""


class TooSlow(BaseException):
    """Raised when a case has run for a minute, whatever it is doing."""


@dataclass(frozen=True)
class Case:
    command: str
    option: str  # "--beam", or a positional's name ("run_dir")
    label: str  # the value's description, or the number itself
    value: str  # a template (paths) or the number
    index: int | None  # a positional's place in the command line

    @property
    def names(self) -> list[str]:
        """What the refusal must name: a number's or a device's option; a path or its option."""
        if self.label == self.value:
            return [self.option]
        return [self.option, self.value] if self.index is None else [self.value]

    @property
    def accepted(self) -> str | None:
        return ACCEPTED.get((self.command, self.option, self.label)) or ACCEPTED.get(("*", self.option, self.label))

    def argv(self, paths: dict[str, str]) -> list[str]:
        argv = [a.format(**paths) for a in GOOD[self.command]]
        value = self.value.format(**paths)
        if self.index is not None:
            argv[self.index] = value
        elif self.option in argv:
            argv[argv.index(self.option) + 1] = value
        else:
            argv += [*NEEDS.get(self.option, []), self.option, value]
        return argv


def subcommands() -> dict[str, argparse.ArgumentParser]:
    return next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices


def values(action: argparse.Action, outputs: dict) -> list[tuple[str, str]] | None:
    """The bad values offered to ``action`` as (label, value); None for an option this matrix does not
    know how to hurt (``test_every_command_and_option_is_covered`` fails on it)."""
    name = action.option_strings[0] if action.option_strings else action.dest
    if action.dest in outputs:
        _, suffixes, folder, _ = outputs[action.dest]
        if folder:
            return OUT_FOLDER
        suffix = suffixes[0] if suffixes else ".txt"
        return [("in a missing folder", "{tmp}/missing/out" + suffix), ("a folder", "{folder}"),
                ("under a file", "{text}/out" + suffix), ("empty", ""), *UNWRITABLE,
                *([("wrong suffix", "{tmp}/out.wrong")] if suffixes else [])]
    if action.type in (_in_path, _standard, _input, _beside_input):  # a path, or "-" for stdin or stdout, or refused
        given = [("no path", "")] if action.type is _in_path else []  # Path(""): the current folder
        if action.dest == "run_dir" or action.metavar == "RUN_DIR":
            return RUN_DIR + given
        return (MODEL_FILE if name in MODEL_FILES else INPUT) + given
    if action.type in (int, float) or name in NUMBER_LISTS:
        return [(v, v) for v in NUMBERS[action.type if action.type in NUMBERS else NUMBER_LISTS[name]]]
    if name == "--device":
        return [(v, v) for v in DEVICES]
    if name in UNTYPED_PATHS:
        return UNTYPED_PATHS[name]
    if action.choices is not None or action.nargs == 0 or name in NOT_PATHS_OR_NUMBERS:
        return []
    return None


def cases() -> list[Case]:
    out = []
    for command, parser in subcommands().items():
        outputs = parser.get_default("outputs") or {}
        positionals = [a for a in parser._actions if not a.option_strings]
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            name = action.option_strings[0] if action.option_strings else action.dest
            index = None if action.option_strings else 1 + positionals.index(action)
            out += [Case(command, name, label, value, index) for label, value in values(action, outputs) or []]
    return out


CASES = cases()


@pytest.fixture(scope="module")
def scene(tmp_path_factory, multi30k: Path) -> dict[str, str]:
    """The good files and folders every case starts from (never written to by a case that passes)."""
    root = tmp_path_factory.mktemp("scene")
    shutil.copytree(RUN, root / "run")
    (root / "run" / "metrics.jsonl").write_text('{"step": 10, "minutes": 0.5, "train_loss": 6.5, "lr": 0.001}\n')
    (root / "folder").mkdir()
    (root / "readonly").mkdir(mode=0o555)
    files = {"empty": "", "text": "A dog runs.\n", "de": "Ein Hund rennt.\n", "words": "The dog runs .\n",
             "tree": "(S (NP (DT The) (NN dog)) (VP (VBZ runs)) (. .))\n"}
    for name, text in files.items():
        (root / f"{name}.txt").write_text(text, encoding="utf-8")
    train_src, train_tgt = write_slice(multi30k, root, "train", 0, 600)
    valid_src, valid_tgt = write_slice(multi30k, root, "val", 0, 50)
    return {"run": str(root / "run"), "folder": str(root / "folder"), "readonly": str(root / "readonly"),
            **{name: str(root / f"{name}.txt") for name in files}, "train_src": str(train_src),
            "train_tgt": str(train_tgt), "valid_src": str(valid_src), "valid_tgt": str(valid_tgt)}


@pytest.fixture
def paths(scene: dict[str, str], tmp_path: Path, request, monkeypatch) -> dict[str, str]:
    """The scene, the case's own folder and, for `parse`, the parsing run; the command's long work
    stopped where it would start, and a minute for the case, whatever it does."""
    import uvicorn

    import transformer.prepare
    import transformer.store
    import transformer.train

    params = request.node.callspec.params
    command = params["case"].command if "case" in params else params["command"]
    parse_run = request.getfixturevalue("tiny_parse_run") if "{parse_run}" in GOOD[command] else ""  # trains

    def started(*args, **kwargs):
        raise WorkStarted()

    for owner, name in ((uvicorn.Server, "run"), (transformer.train.Trainer, "run"), (subprocess, "call"),
                        (transformer.prepare, "_download"), (transformer.store, "write_store")):
        monkeypatch.setattr(owner, name, started)

    def too_slow(signum, frame):
        raise TooSlow()

    previous = signal.signal(signal.SIGALRM, too_slow)
    signal.alarm(60)
    yield scene | {"tmp": str(tmp_path), "parse_run": str(parse_run)}
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def run(argv: list[str], capsys, ledger) -> tuple[int | str, str]:
    """``main(argv)`` in this process: its exit status ("started" where it reached its long work, "too
    slow" after a minute) and its stderr, recorded in the ledger."""
    with ledger.command() as ran:
        try:
            ran["status"] = main(argv)
        except SystemExit as e:  # argparse's usage errors
            ran["status"] = e.code
        except WorkStarted:
            ran["status"] = "started"
        except TooSlow:
            ran["status"] = "too slow"
        finally:
            ran["stderr"] = capsys.readouterr().err
    return ran["status"], ran["stderr"]


def test_every_command_and_option_is_covered():
    """A new command needs its good arguments here, a new option a kind of bad value."""
    assert set(GOOD) == set(subcommands())
    unknown = [f"{command} {a.option_strings or a.dest}" for command, parser in subcommands().items()
               for a in parser._actions if values(a, parser.get_default("outputs") or {}) is None]
    assert not unknown, f"options the matrix does not know how to hurt: {unknown}"


@pytest.mark.parametrize("command", sorted(GOOD))
def test_the_good_arguments_are_good(command, paths, capsys):
    """Each command's good arguments succeed (or reach their long work), so a case that is refused was
    refused for its bad value. Not a case of the matrix: counted in a ledger of its own."""
    argv = [a.format(**paths) for a in GOOD[command]]
    status, err = run(argv, capsys, Ledger())
    assert status in (0, "started"), err


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.command} {c.option} {c.label}")
def test_a_bad_value_is_refused_in_one_line(case, paths, capsys, ledger):
    argv = case.argv(paths)
    status, err = run(argv, capsys, ledger)
    assert status != 70 and "Traceback" not in err, err
    if case.accepted:
        assert status in (0, "started"), f"{case.accepted}, but: {err}"
        return
    names = [n.format(**paths) for n in case.names]
    lines = err.splitlines()
    assert status in (1, 2), f"exit {status}: {' '.join(argv)}\n{err}"
    if status == 2:  # argparse: its usage, then one error line
        assert lines[0].startswith("usage: ") and sum(": error: " in line for line in lines) == 1, err
    else:
        assert len(lines) == 1, err
    assert any(n in lines[-1] for n in names), f"{lines[-1]!r} names none of {names}"
