"""`transformer <command>`: a thin command line; each command loads a config and calls one function.

Exit status: 0 success, 1 a user error (one line on stderr, no traceback), 2 a usage error,
70 an internal error (a bug: one line on stderr, the traceback in a log file to report),
130 / 143 training stopped by SIGINT / SIGTERM after finishing its step and writing a checkpoint (129: SIGHUP,
its terminal closed), and any command (training before its first step too) stopped by them elsewhere, in one
line ("interrupted" / "terminated"), the output file it was writing removed;
under `train --nproc N`, 128 + S when a rank was killed by signal S (named in one line); 141 (128 +
SIGPIPE), without a word, when what read the output closed it (`transformer translate RUN | head`).
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import dataclasses
import errno
import gzip
import importlib.metadata
import inspect
import io
import itertools
import json
import os
import platform
import queue
import re
import select
import shlex
import signal
import stat
import sys
import tempfile
import threading
import tomllib
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, NoReturn, TypeVar

from .config import (EARLY_STOPS, LENGTH_NORMS, MAX_THREADS, ConfigError, DecodeConfig, ServeLimits, language_code,
                     primary_language, resolve_config_path)
from .errors import Terminated, UserError, install_extra, job_world, out_of_memory, stops_held, summary
from . import __version__, files
from .files import OutputError, check_output

T = TypeVar("T")
EPILOG = ("Paper sections are cited in --help texts; see README.md, docs/ and PAPER_MAP.md in the source "
          "repository.")


@dataclass(frozen=True)
class Command:
    """One `transformer` command: its --help texts, the function that adds its options, its handler."""

    help: str
    description: str
    name: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], None]
    examples: tuple[str, ...] = ()  # whole command lines, shown at the end of its --help as written


COMMANDS: list[Command] = []  # each registered beside its handler; --help lists them in this order


def command(name: str, arguments: Callable[[argparse.ArgumentParser], None],
            examples: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Registers the decorated handler as `transformer NAME`, with the options ``arguments`` adds. Its
    docstring is its --help: the first line the one-line summary, the rest the description; ``examples`` (a test
    parses each) end it."""
    def register(run: Callable[[argparse.Namespace], None]) -> Callable[[argparse.Namespace], None]:
        summary, _, description = inspect.cleandoc(run.__doc__ or "").partition("\n\n")
        summary = summary.rstrip(".")
        if summary[1:2].islower():  # "Train a model" is listed as "train a model"; "HTTP API" stays
            summary = summary[0].lower() + summary[1:]
        COMMANDS.append(Command(summary, " ".join(description.split()), name, arguments, run, examples))
        return run
    return register


def _set_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value, e.g. --set train.max_steps=2000 (repeatable)")


def _config_argument(p: argparse.ArgumentParser, dest: str = "config", then: str = "") -> None:
    """The positional config file or preset name of train, params, config and preprocess."""
    p.add_argument(dest, type=_preset, help="config file (configs/multi30k_en_de.toml) or preset name (base, big, "
                   f"C4, ...; the preset even where a folder of that name is here){then}")


def _train_arguments(p: argparse.ArgumentParser) -> None:
    _config_argument(p)
    _output(p, "--out", folder=True, required=True, help="run folder")
    _set_option(p)
    p.add_argument("--resume", action="store_true", help="continue from the newest intact checkpoint in --out")
    p.add_argument("--allow-config-change", action="store_true",
                   help="with --resume: accept a config that changes the data, the optimisation or the model "
                        "where every weight keeps its shape (dropout, say; refused otherwise, with the list of "
                        "fields); never the vocabulary's settings, model.norm or train.init_qkv_gain (docs/"
                        "training.md); the changes are logged")
    p.add_argument("--init-from", type=_in_path, metavar="RUN_DIR|WEIGHTS", help="fine-tune: start from another run's "
                   "weights (a run folder: the average of its last decode.average_last checkpoints, as translate "
                   "uses; or a .safetensors weights file of a run) and take its spm.model unchanged; the optimizer "
                   "and the schedule (warmup included) start afresh from this config")
    p.add_argument("--quiet", action="store_true", help="no progress bar or log lines on the terminal")
    p.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="data-parallel processes on this machine (§5.2: one machine, 8 GPUs; here one per GPU, gloo "
                        "on CPU): runs this command under torchrun. Many machines: torchrun --nnodes M "
                        "--nproc-per-node G -m transformer train ARGS. Tokens per step = train.max_tokens x "
                        "update_freq x processes (default: 1; at most one per GPU, else one per CPU core)")


@command("train", _train_arguments, (
    "transformer train multi30k_en_de --out runs/mine",
    "transformer train configs/multi30k_en_de.toml --out runs/mine --set train.max_steps=4000",
    "transformer train multi30k_en_de --out runs/mine --resume",
    "torchrun --nproc-per-node 2 -m transformer train multi30k_en_de --out runs/two",
))
def cmd_train(args: argparse.Namespace) -> None:
    """Train a model (§5) into a run folder.

    Train from a TOML config (a path or a preset name from configs/). Writes config.toml, spm.model (and
    spm.json, what it was trained from), checkpoints/, train.log, metrics.jsonl, tb/ and, when done,
    summary.json (docs/training.md). Every config key is documented beside its default in
    transformer/config.py; after the paper (off by default): train.keep_best = "valid_loss" |
    "valid_smoothed_loss" | "dev_bleu" keeps best.safetensors (translate --checkpoint best), train.patience = N
    (with keep_best) stops after N evaluations without improvement of its metric, data.subword_alpha = 0.1
    samples a new BPE-dropout segmentation of the training text every epoch.
    """
    import torch

    from .config import dump_toml, load_config
    from .train import data_paths, train

    if (stop := _lost_stop()) is not None:  # a rank's first seconds are these imports, where it can be lost
        raise stop
    if isinstance(sys.stdout, _ClosedOutput):  # started with it closed (>&-): its log lines are train.log's too
        sys.stdout = open(os.devnull, "w", encoding="utf-8")

    cfg = load_config(args.config, args.set)  # errors in the config show before any process starts
    own = Path(args.out) / "config.toml"  # where training writes the run's resolved config
    given = resolve_config_path(args.config)
    if (own.exists() and own.samefile(given) and not (Path(args.out) / "train.log").exists()
            and given.read_text(encoding="utf-8") != dump_toml(cfg)):
        raise ConfigError(f"{given}: training writes the run's resolved config to {own}, over your file (its "
                          f"comments and layout): give it another name, e.g. {own.with_name('experiment.toml')}")
    if args.nproc > 1 and "WORLD_SIZE" in os.environ:  # it was ignored: a WORLD_SIZE left set halved the batch
        raise ConfigError(f"--nproc {args.nproc}: this process is already one of a job (WORLD_SIZE="
                          f"{os.environ['WORLD_SIZE']} is set, as torchrun sets it): under torchrun leave out --nproc; "
                          "else unset WORLD_SIZE")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    slots = gpus or os.cpu_count() or 1
    if not 1 <= args.nproc <= slots:
        raise ConfigError(f"--nproc {args.nproc}: give 1 .. {slots}, one process per "
                          f"{'GPU' if gpus else 'CPU core'} of this machine")
    if args.nproc > 1 and cfg.train.cuda_graphs:  # the trainer refuses it too, where torchrun starts it
        raise ConfigError(f"--nproc {args.nproc} with train.cuda_graphs: CUDA graphs are for one process (with data "
                          "parallelism the gradients' all-reduce would be captured in the graphs)")
    if args.nproc > 1:
        # one node, N processes: the same command under torchrun (many nodes: call torchrun directly)
        data_paths(cfg)  # a data file not set or not found, before any process starts
        argv = ["train", args.config, "--out", str(args.out), *[x for kv in args.set for x in ("--set", kv)],
                *(["--resume"] if args.resume else []), *(["--quiet"] if args.quiet else []),
                *(["--allow-config-change"] if args.allow_config_change else []),
                *(["--init-from", str(args.init_from)] if args.init_from else [])]
        from .distributed import launch_local

        if not args.quiet:
            print(f"launching: torchrun --standalone --nproc-per-node={args.nproc} -m transformer "
                  f"{shlex.join(argv)}", file=sys.stderr)
        if code := launch_local(args.nproc, argv):
            raise SystemExit(code)
        return
    train(cfg, Path(args.out), resume=args.resume, quiet=args.quiet, allow_config_change=args.allow_config_change,
          init_from=args.init_from)


def _model_options(p: argparse.ArgumentParser) -> None:
    """The run and the weights a decoding command uses, and where."""
    p.add_argument("run_dir", type=_in_path, help="run folder written by `transformer train`")
    p.add_argument("--checkpoint", type=_in_path, help="weights file to use, or 'best' for the run's best.safetensors "
                   "(train.keep_best) (default: average the run's last decode.average_last checkpoints, §6.1)")
    p.add_argument("--int8", action="store_true", help="int8 dynamic quantization of the linear layers: faster "
                   "on CPU, BLEU within a few tenths (benchmarks/results/speed.md); a line's output may change with "
                   "its batch (docs/decoding.md)")
    p.add_argument("--bf16", action="store_true", help="decode with the weights, products and cached keys and "
                   "values in bf16 (scores stay fp32): for GPUs; on a CPU --int8 was faster "
                   "(benchmarks/results/bf16_decode.md)")
    p.add_argument("--device", help="where to decode: cpu, cuda, cuda:N (default: a GPU when there is one; the "
                   "CPU with --int8)")
    p.add_argument("--threads", type=int, metavar="N", help="CPU threads for the model's operations (default: "
                   "torch's, one per core, or OMP_NUM_THREADS): fewer, to run several decoders side by side")


def _decode_options(p: argparse.ArgumentParser, parsing: bool = False) -> None:
    """The search's options; their help cites the paper's values: §6.1's for translation, §6.3's (the parse
    preset's decoding) for ``parsing``."""
    _model_options(p)
    paper, section = DecodeConfig(), "§6.1"
    if parsing:  # the parse preset's, §6.3's: the package's own TOML read as it is (config.read_toml and a
        # config's validation import torch, which --help and the commands that need no model do without)
        paper = DecodeConfig(**tomllib.loads(resolve_config_path("parse").read_text(encoding="utf-8"))["decode"])
        section = "§6.3"
    p.add_argument("--beam", type=int, help=f"beam size (default: the run's decode.beam_size; {section}: "
                   f"{paper.beam_size}); 1 = greedy")
    p.add_argument("--alpha", type=float, help=f"length penalty α, GNMT's exponent (with --length-norm length: "
                   f"of |Y|) (default: the run's; {section}: {paper.alpha})")
    _length_norm_option(p)
    p.add_argument("--max-len-offset", type=int, help="maximum output length = input length + this (default: the "
                   f"run's; {section}: {paper.max_len_offset})")
    p.add_argument("--batch-size", type=int, help="sentences per decoding batch (default: the run's, "
                   f"{paper.batch_size} unless it says otherwise)")
    p.add_argument("--early-stop", choices=EARLY_STOPS, help="when beam search stops a sentence: bound "
                   "(§6.1): once no alive beam can beat its best finished one; top: also once the step's best "
                   "candidate ends (OpenNMT-py's rule: fewer steps, not exact) (default: the run's "
                   f"decode.early_stop, {paper.early_stop} unless it says otherwise)")


def _length_norm_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--length-norm", choices=LENGTH_NORMS, help="what log P is divided by: gnmt (§6.1): "
                   "((5 + |Y|) / 6)^α; length: |Y|^α, as fairseq's --lenpen, Hugging Face and CTranslate2 "
                   "(default: the run's decode.length_norm, gnmt unless it says otherwise)")


def _ensemble_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ensemble", type=_in_path, nargs="+", default=[], metavar="RUN_DIR", help="more run folders "
                   "(same vocabulary, languages and task) whose models decode together with RUN_DIR's: the mean of "
                   "their probabilities at each step, each from its own averaged checkpoints (not in the paper); "
                   "give them after RUN_DIR, or end their list with -- and RUN_DIR after it (the other options "
                   "before them), else RUN_DIR is taken as one of them")


def _unconstrained_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--unconstrained", action="store_true", help="parsing runs whose beam writes only well-formed "
                   "trees of the input (decode.constrained: ptb_sample_parse.toml's; the paper's parse.toml "
                   "decodes freely already): let it write any sequence, as the paper, and repair ill-formed trees "
                   "afterwards")


def _decode_overrides(args: argparse.Namespace) -> dict[str, object]:
    """`serve`'s decoding options as ``decode.*`` config fields: they replace the run's own as the
    defaults of requests that do not say, and are checked as a request's options (``serve.serve``)."""
    given = {"beam_size": args.beam, "alpha": args.alpha, "length_norm": args.length_norm,
             "max_len_offset": args.max_len_offset,
             "batch_size": args.batch_size, "early_stop": args.early_stop}
    return {k: v for k, v in given.items() if v is not None}


@contextlib.contextmanager
def _named_option(option: str):
    """An error reading the file an option names (a DataError, a TreeError: "x.txt: cannot read"), said with
    the option first ("--test x.txt: cannot read"), as the commands' own checks say it."""
    from .data import DataError
    from .trees import TreeError

    try:
        yield
    except (DataError, TreeError) as e:
        raise type(e)(f"{option} {e}") from None


def _request(args: argparse.Namespace):
    """The command's decoding options as the one request every decoding command makes
    (``request.DecodeRequest``: what is not given is the run's own). The files of prefixes and
    constraints are read here, before any input."""
    from .data import read_lines
    from .request import DecodeRequest

    def given(name: str):
        return getattr(args, name, None)

    def lines(option: str, path: Path) -> list[str]:  # an error names the option, as --input's does
        with _named_option(option):
            return read_lines(path)

    prefixes = None if given("prefix") is None else lines("--prefix", args.prefix)
    constraints = (None if given("constraints") is None
                   else [line.split("\t") for line in lines("--constraints", args.constraints)])
    return DecodeRequest(beam_size=given("beam"), alpha=given("alpha"), length_norm=given("length_norm"),
                         max_len_offset=given("max_len_offset"),
                         early_stop=given("early_stop"), batch_size=given("batch_size"), nbest=given("nbest"),
                         scores=bool(given("scores")), alignment=bool(given("alignment")), prefixes=prefixes,
                         constraints=constraints, sample=bool(given("sample")), topk=given("topk"),
                         topp=given("topp"), temperature=given("temperature"), seed=given("seed"))


def _translator(args: argparse.Namespace, request, total: int | None = None):
    """The run's model, with ``request`` checked against it (``Translator.check``; against the input's
    number of lines too, ``total``, when they are a file counted first) before stdin is read, and what
    loading it said. The command prints that (``_tell``) once its own checks have passed: an error comes
    first, not after stdin, and alone."""
    from .translator import Translator

    said: list[str] = []
    translator = Translator(args.run_dir, args.checkpoint, log=said.append, int8=args.int8, bf16=args.bf16,
                            device=args.device,
                            decode={"constrained": False} if getattr(args, "unconstrained", False) else None,
                            ensemble=getattr(args, "ensemble", ()))
    if getattr(args, "unconstrained", False) and translator.cfg.data.task != "parse":  # else taken without a word
        raise ConfigError(f"--unconstrained: {args.run_dir} is a translation run (data.task = "
                          f"{translator.cfg.data.task!r}), whose search has no tree constraint to lift")
    translator.check(request, total=total)
    return translator, said


def _tell(said: list[str]) -> None:
    """What loading the model said (``_translator``), on stderr."""
    for message in said:
        print(message, file=sys.stderr)


def _translate_lines(translator, lines: list[str], request) -> list[str]:
    """``translator.translate`` with a progress bar at a terminal; into a log, where a bar's redraws do not
    belong, one line first, so that a long decode (a parsing run's, minutes) does not look hung."""
    long = len(lines) > BAR_LINES
    if long and not sys.stderr.isatty():
        print(_unbarred(len(lines)), file=sys.stderr, flush=True)
    return translator.translate(lines, request, progress=long and sys.stderr.isatty())


def _unbarred(n: int) -> str:
    """The line said in a bar's place, into a log, of a decode of ``n`` lines: one that takes minutes does not look
    hung."""
    return f"decoding {n:,} sentences (no progress bar: stderr is not a terminal)"


BAR_LINES = 100  # more input lines than this get a progress bar (at a terminal)
CHUNK = 10_000  # input lines (pairs for `score`) read, decoded and written at a time: memory stays bounded


def _at_terminal(path: Path | None) -> bool:
    """Whether a command's input, ``path`` or stdin when None, is typed at a terminal."""
    return path is None and sys.stdin is not None and sys.stdin.isatty()


def _chunks(items: Iterable[T], path: Path | None, ready: bool = True) -> Iterator[list[T]]:
    """``items`` read from ``path`` (stdin when None) ``CHUNK`` at a time, so that a command writes the
    outputs of a long input as it goes; at a terminal one at a time, each answered as it is typed. On a
    pipe (stdin, ``ready``), as many as have come, up to ``CHUNK``: a program that writes a line and waits
    for its answer gets it (``_ready_chunks``), and ``cat corpus |`` still decodes in full chunks, read
    while the last one decodes. ``ready`` False keeps a pipe's chunks whole, for outputs that hang on
    where the chunks end (``--sample``'s draws)."""
    if path is None and ready and not _at_terminal(path):
        yield from _ready_chunks(items, CHUNK)
        return
    items = iter(items)
    size = 1 if _at_terminal(path) else CHUNK
    while chunk := list(itertools.islice(items, size)):
        yield chunk


def _ready_chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Chunks of ``items`` as they become ready: the first item waited for, then those already read, at
    most ``size``. A thread reads ahead (no more than ``size`` items, so memory stays bounded) while the
    caller decodes; an error reading raises here, after the items before it."""
    end = object()  # items are lines or pairs, never this nor an exception (what reading raised, carried over)
    ahead: queue.Queue = queue.Queue(maxsize=size)

    def read() -> None:
        try:
            for item in items:
                ahead.put(item)
        except BaseException as e:  # noqa: BLE001 - carried over to the caller's thread, raised there
            ahead.put(e)
        ahead.put(end)

    threading.Thread(target=read, name="input", daemon=True).start()
    pending = ahead.get()  # the first item of a chunk is waited for
    while pending is not end:
        if isinstance(pending, BaseException):
            raise pending
        chunk, pending = [pending], None
        while len(chunk) < size:
            try:
                got = ahead.get_nowait()
            except queue.Empty:
                break
            if got is end or isinstance(got, BaseException):
                pending = got
                break
            chunk.append(got)
        yield chunk
        if pending is None:
            pending = ahead.get()


def _decoded(args: argparse.Namespace, translator, request, total: int | None, said: list[str]
             ) -> Iterator[tuple[list[str], list[list[tuple[str, float]]]]]:
    """Each chunk of the input lines (``--input``, else stdin) with its outputs (``Translator.stream``),
    as soon as it is decoded. What loading the model ``said`` is told (``_tell``) before stdin is read,
    or once a file's first lines have passed their checks. A bar of sentences shows on a terminal when
    the outputs do not go to it."""
    from .data import iter_lines

    if args.input is None:
        _tell(said)
    lines = iter_lines(Path("/dev/stdin") if args.input is None else args.input)
    bar = (sys.stderr.isatty() and not _at_terminal(args.input) and (total is None or total > BAR_LINES)
           and (args.output is not None or not sys.stdout.isatty()))
    if total is not None and total > BAR_LINES and not sys.stderr.isatty():
        said.append(_unbarred(total))  # said with what loading said, once the first lines have passed their checks
    return translator.stream(_chunks(lines, args.input, ready=not request.sample), request, progress=bar, total=total,
                             checked=None if args.input is None else lambda: _tell(said))


def _count_lines(path: Path | None) -> int | None:
    """The number of lines of an input file, read through once before the model loads: a file that cannot
    be read is refused first, and the prefixes and constraints are checked against its lines. None for
    stdin and for a pipe given as a file (`--input <(zcat corpus.gz)`), which can be read once only."""
    from .data import DataError, iter_lines

    if path is None:
        return None
    with contextlib.suppress(OSError):  # one that cannot be read: iter_lines names the error
        if not stat.S_ISREG(mode := os.stat(path).st_mode) and not stat.S_ISDIR(mode):  # a folder: refused here
            return None
    try:
        return sum(1 for _ in iter_lines(path))
    except DataError as e:  # "in.txt: cannot read": said with the option that named it, as evaluate says its own
        raise DataError(f"--input {e}") from None


def _translate_arguments(p: argparse.ArgumentParser) -> None:
    _decode_options(p)
    _ensemble_option(p)
    p.add_argument("--input", type=_standard, help="input file, plain or .gz (default, or -: stdin)")
    _output(p, "--output", standard=True, help="output file, gzip-compressed when it ends in .gz (default, or -: "
            "stdout)")
    p.add_argument("--nbest", type=int, metavar="K", help="the K best hypotheses of each input (K <= beam; with "
                   "--sample, K draws), best first, as Moses n-best lines 'ID ||| TEXT ||| SCORE': ID the 0-based "
                   "input line, SCORE the beam's log P / lp(|Y|); the first of each list is the plain output (with "
                   "--early-stop top it may be a better one; with --sample, the best of the draws); with "
                   "--constraints, only hypotheses that meet them (when any does): a list may be shorter, as where a "
                   "prefix or the length limit leaves fewer")
    p.add_argument("--scores", action="store_true", help="write 'SCORE<TAB>TEXT' lines: each output with the "
                   "beam's score, log P / lp(|Y|) (not with --nbest, whose lines carry it already)")
    p.add_argument("--prefix", type=_beside_input, metavar="FILE", help="one target prefix per input line (empty: "
                   "none): each output starts with it and the search continues from it (interactive translation)")
    p.add_argument("--constraints", type=_beside_input, metavar="FILE", help="per input line, the phrases its output "
                   "must contain, separated by tabs (empty: none): lexically constrained beam search (dynamic beam "
                   "allocation, Post & Vilar 2018); a beam of at least the constraints' pieces + 1 works best")
    p.add_argument("--sample", action="store_true", help="draw each output token from the model's distribution "
                   "instead of searching (not beam search: back-translation's decoding); with --nbest K, K draws")
    p.add_argument("--topk", type=int, metavar="K", help="--sample: draw among the K most probable tokens only "
                   "(default 0: all)")
    p.add_argument("--topp", type=float, metavar="P", help="--sample: draw among the most probable tokens whose "
                   "probability together reaches P (nucleus sampling; default 1: all)")
    p.add_argument("--temperature", type=float, metavar="T", help="--sample: divide the log-probabilities by T "
                   "(< 1 sharper, > 1 flatter; default 1)")
    p.add_argument("--seed", type=int, metavar="S", help="--sample: random seed (default 1); the same seed, input "
                   "and batch size give the same outputs on the same machine")
    p.add_argument("--alignment", action="store_true", help="append ' ||| ' and the word alignment of each output "
                   "in Pharaoh form (0-based 'source-target' word pairs), from the cross-attention of the "
                   "penultimate decoder layer averaged over heads")


@command("translate", _translate_arguments, (
    "echo 'A dog runs.' | transformer translate runs/mine",
    "transformer translate runs/mine --input in.en --output out.de --nbest 4",
    "transformer translate runs/mine --input in.en --prefix prefixes.de --int8",
))
def cmd_translate(args: argparse.Namespace) -> None:
    """Translate lines with beam search (§6.1).

    One output line per input line, in order; an empty line gives an empty line. --nbest K writes K
    lines per input (Moses n-best form), --scores adds each output's score, --alignment its word
    alignment, --prefix forces the start of each output, --constraints the phrases it must contain,
    --sample draws outputs instead of searching, --ensemble decodes with several runs' models together.
    Options that do not combine are refused in one line before any decoding (the table:
    docs/decoding.md). Outputs are written as they are done: up to 10,000 lines at a time from a file, on a
    pipe the lines that have come (up to 10,000; --sample: whole chunks of 10,000), each line as it is typed at
    a terminal.
    """
    request = _request(args)
    total = _count_lines(args.input)
    translator, said = _translator(args, request, total)
    with _line_sink(args.output) as write:
        start = 0  # the input line number of the chunk's first line, less one
        for lines, hyps in _decoded(args, translator, request, total, said):
            write(_translation_rows(translator, request, lines, hyps, start))
            start += len(lines)


def _number(x: float) -> str:
    """A score as `translate` and `score` print it: six decimals, or seven significant digits where those would
    show little of it (length normalisation at a large α divides scores to 1e-10: all printed -0.000000)."""
    return f"{x:.6f}" if x == 0 or abs(x) >= 0.01 else f"{x:.6e}"


def _translation_rows(translator, request, lines: list[str], hyps: list[list[tuple[str, float]]],
                      start: int) -> list[str]:
    """`translate`'s output lines for input ``lines`` (from input line ``start``, counted from 0) and their
    outputs: the text, with the score (--scores), as n-best lines (--nbest), with the alignment (--alignment)."""
    def aligned(i: int, text: str) -> str:
        if not request.alignment:
            return ""
        from .figures import align

        return " ||| " + " ".join(f"{s}-{t}" for s, t in align(translator, lines[i], text))

    if request.nbest is not None:
        return [f"{start + i} ||| {text} ||| {_number(score)}{aligned(i, text)}" for i, h in enumerate(hyps)
                for text, score in h]
    return [(f"{_number(h[0][1])}\t{h[0][0]}" if request.scores else h[0][0]) + aligned(i, h[0][0])
            for i, h in enumerate(hyps)]


def _score_arguments(p: argparse.ArgumentParser) -> None:
    _model_options(p)
    _ensemble_option(p)
    p.add_argument("--alpha", type=float, help="length penalty α of SCORE, GNMT's exponent (with --length-norm "
                   "length: of |Y|) (default: the run's decode.alpha; §6.1: 0.6)")
    _length_norm_option(p)
    p.add_argument("--src", type=_input, help="source sentences, plain or .gz (with --tgt; default: stdin, one "
                   "pair per line as SOURCE<TAB>TARGET; -: stdin, one sentence per line)")
    p.add_argument("--tgt", type=_input, help="the translations to score, line-aligned with --src (-: stdin, as "
                   "`translate ... | transformer score RUN --src in.txt --tgt -`)")
    _output(p, "--output", standard=True, help="output file, gzip-compressed when it ends in .gz (default, or -: "
            "stdout)")
    p.add_argument("--json", action="store_true", help="one JSON object per pair instead: score, log_prob, tokens "
                   "(pieces, EOS included) and token_log_probs")


@command("score", _score_arguments, (
    "transformer score runs/mine --src in.en --tgt out.de",
    "transformer translate runs/mine --input in.en | transformer score runs/mine --src in.en --tgt -",
))
def cmd_score(args: argparse.Namespace) -> None:
    """Score given translations with the model (forced decoding).

    One line per pair, in order: SCORE<TAB>LOGPROB, SCORE being the beam's length-normalised score
    log P / lp(|Y|) (so scoring the beam's own output gives the beam's score) and LOGPROB the summed
    log-probability of the target's pieces and its EOS. The corpus perplexity per piece goes to stderr.
    Translations are read as text and segmented by the run's vocabulary: a search output whose pieces
    were not that segmentation (a model may write "." where the vocabulary has "▁" ".") scores lower.
    """
    import math

    from .data import DataError, check_parallel, iter_lines, iter_parallel

    from .request import DecodeRequest
    from .translator import naming_the_longest

    if (args.src is None) != (args.tgt is None):
        raise ConfigError("give both --src and --tgt, or neither (pairs on stdin as SOURCE<TAB>TARGET)")
    if args.src == args.tgt == STDIN:
        raise ConfigError("--src - and --tgt -: stdin can be one side of the pairs; give the other as a file, or "
                          "neither option, the pairs on stdin as SOURCE<TAB>TARGET")
    for option, path in (("--src", args.src), ("--tgt", args.tgt)):  # before the model loads, naming the option
        # (read, a folder was said without it); a file is not opened here: a named pipe would give its text once
        if path not in (None, STDIN) and (why := "No such file or directory" if not path.exists() else
                                          "Is a directory" if path.is_dir() else None):
            raise DataError(f"{option} {path}: cannot read ({why})")
    if args.src not in (None, STDIN) and args.tgt != STDIN and args.src.is_file() and args.tgt.is_file():
        # read through once (line counts, UTF-8), as translate counts its input: stdout had 10,000 lines of
        # scores when the files were found to differ in length (a pipe cannot be read twice: as it comes)
        check_parallel(args.src, args.tgt)
    translator, said = _translator(args, DecodeRequest(alpha=args.alpha, length_norm=args.length_norm))
    if args.src is not None:
        pairs = iter_parallel(args.src, args.tgt)
    else:
        def stdin_pairs():
            for n, line in enumerate(iter_lines(STDIN), 1):
                if line.count("\t") != 1:
                    raise DataError(f"stdin:{n}: expected SOURCE<TAB>TARGET (one tab), found "
                                    f"{line.count(chr(9))} tabs (text that holds tabs: give --src and --tgt)")
                yield tuple(line.split("\t"))
        pairs = stdin_pairs()
    total, pieces, n, empty = 0.0, 0, 0, 0
    unknown: dict[str, None] = {}  # characters without a piece, in the order met
    lacking = 0  # pairs that hold one
    with _line_sink(args.output) as write:
        # where stdin is one side, its pairs come as they are typed or piped, as translate's lines do
        for chunk in _chunks(pairs, None if STDIN in (args.src, args.tgt) else args.src):
            src, tgt = [s for s, _ in chunk], [t for _, t in chunk]
            with naming_the_longest([len(a) + len(b) for a, b in chunk], n, "scoring", "characters", None):
                scored = translator.score(src, tgt, args.alpha, length_norm=args.length_norm)
            if args.json:
                write(json.dumps({"score": r.score, "log_prob": r.log_prob,
                                  "tokens": translator.tokenizer.pieces(t.strip()) + ["</s>"],
                                  "token_log_probs": r.token_log_probs}, ensure_ascii=False)
                      for t, r in zip(tgt, scored))
            else:
                write(f"{_number(r.score)}\t{_number(r.log_prob)}" for r in scored)
            counted = [r for blank, r in zip(translator.blank(src), scored) if not blank]  # no model's judgement
            total += sum(r.log_prob for r in counted)
            pieces += sum(len(r.token_log_probs) for r in counted)
            n, empty = n + len(chunk), empty + len(chunk) - len(counted)
            for s, t in chunk:
                if found := translator.unknown(s, source=True) + translator.unknown(t, source=False):
                    lacking += 1
                    unknown.update(dict.fromkeys(found))
            _tell(said)  # once the first pairs are scored, as translate says it: a refusal of them comes alone,
            said = []  # one of a later pair (a tab too many, a file shorter) after the weights that scored those
    _tell(said)  # no pair
    if n:
        left_out = f" ({empty} with an empty source, left out)" if empty else ""
        print(f"{n} pair{'s' * (n != 1)}{left_out}, {pieces} piece{'s' * (pieces != 1)} (EOS included): "
              + (f"perplexity {math.exp(-total / pieces):.3f}" if pieces else "no perplexity"), file=sys.stderr)
    else:  # an empty input: said, as a file of pairs is
        print("0 pairs: nothing to score (the input is empty)", file=sys.stderr)
    if lacking:  # --json's tokens show them as written
        shown = ", ".join(map(repr, list(unknown)[:5])) + (", ..." if len(unknown) > 5 else "")
        print(f"note: {lacking} pair{'s' * (lacking != 1)} hold{'s' * (lacking == 1)} characters the model's "
              f"vocabulary has no piece for ({shown}): the model reads each as its unknown piece", file=sys.stderr)


READER_GONE = 141  # what a shell reports for a filter a closed pipe stopped: 128 + SIGPIPE


def _stdout_gone() -> bool:
    """Whether what reads stdout has closed it (``... | head``, ``| true``): a pipe's write end then reports
    an error (Linux) or a hang-up (BSD, macOS; a terminal that went) to ``poll``. Any command's output may meet it (``translate``'s lines, ``evaluate``'s or
    ``params``' report), and the command then stops as a Unix filter does, without a word (``main``); a
    broken pipe elsewhere is not the user's doing."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), or stdout is not a file (a test's capture)
        return False


def _write_whole_lines(text: str) -> None:
    """``text`` (whole lines) onto stdout, flushed; stopped (Ctrl-C, SIGTERM, SIGHUP) while a slow reader held the
    write, the line under way is finished before the stop goes on: a pipe was left ending in half a line
    ("-20.591740<TAB>", a score without its translation, read as an empty one). The wait for the reader is where a
    stop may come, with nothing written meanwhile; each write of at most PIPE_BUF bytes (which a pipe takes whole
    once it is writable) is made with the stops held, so what it wrote is always counted. A second stop leaves it."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file: a test's capture
        fd = None
    if fd is None or not hasattr(signal, "pthread_sigmask"):  # Windows: written as it comes
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    sys.stdout.flush()  # what print() left in the buffer goes first
    data = memoryview(text.encode(sys.stdout.encoding or "utf-8", sys.stdout.errors or "strict"))
    done = 0

    def write_to(end: int) -> None:
        nonlocal done
        while done < end:
            select.select([], [fd], [])
            with stops_held():
                done += os.write(fd, data[done:min(end, done + select.PIPE_BUF)])

    try:
        write_to(len(data))
    except (KeyboardInterrupt, Terminated):
        with contextlib.suppress(OSError, KeyboardInterrupt, Terminated):
            write_to(bytes(data).find(b"\n", done - 1) + 1 if done else 0)  # the end of the line under way
        raise



@contextlib.contextmanager
def _line_sink(path: Path | None) -> Iterator[Callable[[Iterable[str]], None]]:
    """Where a command writes its output lines as it makes them: stdout, flushed at every write (a
    terminal or a pipe has them at once, and a run cut short keeps what it wrote), or the file ``path``,
    whole or not at all (``files.atomic_path``) when the command ends; gzip-compressed when its name ends in
    .gz, as the inputs may be."""
    if path is None:
        def write(lines: Iterable[str]) -> None:
            _write_whole_lines("".join(f"{line}\n" for line in lines))
            # a reader that left during a long write (`| head -1`) cut it short without an error, and the command
            # ended with 0, its lines lost; as at the next write, it stops with 141 (main)
            with contextlib.suppress(OutputError):  # not a file: a test's capture
                if _stdout_gone():
                    raise BrokenPipeError(errno.EPIPE, "the reader of standard output left")

        yield write
        return
    name = Path(path).name
    with files.atomic_path(path) as tmp, open(tmp, "wb") as f:
        # gzip's header names the file: the final one (gunzip -N restores it), not the temporary one
        stream = gzip.GzipFile(name, "wb", fileobj=f) if name.endswith(".gz") else f
        with io.TextIOWrapper(stream, encoding="utf-8") as out:
            yield lambda lines: out.write("".join(f"{line}\n" for line in lines))


def _evaluate_arguments(p: argparse.ArgumentParser) -> None:
    _decode_options(p)
    _ensemble_option(p)
    _unconstrained_option(p)
    p.add_argument("--src", type=_input, help="source sentences, plain or .gz; a path that does not "
                   "exist is looked up under the data root ($TRANSFORMER_DATA, ...), e.g. multi30k/val.en.gz "
                   "(-: stdin; default: the run's data.test_src)")
    p.add_argument("--ref", type=_input, help="reference translations (raw text), or gold trees for a parsing run "
                   "(-: stdin; default: the run's data.test_tgt)")
    p.add_argument("--tok-ref", type=_input, help="Moses-tokenized lowercased references (multi30k/tok/...; -: "
                   "stdin; default: the run's data.test_tok_ref when neither --src nor --ref is given)")
    p.add_argument("--pretokenized", action="store_true", help="the run writes tokenized lowercased text (trained on "
                   "it): --tok-ref scores its outputs as they are, not tokenized again (default: so for a run trained "
                   "on files in a tok/ folder, as Multi30k's); needs --tok-ref, and leaves --paper-bleu as it is")
    p.add_argument("--lang", type=_language, help="target language, for sacreBLEU's tokenizer (zh, ja, ko have "
                   "their own) and Moses' "
                   "(default: the --ref suffix, test.de, else the run's data.train_tgt's, else, for sacreBLEU, its "
                   "data.tgt_lang; Moses' rules differ by language, so it needs --lang there)")
    p.add_argument("--paper-bleu", action="store_true", help="also the tokenized BLEU the paper reported in Table 2, "
                   "computed as the authors did (A13: Moses tokenizer and compound splitting, get_ende_bleu.sh)")
    _output(p, "--json", metavar="FILE", dash=True, help='write {"bleu", "chrf", "signature", ...} to FILE (a '
            'parsing run: {"f1", "precision", "recall", ...}); -: to stdout, the report then on stderr')
    _output(p, "--hyp-out", metavar="FILE", dash=True, help="also write the translations to FILE (-: to stdout, the "
            "report then on stderr)")


@command("evaluate", _evaluate_arguments, (
    "transformer evaluate runs/mine",
    "transformer evaluate runs/mine --src test.en --ref test.de --json -",
))
def cmd_evaluate(args: argparse.Namespace) -> None:
    """Translate a test set and score it with sacreBLEU and chrF (a parsing run: parse it, F1 as EVALB).

    Prints detokenized cased sacreBLEU with its signature and chrF; with --tok-ref also the Multi30k
    literature's tokenized lowercased BLEU. A parsing run's outputs are scored against --ref's gold trees:
    labelled bracket F1 (Table 4's measure, §6.3), precision and recall, with EVALB's COLLINS.prm rules (the
    field's convention; the paper does not name its scorer). Without --src and --ref, the run's own test set
    (its config's data.test_*), named on stderr.
    """
    from .data import read_lines, shown
    from .prepare import resolve_data_path
    from .evaluate import (bleu_metric, moses_language_warning, paper_bleu, sacrebleu_scores, tok_lc_bleu,
                           writes_tokenized)

    _one_stdin(("--src", args.src == STDIN), ("--ref", args.ref == STDIN), ("--tok-ref", args.tok_ref == STDIN))
    if (args.src is None) != (args.ref is None):  # the run's own file paired with another: a score of nothing
        given, missing = ("--src", "--ref") if args.ref is None else ("--ref", "--src")
        raise ConfigError(f"{given} without {missing}: give both, or neither for the run's own test set "
                          "(data.test_src and data.test_tgt)")
    request = _request(args)
    translator, said = _translator(args, request)
    # stdout is the JSON's or the lines' (given as -, or as /dev/stdout: the report was mixed into them)
    report = sys.stderr if any(out is not None and (out == STDOUT or files.descriptor(Path(out)) == 1)
                               for out in (args.json, args.hyp_out)) else sys.stdout
    d = translator.cfg.data
    if d.task == "parse" and (bleus := [option for option, given in (
            ("--tok-ref", args.tok_ref is not None), ("--pretokenized", args.pretokenized),
            ("--paper-bleu", args.paper_bleu), ("--lang", args.lang is not None)) if given]):
        raise ConfigError(f"{', '.join(bleus)}: BLEU's, and {args.run_dir} is a parsing run, whose trees are scored "
                          "by F1 against --ref's gold trees")  # they were ignored without a word
    fields = {"src": ("data.test_src", d.test_src), "ref": ("data.test_tgt", d.test_tgt)}
    defaulted = [name for name in fields if getattr(args, name) is None]
    for name in defaulted:
        field, default = fields[name]
        if not default:
            raise ConfigError(f"--{name} not given and the run's config has no {field}")
        setattr(args, name, default)
    if defaulted == ["src", "ref"] and args.tok_ref is None and d.test_tok_ref:  # the run's test set, whole
        fields["tok_ref"] = ("data.test_tok_ref", d.test_tok_ref)
        defaulted.append("tok_ref")
        args.tok_ref = d.test_tok_ref
    for name in defaulted:  # a recipe's test set kept when --set moved the run to other languages and data
        side = "src" if name == "src" else "tgt"
        # the language of the run's training text (DataConfig.language): its file's name, else data.{side}_lang
        lang, code = d.language(side), language_code(getattr(args, name))
        if code and len(lang) == 2 and code != lang:
            trained = (f"data.train_{side} {getattr(d, f'train_{side}')}" if language_code(getattr(d, f"train_{side}"))
                       else f"data.{side}_lang")
            raise ConfigError(f"--{name.replace('_', '-')} not given, and the run's {fields[name][0]} "
                              f"{getattr(args, name)} is in "
                              f"'{code}' where its {trained} is in '{lang}' (the recipe's test set, kept when the "
                              "run was pointed at other data): give --src and --ref")
    if args.pretokenized and args.tok_ref is None:  # it says how --tok-ref reads outputs
        raise ConfigError("--pretokenized without --tok-ref: it says how the tokenized BLEU reads the outputs, and "
                          "there is no tokenized reference to score them against")
    if defaulted:  # a copied recipe's test set is not the user's own: say which files are scored
        said.append("scoring the run's " + ", ".join(f"{fields[n][0]} {getattr(args, n)}" for n in defaulted))
    def given_by(name: str) -> str:  # what named a file: the run's config field, else the option
        return fields[name][0] if name in defaulted else "--" + name.replace("_", "-")

    args.src, args.ref = (resolve_data_path(str(getattr(args, n)), given_by(n)) for n in ("src", "ref"))
    # "-": stdin, not /dev/stdin; a file the run's config named is said so (the user gave no --src)
    src_name, ref_name = (f"{given_by(n)} {shown(getattr(args, n))}" for n in ("src", "ref"))
    with _named_option(given_by("src")):  # a file it cannot read, said with what named it
        src = read_lines(args.src)
    if not any(line.strip() for line in src):
        raise ConfigError(f"{src_name}: no sentences to evaluate (the file is empty or blank)")
    if d.task == "parse":
        from .evaluate import score_trees
        from .trees import TreeError, ptb_escape, read_normalized

        with _named_option(given_by("ref")):  # as evaluate-parse reads gold trees
            gold = read_normalized(args.ref, lines=read_lines(args.ref))
        if len(src) != len(gold):
            raise ConfigError(f"{src_name} has {len(src)} line{'s' * (len(src) != 1)} but {ref_name} has "
                              f"{len(gold)} tree{'s' * (len(gold) != 1)}")
        for i, (line, tree) in enumerate(zip(src, gold), 1):  # found before decoding, else blamed on --ref after it
            if tree is None:  # traces alone: a blank line pairs with it; a sentence's tree would have no match
                if line.split():
                    raise ConfigError(f"{src_name}:{i}: a sentence, where {ref_name}'s tree {i} holds no "
                                      "words once its traces are removed (the sentences and the trees go one to "
                                      "one; leave the pair out of both files)")
                continue
            if not line.split():
                raise ConfigError(f"{src_name}:{i}: a blank line, where {ref_name}'s tree {i} holds "
                                  "words (the sentences and the trees go one to one)")
            if (words := [ptb_escape(w) for w in line.split()]) != (gold_words := tree.words()):
                at = next((j for j, (a, b) in enumerate(zip(words, gold_words)) if a != b),
                          min(len(words), len(gold_words)))
                raise ConfigError(f"{src_name}:{i}: its words differ from {ref_name}'s tree {i} from word "
                                  f"{at + 1} ({' '.join(words[at:at + 4]) or 'the line ends'} vs "
                                  f"{' '.join(gold_words[at:at + 4]) or 'the tree ends'}; the sentences and the "
                                  "trees go one to one, in the treebank's tokens)")
        _outputs_not_inputs(args, {n: f"the run's {fields[n][0]}" for n in defaulted})  # named: read now
        _tell(said)
        trees = _parse_lines(translator, src, request)
        try:
            scores = score_trees(gold, trees).as_dict()
        except TreeError as e:
            raise TreeError(f"{ref_name}: {e}") from None
        print(f"F1 = {scores['f1']:.2f}  precision {scores['precision']:.2f}  recall {scores['recall']:.2f}  "
              f"({scores['matched']} of {scores['gold_brackets']} gold / {scores['test_brackets']} test brackets, "
              f"{scores['sentences']} sentence{'s' * (scores['sentences'] != 1)}; EVALB COLLINS.prm rules)",
              file=report)
        hyps = [_tree_line(t) for t in trees]
    else:
        with _named_option(given_by("ref")):
            ref = read_lines(args.ref)
        if len(src) != len(ref):
            raise ConfigError(f"{src_name} has {len(src)} lines but {ref_name} has {len(ref)}")
        if args.tok_ref is not None:
            args.tok_ref = resolve_data_path(str(args.tok_ref), given_by("tok_ref"))
        tok_name = "" if args.tok_ref is None else f"{given_by('tok_ref')} {shown(args.tok_ref)}"
        with _named_option(given_by("tok_ref")):
            tok_ref = None if args.tok_ref is None else read_lines(args.tok_ref)
        if tok_ref is not None and len(tok_ref) != len(ref):
            raise ConfigError(f"{tok_name} has {len(tok_ref)} lines but {ref_name} has "
                              f"{len(ref)}")
        if tok_ref and (cased := sum(line != line.lower() for line in tok_ref)) * 2 > len(tok_ref):
            # scored against lowercased outputs, a cased reference scored near 0, said of nothing
            print(f"note: {tok_name}: {cased:,} of its {len(tok_ref):,} lines hold capital "
                  "letters, which a lowercased reference has not (the detokenized --ref?): scored as given",
                  file=sys.stderr)
        lang = _target_language(args, d, ref_name) if args.paper_bleu or tok_ref is not None else ""
        trained = d.language("tgt")  # a reference of another language was scored, and tokenized by its rules
        for named, code in ((f"--lang {args.lang}", args.lang and primary_language(args.lang)),
                            (ref_name, language_code(args.ref)), (tok_name, language_code(args.tok_ref))):
            if code and len(trained) == 2 and code != trained:
                print(f"note: {named} says '{code}', and {args.run_dir} translates into '{trained}': scored as given",
                      file=sys.stderr)
        if lang and (warning := moses_language_warning(lang)):
            print(warning, file=sys.stderr)
        # sacreBLEU tokenizes by the target language, Chinese, Japanese and Korean by their own rules: its
        # tokenizer is had (ja, ko: MeCab) before any decoding
        bleu_lang = args.lang or language_code(args.ref) or d.language("tgt")
        # a training file's name over data.tgt_lang (.jp for ja: 13a), said in train.log alone; a --ref of another
        # language than the run's is noted below; a three-letter data.tgt_lang ('deu') is not compared
        stated = primary_language(d.tgt_lang)
        if not args.lang and len(stated) == 2 and bleu_lang == d.language("tgt") != stated:
            print(f"note: scored as '{bleu_lang}' text, the language its file names end in, and the run's "
                  f"data.tgt_lang is '{stated}' (--lang sets which: sacreBLEU tokenizes zh, ja and ko by their own "
                  "rules)", file=sys.stderr)
        bleu_metric(bleu_lang)
        _outputs_not_inputs(args, {n: f"the run's {fields[n][0]}" for n in defaulted})  # named: read now
        _tell(said)
        hyps = _translate_lines(translator, src, request)
        scores = sacrebleu_scores(hyps, ref, bleu_lang)
        print(f"BLEU = {scores['bleu']:.2f}  ({scores['signature']})", file=report)
        print(f"chrF = {scores['chrf']:.2f}  ({scores['chrf_signature']})", file=report)
        if args.paper_bleu:
            scores["paper_bleu"] = paper_bleu(hyps, ref, lang)
            print(f"tokenized BLEU = {scores['paper_bleu']:.2f}  (as the authors scored Table 2: Moses tokenizer, "
                  f"##AT## compound splitting, cased, multi-bleu; {lang})", file=report)
        if tok_ref is not None:
            pretokenized = args.pretokenized or writes_tokenized(d.train_tgt)
            scores["tok_lc_bleu"] = tok_lc_bleu(hyps, tok_ref, lang, pretokenized)
            how = ("Moses lc+norm+tok" if not pretokenized else "outputs as written, --pretokenized"
                   if args.pretokenized else "outputs as written, tokenized by training")
            scores["tok_lc_bleu_method"] = f"{how}, {lang}; multi-bleu: no smoothing, against --tok-ref"
            scores["pretokenized"] = pretokenized
            print(f"tokenized lowercased BLEU = {scores['tok_lc_bleu']:.2f}  ({how}, {lang})", file=report)
        if args.paper_bleu:
            scores["paper_bleu_method"] = f"Moses tokenizer, ##AT## compound splitting, cased, multi-bleu; {lang}"
    if args.hyp_out:
        with _line_sink(None if args.hyp_out == STDOUT else args.hyp_out) as write:
            write(hyps)
    if args.json:  # the scores and what they are of: the weights, the test set, the search
        from .checkpoint import chosen_weights, weights_step

        searched = translator.check(request)
        # the files the model was loaded from: listed again, a run still training named newer ones
        read = [str(p) for p in translator.weights_from]
        weights = ({"checkpoint": read[0]} if chosen_weights(Path(args.run_dir), args.checkpoint) is not None
                   else {"averaged": read})
        if (record := translator.weights_record) is not None:  # which weights: best.safetensors is rewritten
            weights |= {"checkpoint_step": weights_step(record),
                        "checkpoint_sha256": record["files"]["weights"]["sha256"]}
            if "averaged" in record:  # a file `average` wrote: no one step, the checkpoints it is the mean of,
                # whole as "averaged" names a run's own (its record keeps their names, and its run's folder)
                run = record.get("run")
                weights["checkpoint_averaged"] = [str(Path(run) / "checkpoints" / name) if isinstance(run, str)
                                                  else name for name in record["averaged"]]
        if translator.ensemble_from:  # the other runs' weights, each run's average
            weights["ensemble"] = [{"run": str(run), "averaged": [str(p) for p in read],
                                    "averaged_sha256": [_recorded_sha256(p) for p in read]}
                                   for run, read in translator.ensemble_from]
        if "averaged" in weights:  # each file's hash, from its record: the files rotate away as a run trains on
            weights["averaged_sha256"] = [_recorded_sha256(Path(p)) for p in read]
        texts = {name: _named_file(getattr(args, name)) for name in ("src", "ref", "tok_ref")
                 if getattr(args, name) is not None and (d.task != "parse" or name != "tok_ref")}
        import sacrebleu
        import sacremoses
        import torch

        from . import __version__

        scores |= {"run": str(Path(args.run_dir).resolve()), **weights, "int8": args.int8, "bf16": args.bf16,
                   "device": str(translator.device), "threads": torch.get_num_threads(),
                   "config_sha256": translator.cfg.sha256(), "vocabulary_sha256": translator.tokenizer.sha256,
                   **{k: v for name, (path, sha) in texts.items() for k, v in ((name, path), (f"{name}_sha256", sha))
                      if v is not None},
                   # a parse's scored trees (a blank input's is skipped, in "skipped_empty"), as the report says them
                   "sentences": scores.get("sentences", len(src)),
                   # the batch too: int8 and bf16 products follow the batch's shape (decoding.md)
                   "decode": {k: v for k, v in dataclasses.asdict(searched).items()
                              if v is not None and k not in ("prefixes", "constraints")},
                   "versions": {"transformer": __version__, "torch": torch.__version__,
                                "sacrebleu": sacrebleu.__version__, "sacremoses": sacremoses.__version__}}
        if args.json == STDOUT:
            print(json.dumps(scores, indent=2))
        else:
            files.write_text(args.json, json.dumps(scores, indent=2) + "\n")


def _named_file(path: Path) -> tuple[str, str | None]:
    """A scored file as evaluate --json records it: its absolute path and sha256; stdin as "-", with no hash
    (its lines are read once)."""
    if Path(path) == STDIN:
        return "-", None
    return str(Path(path).resolve()), files.file_sha256(Path(path)) if Path(path).is_file() else None


def _recorded_sha256(weights: Path) -> str | None:
    """The sha256 a checkpoint's record gives its weights file (verified as it was averaged); None once the
    record is gone (a run still training prunes its checkpoints)."""
    from .checkpoint import CheckpointError, checkpoint_record

    try:
        return checkpoint_record(weights)["files"]["weights"]["sha256"]
    except (CheckpointError, KeyError, TypeError):
        return None


def _target_language(args: argparse.Namespace, data, ref_name: str) -> str:
    """The language Moses tokenizes the outputs as: --lang (its first subtag), else the two letters that end --ref's name
    (test.de, test.de.gz), else the run's data.train_tgt's; a ConfigError before any decoding otherwise (a
    reference named ref.txt was tokenized as language "txt"). ``ref_name``: the reference as errors name it."""
    if args.lang:
        return primary_language(args.lang)  # Moses knows "pt", not "pt-BR" (it took English rules for that)
    for path in (args.ref, data.train_tgt):
        if code := language_code(path):
            return code
    # data.tgt_lang is not taken: a preset's, kept when --set moved the run to files of another language
    raise ConfigError(f"--lang not given, and neither {ref_name} nor the run's data.train_tgt "
                      f"{data.train_tgt or '(none)'} ends in a language code (.de, .fr, ...): give --lang (the run's "
                      f"data.tgt_lang{f', {data.tgt_lang!r},' if data.tgt_lang else ''} is not taken "
                      "for Moses's rules: a preset sets it whatever files a run is given)")


def _tree_line(tree) -> str:
    """A tree as `parse` writes it, one a line; a blank input line's (None) as an empty line, as `translate`
    answers one (it was the word None, which no scorer reads)."""
    return "" if tree is None else str(tree)


def _parse_lines(translator, lines: list[str], request) -> list:
    """Trees for sentences of space-separated words (§6.3): decode, then rebuild with the input's words."""
    return [tree for tree, _ in translator.trees(lines, _translate_lines(translator, lines, request))]


def _parse_arguments(p: argparse.ArgumentParser) -> None:
    _decode_options(p, parsing=True)
    _ensemble_option(p)  # as evaluate's: a parsing run's F1 with several runs' models is its trees' too
    _unconstrained_option(p)
    p.add_argument("--input", type=_standard, help="input file (default, or -: stdin)")
    _output(p, "--output", standard=True, help="output file, gzip-compressed when it ends in .gz (default, or -: "
            "stdout)")


@command("parse", _parse_arguments, (
    "echo 'The dog runs .' | transformer parse runs/parse",
))
def cmd_parse(args: argparse.Namespace) -> None:
    """Parse sentences into constituency trees with a parsing run (§6.3).

    Input: one sentence per line, words separated by spaces (Penn Treebank tokenization). Output: one bracketed
    tree per line, every sentence gets one (with the run's decode.constrained the beam writes only well-formed
    trees of the input; without it, or with --unconstrained, ill-formed outputs are repaired); part-of-speech
    nodes carry the placeholder XX. A blank line gives an empty line.
    """
    request = _request(args)
    total = _count_lines(args.input)
    translator, said = _translator(args, request, total)
    if translator.cfg.data.task != "parse":
        raise ConfigError(f"{args.run_dir}: a translation run (data.task = {translator.cfg.data.task!r}); "
                          "use `transformer translate`")
    with _line_sink(args.output) as write:
        for lines, hyps in _decoded(args, translator, request, total, said):
            write(_tree_line(tree) for tree, _ in translator.trees(lines, [h[0][0] for h in hyps]))


def _linearize_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trees", type=_input, nargs="+", help="files of bracketed trees (.mrg files, say), read in order "
                   "(-: stdin)")
    _output(p, "--out", required=True, metavar="PREFIX", help="writes PREFIX.words, PREFIX.lin, PREFIX.wlin and "
            "PREFIX.gold")


@command("linearize", _linearize_arguments, (
    "transformer linearize wsj_02*.mrg --out mydata/train",
))
def cmd_linearize(args: argparse.Namespace) -> None:
    """Write the parsing task's files (§6.3) from treebank trees: a training, validation or test split.

    Reads bracketed trees (.mrg files of the Penn Treebank, say; traces and function tags are removed) and
    writes, one line a tree: PREFIX.words (the source: its words), PREFIX.wlin (the target linearized with the
    words at the leaves: configs/ptb_sample_parse.toml's form), PREFIX.lin (with XX at the leaves, as Vinyals et
    al. 2015) and PREFIX.gold (the tree, for `evaluate --ref`). Name them in a parsing config's data.* fields.
    """
    from .data import shown
    from .prepare import TREE_FILES, write_tree_files
    from .trees import TreeError, read_normalized

    _one_stdin(("trees", args.trees.count(STDIN)))
    for suffix in TREE_FILES:  # before the trees are read: a folder that cannot take them is said first
        check_output(written := args.out.with_name(f"{args.out.name}.{suffix}"), "--out")
        if read := next((t for t in args.trees if written.is_file() and t.is_file() and t.samefile(written)), None):
            raise OutputError(f"--out {args.out}: would write {written}, which is {read}, read as trees: give another "
                              "prefix")  # `linearize x.words --out x` replaced the treebank file
    read = [(path, i, t) for path in args.trees for i, t in enumerate(read_normalized(path), 1)]
    trees = [t for _, _, t in read if t is not None]
    if not trees:
        raise TreeError(f"{' '.join(map(shown, args.trees))}: no tree with a word (once traces are removed)")
    for path, i, t in read:  # linearized, they read back as other trees (not scored F1 100 against themselves)
        if t is not None and (t.is_preterminal or not t.label):
            raise TreeError(f"{shown(path)}: tree {i}: its root is " + (
                f"a part-of-speech node ({t.label} {t.children[0]}): a one-word tree" if t.is_preterminal else
                f"unlabelled, with {len(t.children)} constituents") + ", which the task's sequences cannot hold: "
                "give it one labelled root, e.g. (S ...)")
    if empty := [f"{shown(path)}: tree {i}" for path, i, t in read if t is None]:  # a test split's lines no longer
        # number the file's trees: said, with which
        print(f"left out {len(empty)} tree{'s' if len(empty) > 1 else ''} without a word once traces are removed "
              f"({', '.join(empty[:5])}{', ...' if len(empty) > 5 else ''}): score the parses of {args.out}.words "
              f"against {args.out}.gold, which leaves them out too, not against the trees read", file=sys.stderr)
    for path in write_tree_files(trees, args.out):
        print(f"{path}: {len(trees):,} {'line' if len(trees) == 1 else 'lines'}")


def _evaluate_parse_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gold", type=_input, required=True, help="gold trees, bracketed (a .mrg file, say; -: stdin)")
    p.add_argument("--test", type=_input, required=True, help="the trees to score, one per gold tree, in order (-: "
                   "stdin)")
    p.add_argument("--json", action="store_true", help="print the scores as one JSON object")


@command("evaluate-parse", _evaluate_parse_arguments, (
    "transformer evaluate-parse --gold test.gold --test test.parsed",
))
def cmd_evaluate_parse(args: argparse.Namespace) -> None:
    """Labelled bracket precision / recall / F1 of parse trees (EVALB).

    Scores --test trees against --gold trees (bracketed, any layout; .mrg files work) as EVALB does with
    COLLINS.prm, the treebank's unlabelled outermost bracket "( (S ...) )" not counted (as a TOP one is not).
    """
    from .evaluate import score_trees
    from .data import read_lines, shown
    from .trees import TreeError, read_normalized

    _one_stdin(("--gold", args.gold == STDIN), ("--test", args.test == STDIN))
    with _named_option("--gold"):
        gold = read_normalized(args.gold)
    gold_name, test_name = shown(args.gold), shown(args.test)  # "-": stdin, not /dev/stdin
    if all(tree is None for tree in gold):  # scored, it was "F1 = 0.00" of 0 sentences, exit status 0
        raise TreeError(f"--gold {gold_name}: no tree with a word once traces are removed ({len(gold)} "
                        f"tree{'s' * (len(gold) != 1)} empty or of traces alone): nothing to score")
    # parse's output of blank lines: empty lines, read as None where the file has a line for every gold tree
    with _named_option("--test"):
        test = read_normalized(args.test, expect=len(gold), lines=read_lines(args.test))  # read once: stdin too
    if len(gold) != len(test):
        raise TreeError(f"--gold {gold_name} has {len(gold)} tree{'s' * (len(gold) != 1)} but --test {test_name} "
                        f"has {len(test)}")
    try:
        scores = score_trees(gold, test).as_dict()
    except TreeError as e:
        raise TreeError(f"--test {test_name} against --gold {gold_name}: {e}") from None
    if args.json:
        print(json.dumps(scores))
        return
    print(f"precision = {scores['precision']:.2f}\nrecall    = {scores['recall']:.2f}\nF1        = {scores['f1']:.2f}")
    print(f"brackets: {scores['matched']} matched, {scores['gold_brackets']} gold, {scores['test_brackets']} test; "
          f"{scores['sentences']} sentence{'s' * (scores['sentences'] != 1)} (EVALB COLLINS.prm rules: punctuation by "
          "gold tag removed, ADVP = PRT, POS nodes not counted)"
          + (f"; {scores['skipped_empty']} skipped, without a word once traces are removed"
             if scores["skipped_empty"] else ""))


def _average_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=_in_path, help="run folder written by `transformer train`")
    p.add_argument("--last", type=int, required=True, help="how many checkpoints (paper: 5 base, 20 big)")
    _output(p, "--out", suffixes=(".safetensors",), required=True,
            help="output .safetensors file (a .json is written beside)")


@command("average", _average_arguments, (
    "transformer average runs/mine --last 5 --out avg5.safetensors",
    "transformer translate runs/mine --checkpoint avg5.safetensors --input in.en",
))
def cmd_average(args: argparse.Namespace) -> None:
    """Average the last N checkpoints (§6.1).

    Uniform mean in float64 of the last N checkpoints' weights; writes a model file usable with --checkpoint.
    """
    from .checkpoint import (CheckpointError, average_last, checkpoint_record, list_checkpoints, run_folder,
                             same_model, unrecorded_note, write_model)

    if args.last < 1:
        raise ConfigError(f"--last must be >= 1, got {args.last}")
    checkpoints = (run_folder(args.run_dir) / "checkpoints").resolve()
    if Path(args.out).resolve().parent == checkpoints:
        raise OutputError(f"--out {args.out}: in the run's checkpoints folder, where it would replace or pass for a "
                          f"training checkpoint; write it beside them (e.g. {args.run_dir}/average.safetensors)")
    out, record = Path(args.out), Path(args.out).with_suffix(".json")  # the two files write_model writes
    if files.is_stream(out):
        raise OutputError(f"--out {args.out}: not a file: the average is a .safetensors file with its .json record "
                          "beside it")
    if record.exists() and not out.exists():  # a file of that name that no model owns: summary.json, notes
        raise OutputError(f"--out {args.out}: its record would replace {record}, which is no record of a model "
                          "there: choose another name")
    paths, weights = average_last(Path(args.run_dir), args.last)  # of a run still training too
    if not paths:
        raise CheckpointError(f"{args.run_dir}/checkpoints: no checkpoints to average")
    held = list_checkpoints(Path(args.run_dir))
    meta = checkpoint_record(paths[-1])
    keep = ("config", "vocab_sha256", "model_hash", "vocab_size", "run_id")
    # the run it comes from: `train --init-from FILE` takes that run's vocabulary when FILE is kept elsewhere
    meta = {k: meta[k] for k in keep if k in meta} | {"averaged": [p.name for p in paths],
                                                       "run": str(Path(args.run_dir).resolve())}
    write_model(args.out, weights, meta)
    # it said "the run holds 3" of a run of 4, one of them replaced by the budget's end's (docs/training.md)
    before = held[:held.index(paths[0])] if paths[0] in held else []
    other = (f"; {before[-1].stem} and those before it are of another model (a resume with a model change), which "
             "it leaves out" if len(paths) < args.last and before and not same_model(before[-1], paths[-1]) else "")
    plural = "s" if len(paths) != 1 else ""
    # "1 of the run's 1 checkpoints are averaged" where the run holds no more
    fewer = (f" (--last {args.last}: " + (f"the run holds {len(held)}" if len(paths) == len(held) else
                                          f"{len(paths)} of the run's {len(held)} checkpoints "
                                          f"{'is' if len(paths) == 1 else 'are'} averaged, as decoding would average "
                                          f"them{other}") + ")" if len(paths) < args.last else "")
    print(f"averaged {len(paths)} checkpoint{plural}{fewer} ({', '.join(p.stem for p in paths)}) -> {args.out}")
    if note := unrecorded_note(Path(args.run_dir), paths[-1]):
        print(note, file=sys.stderr)


COST_DEVICES = [1, 8, 64]  # params --cost's device counts, unless --devices


def _counts(text: str) -> list[int]:
    """--devices' comma-separated whole numbers."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:  # argparse said "invalid <lambda> value"
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers separated by commas, e.g. 1,8,64") from None


def _params_arguments(p: argparse.ArgumentParser) -> None:
    _config_argument(p, "preset")
    p.add_argument("--vocab", type=int, help="vocabulary size (default: data.vocab_size of the preset; Table 3's "
                   "counts of base and its rows come out at 40960, PAPER_MAP.md)")
    _set_option(p)
    p.add_argument("--json", action="store_true", help='print {"parameters": N, "flops_per_token": F} '
                   '(with --cost: the whole report)')
    p.add_argument("--cost", action="store_true", help="training cost of the config's run as one process trains "
                   "it (train.max_steps x max_tokens x update_freq): total FLOPs against Table 2's estimate, step "
                   "time, hours and memory on H100s")
    p.add_argument("--devices", type=_counts, metavar="N,N,...",
                   help=f"device counts for --cost, comma-separated (default {','.join(map(str, COST_DEVICES))}): "
                   "each splits one process's batch over N (the trainer's step is max_tokens x update_freq x "
                   "processes: set them so)")
    p.add_argument("--mfu", type=float, help="model FLOPs utilisation assumed by --cost, in (0, 1] (default 0.4)")


@command("params", _params_arguments, (
    "transformer params base",
    "transformer params big --cost --devices 8",
))
def cmd_params(args: argparse.Namespace) -> None:
    """Parameter count and training FLOPs per token of a preset.

    Counts parameters of a preset (base, big, A1..E, parse, or a config path) without allocating it.
    """
    from .config import MAX_VOCAB, SPECIAL_PIECES, load_config
    from .model import FLOPS_SENTENCE_LEN, count_parameters, flops_per_token, on_meta

    if not args.cost and (given := [o for o, v in (("--devices", args.devices), ("--mfu", args.mfu)) if v is not None]):
        raise ConfigError(f"{' and '.join(given)}: for --cost's report; add --cost")  # accepted and unused
    cfg = load_config(args.preset, args.set)
    if args.vocab is not None and not SPECIAL_PIECES < args.vocab <= MAX_VOCAB:  # as data.vocab_size's bounds
        raise ConfigError(f"--vocab {args.vocab}: must be in {SPECIAL_PIECES + 1} .. {MAX_VOCAB:,} (padding, end of "
                          f"sentence and unknown take {SPECIAL_PIECES}; piece ids are int32)")
    vocab = cfg.data.vocab_size if args.vocab is None else args.vocab
    model = on_meta(cfg.model, vocab)
    n, flops = count_parameters(model), flops_per_token(cfg.model, vocab)
    if args.json and not args.cost:
        print(json.dumps({"parameters": n, "flops_per_token": flops}))
        return
    if not args.cost:
        print(f"{args.preset}: {n:,} parameters ({n / 1e6:.2f}M) with a vocabulary of {vocab}; "
              f"{flops / 1e6:.1f} MFLOP per target token for training ({FLOPS_SENTENCE_LEN:g}-token sentences)")
        return
    from .cost import DEFAULT_MFU, cost_report, format_cost_report

    tokens = cfg.train.max_tokens * cfg.train.update_freq
    mfu = DEFAULT_MFU if args.mfu is None else args.mfu
    if not 0 < mfu <= 1:
        raise ConfigError(f"--mfu {args.mfu}: must be in (0, 1], a share of the devices' peak FLOPs")
    devices = args.devices or COST_DEVICES
    if bad := [n for n in devices if not 1 <= n <= tokens]:  # the default list too: say it was not the user's
        default = "" if args.devices else f" (of the default {','.join(map(str, COST_DEVICES))})"
        raise ConfigError(f"--devices {bad[0]}{default}: each count must be in 1 .. {tokens:,}, the tokens of a step "
                          "(train.max_tokens x update_freq) shared among them")
    report = cost_report(cfg, args.preset, vocab, devices, mfu)
    print(json.dumps(report, indent=2) if args.json else format_cost_report(report))


def _config_arguments(p: argparse.ArgumentParser) -> None:
    _config_argument(p)
    _set_option(p)


@command("config", _config_arguments, (
    "transformer config multi30k_en_de",
    "transformer config multi30k_en_de --set train.max_steps=4000 > mine.toml",
))
def cmd_config(args: argparse.Namespace) -> None:
    """Print every setting of a preset or config file, as `train` writes it into a run folder.

    The defaults, then the file, then --set, validated: what a run of it would use, as TOML. Redirected into a
    file, it is a config of one's own to edit and give to `train` (every key is documented beside its default
    in transformer/config.py). Settings `train` would refuse are printed, with a note on stderr.
    """
    from .config import dump_toml, load_config, resolve_config_path

    cfg = load_config(args.config, args.set)
    sets = "".join(f", then --set {_in_comment(s, quoted=True)}" for s in args.set or [])
    sys.stdout.write(f"# the defaults, then {_in_comment(str(resolve_config_path(args.config)))}{sets}\n"
                     f"{dump_toml(cfg)}")
    if problem := cfg.training_problem():  # it printed as valid, and train refused it at start
        print(f"note: train refuses these settings: {problem}", file=sys.stderr)


def _in_comment(text: str, quoted: bool = False) -> str:
    """``text`` as a TOML comment can hold it, on one line: quoted as JSON (``quoted``, or where it holds control
    characters, which TOML refuses in a comment), DEL escaped too (JSON leaves it; a value or a file name holding
    it, or a newline, made the printed config unreadable by `train`)."""
    if not quoted and not any(c < " " and c != "\t" or c == "\x7f" for c in text):
        return text
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _preprocess_arguments(p: argparse.ArgumentParser) -> None:
    _config_argument(p, then="; its data section names the corpus")
    _output(p, "--out", folder=True, replaced=True, required=True,
            help="store folder to create (new or empty; an earlier token store with --overwrite)")
    _set_option(p)
    p.add_argument("--spm", type=_in_path, help="sentencepiece model to use (RUN/spm.model, or the run folder RUN); "
                   "default: train one")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier token store at --out (never a "
                   "folder of other files)")


@command("preprocess", _preprocess_arguments, (
    "transformer preprocess wmt14_en_de_base --out data/wmt14_en_de.tokens",
    "transformer train wmt14_en_de_base --out runs/base --set data.train_store=data/wmt14_en_de.tokens",
))
def cmd_preprocess(args: argparse.Namespace) -> None:
    """Encode a training corpus once into a memory-mapped token store.

    Encodes data.train_src/train_tgt of CONFIG with a sentencepiece model (--spm, or one trained as `train`
    would) into OUT, streaming in bounded memory; training reads it with --set data.train_store=OUT instead of
    the text (§5.1: millions of pairs).
    """
    from .config import load_config
    from .data import check_parallel
    from .files import staging
    from .prepare import read_twice, resolve_data_path
    from .store import check_store_folder, write_store
    from .tokenizer import Tokenizer
    from .vocabulary import train_vocabulary

    cfg = load_config(args.config, args.set)
    d = cfg.data
    if not d.train_src or not d.train_tgt:
        raise ConfigError("data.train_src and data.train_tgt must be set (the corpus to encode)")
    if args.spm is not None and args.spm.is_dir() and (args.spm / "spm.model").is_file():
        args.spm = args.spm / "spm.model"  # a run folder: its vocabulary
    if args.spm is not None and not args.spm.is_file():
        what = "a folder without spm.model" if args.spm.is_dir() else "no such file"
        raise ConfigError(f"--spm {args.spm}: {what} (a sentencepiece model, e.g. RUN/spm.model)")
    tokenizer = None if args.spm is None else Tokenizer(args.spm)  # read where it was given: its errors name it
    src, tgt = (resolve_data_path(getattr(d, name), f"data.{name}") for name in ("train_src", "train_tgt"))
    out = Path(args.out)
    if tokenizer is None:  # the vocabulary is trained on the text first
        src, tgt = read_twice(src, "data.train_src"), read_twice(tgt, "data.train_tgt")
    check_store_folder(out, args.overwrite)  # before the vocabulary's training, not after it
    # the two files read through once (line counts, UTF-8), as `train` does before its vocabulary: a mismatch was
    # found after the vocabulary was trained and the pairs encoded, hours on WMT (a pipe, with --spm, is read once)
    if src.is_file() and tgt.is_file():
        check_parallel(src, tgt)
    out.parent.mkdir(parents=True, exist_ok=True)
    # the vocabulary's folder, beside the store (a killed preprocess's goes at the next)
    with staging(out.parent, f"{out.name}.vocabulary", directory=True) as tmp:
        spm = args.spm or tmp / "spm.model"
        if tokenizer is None:
            tokenizer = train_vocabulary(cfg, src, tgt, spm, log=lambda m: print(m, file=sys.stderr))
        meta = write_store(src, tgt, tokenizer, out, d.max_len, progress=sys.stderr.isatty(),
                           overwrite=args.overwrite, vocabulary=spm, task=d.task,
                           log=lambda m: print(m, file=sys.stderr))
    print(f"{out}: {meta['n_kept']:,} pairs of {meta['n_pairs']:,} ({meta['skipped_empty']} with an empty side, "
          f"{meta['skipped_long']} longer than {d.max_len} pieces with EOS skipped); train with "
          f"--set data.train_store={out}" + (
              f" --set data.vocab_size={tokenizer.vocab_size} (--spm's size; the config says {d.vocab_size})"
              if tokenizer.vocab_size != d.vocab_size else ""))  # which training checks against the store's


def _prepare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("corpus", choices=["wmt14-en-de", "wmt14-en-fr"], help="the paper's WMT 2014 task (§5.1)")
    _output(p, "--dest", folder=True, required=True, help="output folder")
    p.add_argument("--mirror", help="base URL or folder holding the same archives (a local copy)")


@command("prepare", _prepare_arguments, (
    "transformer prepare wmt14-en-de --dest data",
))
def cmd_prepare(args: argparse.Namespace) -> None:
    """Download and extract a paper's data set (WMT 2014).

    Downloads the §5.1 training corpora and newstest2013/2014 into DEST as line-aligned train/valid/test files
    with a MANIFEST.json of line counts and hashes.
    """
    from .prepare import prepare

    manifest = prepare(args.corpus, Path(args.dest), args.mirror, log=lambda m: print(m, file=sys.stderr))
    print(json.dumps({k: v for k, v in manifest.items() if k != "archives"}, indent=2))


def _export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=_in_path, help="run folder written by `transformer train`")
    p.add_argument("--format", choices=["ctranslate2", "huggingface", "onnx"], default="ctranslate2",
                   help="ctranslate2: a CTranslate2 model folder; huggingface: a transformers model folder (Marian "
                   "for post-norm runs, Pegasus for pre-norm ones) with its tokenizer; onnx: that model through "
                   "optimum's ONNX exporter, for ONNX Runtime (default: ctranslate2)")
    _output(p, "--out", folder=True, replaced=True, required=True,
            help="output folder (must be empty or new, or an earlier export with --overwrite)")
    p.add_argument("--checkpoint", type=_in_path, help="weights file to export, or 'best' for the run's "
                   "best.safetensors (default: the average of the last decode.average_last checkpoints, §6.1)")
    p.add_argument("--quantization", choices=["int8", "int8_float32", "int16", "float16"],
                   help="store weights quantized (--format ctranslate2 only; default: float32)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export at --out (a folder of files "
                   "with config.json; any other non-empty folder is refused)")
    p.add_argument("--force", action="store_true", help=argparse.SUPPRESS)  # --overwrite's old name, as it was


@command("export", _export_arguments, (
    "transformer export runs/mine --format ctranslate2 --out model_ct2",
    "transformer export runs/mine --format huggingface --out model_hf",
))
def cmd_export(args: argparse.Namespace) -> None:
    """Export a run's model to CTranslate2, Hugging Face transformers or ONNX.

    Writes the weights Translator uses (the average of the last checkpoints, or --checkpoint). ctranslate2: a
    CTranslate2 model folder with the run's spm.model beside it (the [export] extra).
    huggingface: config.json, model.safetensors, generation_config.json, a tokenizer that gives the run's ids
    and a model card, for AutoModelForSeq2SeqLM / AutoTokenizer.from_pretrained(OUT); onnx: encoder and decoder
    graphs for optimum's ORTModelForSeq2SeqLM.from_pretrained(OUT) (both: the [hf] extra).
    """
    from .export import ExportError, export_ctranslate2, export_huggingface, export_onnx

    def log(message: str) -> None:
        print(message, file=sys.stderr)

    if args.force:  # preprocess named the same idea --overwrite; one name now, the old one still understood
        log("note: --force is now --overwrite (as `transformer preprocess` names it); --force will be removed")
    overwrite = args.overwrite or args.force
    if args.quantization and args.format != "ctranslate2":
        raise ExportError(f"--quantization is for --format ctranslate2; --format {args.format} stores float32")
    if args.format == "ctranslate2":
        export_ctranslate2(args.run_dir, args.out, args.checkpoint, args.quantization, overwrite, log=log)
    elif args.format == "huggingface":
        export_huggingface(args.run_dir, args.out, args.checkpoint, overwrite, log=log)
    else:
        export_onnx(args.run_dir, args.out, args.checkpoint, overwrite, log=log)


def _attention_arguments(p: argparse.ArgumentParser) -> None:
    _decode_options(p)
    p.add_argument("--src", required=True, help=f"source sentence (at most {ServeLimits().max_attention_pieces} "
                   "pieces with EOS, as --tgt: a figure of more is illegible)")
    p.add_argument("--tgt", help="target sentence to teacher-force (default: the model's own translation)")
    p.add_argument("--kind", choices=["enc-self", "dec-self", "cross"], default="enc-self",
                   help="which attention (default enc-self; the HTML page holds all three and opens at this one, as "
                   "it does at the other options' choices); dec-self's rows are the tokens each position predicts, "
                   "its columns the tokens they read, so a position's weight on itself is one left of the diagonal")
    p.add_argument("--layer", type=int, default=1, help="layer, 1-based (default 1)")
    p.add_argument("--heads", default="all", help="'all' or a list of 1-based heads such as 1,3 (default all; the "
                   "HTML page shows one head or all)")
    p.add_argument("--style", choices=["links", "heatmap", "both"], default="both", help="drawing style (default "
                   "both; the HTML page shows one at a time, links for both)")
    p.add_argument("--words", action="store_true", help="merge sub-words into words (a word's weight is the sum "
                   "over its pieces as keys, the mean over its pieces as queries); the HTML page has a switch")
    _output(p, "--out", suffixes=(".png", ".html"), required=True, help="FILE.png or FILE.html")


@command("attention", _attention_arguments, (
    "transformer attention runs/mine --src 'A dog runs.' --out attention.html",
))
def cmd_attention(args: argparse.Namespace) -> None:
    """Draw a run's attention weights for one sentence (appendix Figs. 3-5).

    Teacher-forces --tgt (or the model's own translation) and draws every head of one layer: coloured links per
    head (as Figures 3-5 draw them) and per-head heatmaps (the same weights as matrices) as a PNG, or an
    interactive self-contained HTML page with every layer, head and kind (hover a token to isolate its links, as
    Figures 3 and 4 show one word's).
    """
    from .figures import (KIND_NAMES, FigureError, attention_html, attention_maps, chosen_heads, draw_attention,
                          target_pieces)

    try:
        heads = None if args.heads == "all" else [int(h) for h in args.heads.split(",")]
    except ValueError:
        raise FigureError(f"--heads {args.heads!r}: give 'all' or head numbers such as 1,3") from None
    request = _request(args)
    translator, said = _translator(args, request)
    if args.tgt is not None and translator.blank([args.tgt])[0]:  # no piece: blank, or zero-width spaces alone
        raise FigureError("--tgt is empty: give the target sentence, or leave --tgt out to draw the model's own "
                          "translation")
    m = translator.cfg.model  # --layer and --heads, before any decoding
    chosen_heads(m.n_enc_layers if args.kind == "enc-self" else m.n_dec_layers, m.n_heads, args.layer, heads)
    page = args.out.suffix.lower() == ".html"
    if page and heads is not None and len(heads) > 1:
        said.append(f"note: --heads {args.heads}: the HTML page shows one head or all; it opens at all")
    # the page opens at the options' choices (they were ignored, said in a note): its menus' own names
    view = {"kind": KIND_NAMES[args.kind], "layer": args.layer - 1, "style": "heatmap" if args.style == "heatmap"
            else "links", "head": heads[0] - 1 if heads is not None and len(heads) == 1 else "all",
            "unit": "words" if args.words else "pieces"}

    if args.tgt is not None and (searched := [f"--{name.replace('_', '-')}" for name in
                                              ("beam", "alpha", "length_norm", "max_len_offset", "batch_size",
                                               "early_stop") if getattr(args, name) is not None]):
        said.append(f"note: {', '.join(searched)} {'shape' if len(searched) > 1 else 'shapes'} the model's own "
                    "translation; with --tgt there is none to search")

    def drawable(text: str, what: str, shorter: str = "give a shorter sentence") -> None:
        # as the server's figures: a longer side is illegible, and a PNG of 800 words took more memory than the
        # machine had; the source's pieces are counted as a target's
        limit = ServeLimits().max_attention_pieces
        if (n := target_pieces(translator, text) + 1) > limit:
            raise FigureError(f"{what}: {n} pieces with EOS, more than the {limit} a figure draws: {shorter}")

    drawable(args.src, "--src")
    if args.tgt is not None:
        drawable(args.tgt, "--tgt")
    # as translate's --prefix names them; a parsing run's source as it reads it (its brackets as -LRB-, ...)
    for option, text, source in (("--src", args.src, True), ("--tgt", args.tgt or "", False)):
        if lacking := translator.unknown(text, source=source):
            said.append(f"note: {option}: the model's vocabulary has no piece for {', '.join(map(repr, lacking))}: "
                        "the model reads each as its unknown piece, whatever the figure's label shows")
    tgt = args.tgt if args.tgt is not None else _translate_lines(translator, [args.src], request)[0]
    # the source fits (checked above): its translation ran on, up to --max-len-offset pieces past it
    drawable(tgt, "the model's translation", "give the translation to draw with --tgt, or bound it with a smaller "
                                             "--max-len-offset")
    maps = attention_maps(translator, args.src, tgt)  # checks the sentence: nothing is said before its error
    if args.tgt is None:
        # after what loading the model said; an empty one was a bare "translation: "
        said.append(f"translation: {tgt}" if tgt.strip() else "translation: (empty: the model wrote its end at once)")
    if page:  # holds sub-word and word maps both
        files.write_text(args.out, attention_html(maps, f"attention: {args.src}", view))
    else:
        if missing := draw_attention(maps.merged() if args.words else maps, KIND_NAMES[args.kind], args.layer, heads,
                                     args.out, args.style):
            said.append(f"note: the font has no glyph for {', '.join(map(repr, missing))}: drawn as boxes (the .html "
                        "page shows them with the browser's fonts)")
    _tell(said)
    print(f"wrote {args.out}", file=sys.stderr)


def _plot_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=_in_path, help="run folder written by `transformer train`")
    _output(p, "--out", suffixes=(".png",), help="PNG file (default RUN_DIR/training.png)")


@command("plot", _plot_arguments, (
    "transformer plot runs/mine",
))
def cmd_plot(args: argparse.Namespace) -> None:
    """Plot a run's training curves from its log.

    Training and validation loss, perplexity, learning rate and dev BLEU (when train.bleu_every is set) against
    updates and wall-clock minutes, from RUN_DIR/metrics.jsonl.
    """
    from .checkpoint import run_folder
    from .figures import FigureError, plot_training

    metrics = run_folder(args.run_dir) / "metrics.jsonl"
    if metrics.is_dir():  # "no metrics.jsonl" of one that is there
        raise FigureError(f"{metrics}: a folder, not the run's log of metrics")
    if not metrics.is_file():
        raise FigureError(f"{args.run_dir}: no metrics.jsonl (not a run folder, or no step logged yet)")
    out = args.out or check_output(args.run_dir / "training.png", "--out")  # as main checks a given --out
    drawn = plot_training(metrics, out)
    print(f"wrote {out} ({', '.join(drawn)})", file=sys.stderr)


def _serve_arguments(p: argparse.ArgumentParser) -> None:
    _decode_options(p)
    _ensemble_option(p)  # the table of options (docs/decoding.md) is the server's too
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port to listen on (default 8000)")
    p.add_argument("--no-batching", action="store_true", help="decode one request at a time")
    for f in dataclasses.fields(ServeLimits):  # the limits' one source of defaults and help texts
        if "help" in f.metadata:
            p.add_argument("--" + f.name.replace("_", "-"), type=int if f.type == "int" else float, default=f.default,
                           help=f"{f.metadata['help']} (default {f.default})")


@command("serve", _serve_arguments, (
    "transformer serve runs/mine --port 8000",
))
def cmd_serve(args: argparse.Namespace) -> None:
    """HTTP API and web page: translation and attention (FastAPI + uvicorn).

    POST /v1/translate {"text": [...], "beam": 4, "alpha": 0.6, ...}; POST /v1/score {"text": [...],
    "translation": [...]}; POST /v1/attention {"text": "..."}; GET /health; GET / the web page; GET
    /openapi.json the OpenAPI description (shown at /docs). Requests from all clients are decoded together
    (dynamic batching).
    """
    try:
        import h11  # noqa: F401 (imported late in serve.py, as uvicorn: a missing one is as missing as fastapi)
        import uvicorn  # noqa: F401

        from .serve import serve
    except ImportError as e:
        raise ConfigError(f"serving needs the optional dependencies: {install_extra('serve')} ({e})") from None

    limits = ServeLimits(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ServeLimits)
                            if "help" in f.metadata}, batching=not args.no_batching)
    serve(args.run_dir, args.host, args.port, limits, args.checkpoint, args.int8, args.device, _decode_overrides(args),
          args.ensemble, args.bf16)


def _preset(text: str) -> str:
    """A config file or preset name, refused when empty (load_config's own refusal spoke of Python types)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty: give a config file or a preset name")
    return text


def _in_path(text: str) -> Path:
    """An input's path, refused when empty: Path("") is the current folder, and `--checkpoint "$CKPT"` with CKPT
    unset was "--checkpoint .: not a checkpoint file"."""
    if not text:
        raise argparse.ArgumentTypeError("empty: give a path")
    return Path(text)


def _out_path(text: str) -> Path:
    """An output's path, refused when empty (``_in_path``): `--out "$RUN"` with RUN unset trained into the current
    folder (checkpoints, config.toml and train.log beside the user's files). "-" too: it is stdout to the options
    that take it, and here it went unchecked into a file or folder called "-"."""
    _in_path(text)
    if text == "-":
        raise argparse.ArgumentTypeError("- (stdout): this output is a file or folder; give its path")
    return Path(text)


def _standard(text: str) -> Path | None:
    """An --input or --output whose default is stdin / stdout: "-" names that stream, as in most tools (it
    was read or written as a file called "-")."""
    return None if text == "-" else _out_path(text)


STDIN, STDOUT = Path("/dev/stdin"), Path("-")  # "-" given to an option whose default is not that stream


def _beside_input(text: str) -> Path:
    """A file read beside the input, line for line (--prefix, --constraints): stdin is the input's."""
    if text == "-":
        raise argparse.ArgumentTypeError("- (stdin) is the input's; give the lines as a file (bash: <(command))")
    return Path(text)


def _language(text: str) -> str:
    """A language tag as --lang takes it (de, pt-BR, zh_Hans): "" was taken for none given, and "de de" was
    scored as an unknown language, each without a word."""
    if not re.fullmatch(r"[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{1,8})*", text):
        raise argparse.ArgumentTypeError(f"{text!r}: not a language tag (de, en, pt-BR, zh-Hans)")
    return text


def _input(text: str) -> Path:
    """An input file whose default is not stdin (one side of `score`'s pairs, evaluate's files): "-" reads
    stdin."""
    return STDIN if text == "-" else Path(text)


def _one_stdin(*given: tuple[str, int]) -> None:
    """Refuses stdin ("-") named more than once among a command's inputs (option, times it is "-"): the first
    would read it whole and the others nothing."""
    if sum(n for _, n in given) > 1:
        raise ConfigError(f"{' and '.join(o for o, n in given if n)}: - (stdin) given more than once; it holds one "
                          "input: give the others as files")


def _dash_output(text: str) -> Path:
    """An output file whose default is no output (evaluate's --json, --hyp-out): "-" writes stdout."""
    return STDOUT if text == "-" else _out_path(text)


def _file_named(kind: Callable[[str], Path | None]) -> Callable[[str], Path | None]:
    """``kind`` for an output that is a file: a name ending in / is refused (Path drops the slash: `linearize --out
    odir/` wrote odir.words, ... beside the folder it named, and `--output out/` a file called out)."""

    def named(text: str) -> Path | None:
        if text.endswith(("/", os.sep)):
            raise argparse.ArgumentTypeError(f"{text}: a folder's name (it ends in /); give a file name")
        return kind(text)

    return named


def _output(p: argparse.ArgumentParser, option: str, suffixes: tuple[str, ...] = (), folder: bool = False,
            standard: bool = False, dash: bool = False, replaced: bool = False, **kwargs) -> None:
    """An option naming where a command writes: ``main`` checks it (``files.check_output``) before the
    command starts, so no finished work is lost to a path that cannot take it. ``standard``: "-" is stdout,
    the default; ``dash``: "-" is stdout (``STDOUT``), where the option's default is no output; ``replaced``:
    a folder written beside itself and renamed into place."""
    kind = _standard if standard else _dash_output if dash else _out_path
    action = p.add_argument(option, type=kind if folder else _file_named(kind), **kwargs)
    p.set_defaults(outputs={**(p.get_default("outputs") or {}), action.dest: (option, suffixes, folder, replaced)})


class _Parser(argparse.ArgumentParser):
    """argparse drops a failed write of its help: `--help > /dev/full` exited 0 with nothing written. Here the
    write's error goes up to ``main``, which says it as any output's (a closed pipe: quietly). A usage error's
    lines into a stderr that fails are still dropped: its exit status (2) says more than the write's would."""

    def _print_message(self, message: str, file: IO[str] | None = None) -> None:
        if file is not sys.stdout:
            return super()._print_message(message, file)
        file.write(message)
        file.flush()


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's, except that a command's examples are kept one to a line, as written (argparse runs an epilog's
    lines together into one paragraph)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n\n".join(part if part.startswith("examples:") else super(_HelpFormatter, self)._fill_text(
            part, width, indent) for part in text.split("\n\n"))


class _CommandParser(_Parser):
    """A command's parser: an option it does not know is its own usage error (exit 2), told with its usage.
    argparse hands such arguments up to the top-level parser, whose usage names no option of the command."""

    def parse_known_args(self, args: list[str] | None = None,
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        self._given = list(args or [])
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    def error(self, message: str) -> NoReturn:
        # `--ensemble A B RUN_DIR`: the list took the run folder too, and argparse says only that it is missing
        if "required: run_dir" in message and "--ensemble" in getattr(self, "_given", []):
            message += " (--ensemble takes every folder after it: give RUN_DIR first, or end the list with --)"
        super().error(message)


def version_line() -> str:
    """What a bug report needs first: this package's version, torch's (read from its installed metadata:
    importing torch would take a second) and Python's."""
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "not installed"
    return f"transformer {__version__} (torch {torch_version}, Python {platform.python_version()})"


class _VersionAction(argparse.Action):
    """argparse's own "version" action takes the text when the parser is built, which would look up torch's
    metadata at every command's start; this one looks only when --version is given."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> NoReturn:
        print(version_line())  # on stdout, as argparse's own action writes it
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="transformer", epilog=EPILOG,
                     description="The Transformer of 'Attention Is All You Need': train, translate, evaluate.")
    parser.add_argument("--version", action=_VersionAction,
                        help="show this package's version and torch's and Python's (for a bug report), and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_CommandParser)
    for c in COMMANDS:
        examples = "".join(f"\n  {line}" for line in c.examples)
        c.arguments(sub.add_parser(c.name, help=c.help, description=c.description, formatter_class=_HelpFormatter,
                                   epilog=f"examples:{examples}\n\n{EPILOG}" if examples else EPILOG))
        sub.choices[c.name].set_defaults(func=c.run)
    return parser


# a path that is there but of the other kind: a run's train.log, metrics.jsonl or config.toml made a folder,
# its tb/ a file. What is on the disk, not a bug: said in one line with the path (exit 1)
PATH_OF_ANOTHER_KIND = frozenset({errno.EISDIR, errno.ENOTDIR, errno.EEXIST})
INTERNAL_ERROR = 70  # sysexits.h's EX_SOFTWARE: the program failed, not what it was given


def internal_error(error: Exception, argv: list[str]) -> int:
    """An exception no check foresaw is a bug, kept apart from the user's errors: one line that says so
    on stderr, the traceback (after the command and ``version_line``) in transformer-error-PID.log under the
    system's temporary folder (where the user can attach it to a report without a screenful of it in the way),
    and INTERNAL_ERROR. In a rank of a data-parallel job, a collective that fails because another rank is gone
    is that rank's doing: one line that says so, and status 1."""
    text = "".join(traceback.format_exception(error))
    log = Path(tempfile.gettempdir()) / f"transformer-error-{os.getpid()}.log"
    try:
        log.write_text(f"transformer {' '.join(argv)}\n{version_line()}\n\n{text}", encoding="utf-8",
                       errors="backslashreplace")  # an argument of bytes that are no UTF-8 failed this write
        where = f"the traceback in {log}"
    except OSError:  # no writable temporary folder: the traceback goes where the user can see it
        sys.stderr.write(text)
        where = "the traceback above"
    if "WORLD_SIZE" in os.environ:  # a rank of a torchrun job: torch.distributed is loaded already
        from .distributed import lost_contact_line

        if line := lost_contact_line(error):  # another rank went first: its own output says why
            say(f"{line} ({where})")
            return 1
    say(f"{summary(error)} — please report it with {where}")
    return INTERNAL_ERROR


def say(line: str) -> None:
    """``line`` on stderr in one write: the ranks of a data-parallel job share the terminal, and print's
    separate write of the newline lets their lines run together. What stdout holds goes first, so that
    ``2>&1`` keeps the order in which things were said."""
    with contextlib.suppress(OSError, ValueError):  # a closed or broken stdout: the line is still said
        sys.stdout.flush()
    sys.stderr.write(line + "\n")


RUN_RECORDS = ("config.toml", "train.log", "metrics.jsonl", "summary.json", "spm.model", "spm.json",  # train's
               "best.safetensors", "best.json")


def _is_run(folder: Path) -> bool:
    """Whether ``folder`` is a run folder that training wrote (its config and its log or checkpoints)."""
    return (folder / "config.toml").is_file() and ((folder / "checkpoints").is_dir() or (folder / "train.log").is_file())


def _not_an_input(args: argparse.Namespace, path: Path, option: str, outputs: dict,
                  named: dict[str, str] | None = None) -> None:
    """OutputError if ``path`` is a file the command also reads (``--output in.txt --input in.txt``), or a
    record of a run (``evaluate RUN --json RUN/summary.json``), or in a run's checkpoints folder: the output
    would replace it, and the input be lost. Any run's, not only the one the command reads: `average RUN1 --out
    RUN2/checkpoints/step_N.safetensors` replaced RUN2's newest checkpoint, and `translate RUN1 --output
    RUN2/spm.model` its vocabulary. ``named``: what gave an input that no option did (evaluate's
    "the run's data.test_tgt"), by its argument's name."""
    target = Path(path).resolve()
    board = target.parent.name == files.BOARD  # training's TensorBoard log: an event file was replaced
    for run in (target.parent, target.parent.parent):
        if _is_run(run) and (target.parent == run and target.name in RUN_RECORDS
                             or files.kept_by_training(target.parent) or board):
            own = isinstance(given := getattr(args, "run_dir", None), Path) and given.resolve() == run
            who = "the run's" if own else f"run {run}'s"
            if target.parent == run or target.exists():
                raise OutputError(f"{option} {path}: is {who} own {target.name}, which training wrote; writing it "
                                  "would replace it: give another file")
            raise OutputError(f"{option} {path}: is in {who} {target.parent.name} folder, which training keeps (" + (
                "its TensorBoard log" if board else "a file there may be taken for a checkpoint, or replace one") +
                "): give another folder")
    if not Path(path).is_file():
        return
    for dest, value in vars(args).items():
        if dest not in outputs and isinstance(value, Path) and value.is_file() and os.path.samefile(value, path):
            given = (named or {}).get(dest, "--" + dest.replace("_", "-"))
            raise OutputError(f"{option} {path}: is {given} {value}, which the command reads; writing it would "
                              "replace that file: give another")
    weights = getattr(args, "checkpoint", None)  # a weights file's record is read too (average's avg.json beside
    if isinstance(weights, Path) and weights.name.lower().endswith(".safetensors"):  # avg.safetensors): was lost
        from .checkpoint import json_for

        if (record := json_for(weights)).is_file() and os.path.samefile(record, path):
            raise OutputError(f"{option} {path}: is the record of --checkpoint {weights}, which the command reads; "
                              "writing it would replace it, and the weights could no longer be loaded: give another "
                              "file")


def _outputs_not_inputs(args: argparse.Namespace, named: dict[str, str]) -> None:
    """``_not_an_input`` of each output against the inputs as they are now: a command that fills an input in
    from the run's config (evaluate's test set, ``named`` by its field) checks again, else `evaluate RUN
    --hyp-out` wrote over the run's own test references without a word."""
    outputs = getattr(args, "outputs", None) or {}
    for dest, (option, *_) in outputs.items():
        if (given := getattr(args, dest)) not in (None, STDOUT):
            _not_an_input(args, given, option, outputs, named)


def _terminate(signum: int, frame) -> None:
    Terminated.signalled = signum  # kept, should the exception be lost (``Terminated.signalled``)
    raise Terminated(signum)


def _interrupt(signum: int, frame) -> None:
    Terminated.signalled = signum  # Python's own handler of SIGINT, which keeps it too
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """SIGTERM (and SIGHUP where not ignored) raises ``Terminated`` in the block, as SIGINT raises
    KeyboardInterrupt (training's loop takes them itself, and gives this back after). Not where SIGTERM is
    ignored (whoever started us chose that), nor off the main thread, which alone takes signals. Each is also
    kept (``Terminated.signalled``), for training to stop with should its exception be lost."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    Terminated.signalled = None
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, _terminate)}
    # the terminal closing under a command: its default ended it at once, an --output's temporary file left
    # behind; under nohup (ignored) it stays so
    if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) == signal.SIG_DFL:
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, _terminate)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, _interrupt)
    try:
        yield
    except Exception as e:  # after a stop signal whose exception was lost (a module left half imported): its stop
        if (stop := _lost_stop()) is None:
            raise
        raise stop from e
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        Terminated.signalled = None


def _lost_stop() -> BaseException | None:
    """The exception of the stop signal kept in ``Terminated.signalled`` (whose own may have been lost), if any."""
    if Terminated.signalled is None:
        return None
    return KeyboardInterrupt() if Terminated.signalled == signal.SIGINT else Terminated(Terminated.signalled)


class _ClosedOutput(io.TextIOBase):
    """sys.stdout for a command started with it closed (``>&-``; Python then sets it to None): what the command
    would print there is lost, which is the user's to fix, said in one line (not an AttributeError)."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise OutputError("standard output is closed (>&-): give --output FILE where the command has it, or "
                          "send it to /dev/null")


class _Diagnostics:
    """sys.stderr, whose lines are dropped where they cannot be written (``2>/dev/full``, a descriptor closed
    under a wrapper script, a reader that left): the command's results and its exit status are what it is run
    for; a failed "averaging the last 5 checkpoint(s)" ended translate before its first line, with 1."""

    def __init__(self, stream: io.TextIOBase) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except (OSError, ValueError):  # ValueError: a file closed under it
            return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stream.flush()

    def __getattr__(self, name: str):  # isatty, fileno, encoding: the stream's own
        return getattr(self.stream, name)


def _standard_streams() -> None:
    """Stands in for a standard stream the command was started without, or that fails: stderr's lines go
    nowhere, as the user asked (the exit status still tells), and a write to stdout is refused
    (``_ClosedOutput``). Under a locale of another encoding (LANG=de_DE.ISO-8859-1, PYTHONIOENCODING), stdout
    writes UTF-8, as the output files and every input are (a piece "▁" in `score --json` was an internal
    error), and stderr escapes what its encoding lacks (its line was dropped whole)."""
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")
    if not isinstance(sys.stderr, _Diagnostics):
        if not _utf8(sys.stderr):
            with contextlib.suppress(AttributeError, ValueError, OSError):
                sys.stderr.reconfigure(errors="backslashreplace")
        sys.stderr = _Diagnostics(sys.stderr)
    if sys.stdout is None:
        sys.stdout = _ClosedOutput()
    elif not _utf8(sys.stdout):
        with contextlib.suppress(AttributeError, ValueError, OSError):
            sys.stdout.reconfigure(encoding="utf-8")


def _drop_stdout() -> None:
    """stdout's descriptor onto /dev/null, once a write to it has failed: the interpreter's last flush of what its
    buffer kept fails no more (a second message, and exit status 120)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # a stdout of no descriptor: a test's capture
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _utf8(stream: io.TextIOBase) -> bool:
    return codecs.lookup(getattr(stream, "encoding", None) or "utf-8").name == "utf-8"


def main(argv: list[str] | None = None) -> int:
    """The command line (``argv``; None: this process's own arguments). Its exit status."""
    status = _main(sys.argv[1:] if argv is None else argv)
    if argv is None and threading.current_thread() is threading.main_thread():
        # the process ends with the work done: a Ctrl-C as the interpreter shut down (torch's exit handlers) printed
        # "Exception ignored in atexit callback" with a traceback, or took the status for 130 without a word
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return status


def _main(argv: list[str]) -> int:
    _standard_streams()
    try:
        # SIGTERM and Ctrl-C said in one line from the first moment: a rank of `train --nproc N` spends its first
        # seconds importing, and its launcher passes a stop signal on to it there too (it printed a traceback)
        with sigterm_raises():  # an output being written is removed, as on Ctrl-C
            if "TRANSFORMER_LAUNCHER_PID" in os.environ:  # a rank of `train --nproc N`: it ends with its launcher
                from .distributed import die_with_launcher

                die_with_launcher()
            if undecodable := next((a for a in argv if any("\udc80" <= c <= "\udcff" for c in a)), None):
                # bytes that are no UTF-8 (Python's surrogate escapes): the JSON and TOML records cannot hold them
                shown = undecodable.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
                raise ConfigError(f"{shown}: not valid UTF-8 (a path or value the run's records could not hold): "
                                  "give it in UTF-8")
            args = build_parser().parse_args(argv)  # an OutputError: --help into a closed stdout
            outputs = getattr(args, "outputs", None) or {}
            written: dict[Path, str] = {}  # each output's resolved path, and its option
            for dest, (option, suffixes, folder, replaced) in outputs.items():
                if (given := getattr(args, dest)) is None:
                    continue
                if given != STDOUT:
                    check_output(given, option, suffixes, folder, replaced)
                    _not_an_input(args, given, option, outputs)
                if (same := written.setdefault(Path(given).resolve(), option)) != option:  # two -: one output too
                    raise OutputError(f"{option} {given}: is also {same}'s; one file cannot hold both outputs: give "
                                      "each its own")
            if (threads := getattr(args, "threads", None)) is not None:  # the decoding commands' --threads
                if not 1 <= threads <= MAX_THREADS:
                    raise ConfigError(f"--threads {threads}: give 1 .. {MAX_THREADS} (default: one per core)")
                import torch

                torch.set_num_threads(threads)
            args.func(args)
            sys.stdout.flush()  # a report still in the buffer meets a closed pipe here, not in the interpreter's exit
    except UserError as e:  # SIGTERM / SIGINT during training too: "stopped", 143 / 130
        if e.said:
            say(summary(e))
        return e.exit_code
    except (KeyboardInterrupt, Terminated) as e:
        signum = e.signum if isinstance(e, Terminated) else signal.SIGINT
        # Ctrl-C reaches every rank of a job: rank 0 says it
        if job_world() <= 1 or os.environ.get("RANK") == "0":
            say({signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}.get(signum, "hangup"))
        return 128 + signum
    except BrokenPipeError as e:
        if not _stdout_gone():
            return internal_error(e, argv)
        _drop_stdout()
        return READER_GONE
    except OSError as e:  # a disk or quota full, a read-only folder, a file not permitted: the user's to fix,
        if e.errno in PATH_OF_ANOTHER_KIND and (e.filename2 or e.filename):  # rename(tmp, dst): dst is in the way
            say(f"error: {e.filename2 or e.filename}: {e.strerror}: a folder where a file is written, or the reverse "
                "(in a run folder: something put in place of one of its files); move it away")
            return 1
        if e.errno not in files.UNWRITABLE:  # wherever the package or a library writes (files.WriteError's kinds)
            return internal_error(e, argv)
        say(f"error: {e.filename}: {e.strerror}" if e.filename else f"error: {e.strerror} (writing an output)")
        if not e.filename:  # stdout's (`--help > /dev/full`): what its buffer kept failed again as Python exited, 120
            _drop_stdout()
        return 1
    except Exception as e:  # not a UserError: a bug, told apart (internal_error)
        if (asked := out_of_memory(e)) is None:
            return internal_error(e, argv)
        say(f"error: out of memory{f' ({asked})' if asked else ''}: more than this machine can give; a very long "
            "input line, too large a batch (--batch-size, train.max_tokens, decode.beam_size) or too large a model "
            "(model.d_model, d_ff, layers) needs it: shorten or split the line, or lower the batch or the model"
            )  # the input's or the config's size, not a bug: nothing to report
        return 1
    return 0
