"""The training loop (§5): token-budget batches, Adam + eq. (3), label smoothing, checkpoints, resume.

A run folder holds everything needed to continue or to use the model: ``config.toml`` (the resolved
config), ``spm.model`` (the joint BPE vocabulary), ``checkpoints/`` (safetensors + JSON),
``train.log`` (plain text), ``metrics.jsonl`` (one JSON record per log line) and ``tb/``
(TensorBoard). Resuming restores weights, optimizer moments, the step counter, the position in the
epoch and the RNG state, so a resumed run reproduces an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import os
import platform
import shutil
import signal
import stat
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from . import __version__, distributed, files
from .distributed import Dist

from .checkpoint import (Checkpoint, CheckpointError, PICKLE_SUFFIXES, average_last, checkpoint_record,
                         clear_debris, epochs_into, latest_checkpoint, list_checkpoints, load_checkpoint, load_weights,
                         one_run, record_step, save_checkpoint, unrecorded, write_model)
from .config import (MAX_UPDATE_FREQ, Config, ConfigError, DataConfig, ModelConfig, TrainConfig, as_path, check_bools,
                     config_from_dict, dump_toml, language_code, primary_language, read_toml)
from .data import (BATCH_ORDERS, Batch, BatchOrder, DataError, Example, SampledEpochs, ShapeBuckets, batches_sha256,
                   collate, encode_pairs, lengths, make_batches, make_batches_from_lengths, padding_fraction,
                   pair_named, read_parallel)
from .errors import Terminated, UserError, summary as error_line
from .loss import label_smoothed_loss
from .model import Transformer, count_parameters, on_meta
from .optim import cooldown, learning_rate, make_optimizer
from .prepare import read_twice, resolve_data_path
from .runtime import emulated_on_cpu, keep_freed_memory, native_bf16
from .store import TokenStore
from .tokenizer import Tokenizer
from .vocabulary import check_tree_symbols, open_vocabulary


class TrainError(UserError, RuntimeError):
    """A user-facing problem with a run (its folder, its resume state); one-line message."""


HANGUP = (signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ()  # none on Windows
LARGE_TEXT = 200_000  # training pairs from which encoding the text is said first: ~30 s a million, silent before


class TrainInterrupted(TrainError):
    """SIGTERM, SIGINT or SIGHUP: the current step finished and a checkpoint was written. The command line
    exits with 128 + the signal number (143 for SIGTERM, 130 for SIGINT, 129 for SIGHUP), as shells do."""

    label = "stopped"

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.exit_code = 128 + signum


class StopSignals:
    """Turns the first SIGTERM / SIGINT / SIGHUP into a request to stop after the current step (a second
    one stops at once: one taken after the first was; Python takes a signal between two of its operations, and
    two that arrive during one count as one). SIGHUP, the terminal closed (a dropped ssh session), ended training
    at once without a word and lost every step since the last checkpoint; it is taken only where it would do
    that (under nohup it is ignored, and stays so). Only the main thread can take signals; elsewhere this does
    nothing."""

    def __init__(self) -> None:
        # a stop signal before training whose exception was lost on its way up (``Terminated.signalled``): this one
        self.received: int | None = Terminated.signalled
        self.again: int | None = None  # a second signal, which stopped training at once
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT, *HANGUP):
                if signum in HANGUP and signal.getsignal(signum) == signal.SIG_IGN:  # nohup's
                    continue
                self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame) -> None:
        if signum in HANGUP:  # the terminal is gone: a line written to it would fail (EIO)
            leave_output(hung_up=True)
        if self.received is not None:  # the second signal: do not wait for the step
            self.restore()
            self.again = signum
            raise KeyboardInterrupt
        self.received = signum

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}


@dataclass
class TrainState:
    """Where training stands; saved in every checkpoint's JSON."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0
    batch_in_epoch: int = 0  # position in this epoch's batch order
    epoch_batches: int = 0  # batches in this epoch's order (this rank's): where in the epoch a checkpoint is
    elapsed_s: float = 0.0  # training wall time before this process
    clock_s: float = 0.0  # training time at the newest checkpoint of train.save_minutes' clock (0: none yet)
    tgt_tokens: int = 0  # non-pad target tokens trained on (all ranks)
    skipped_steps: int = 0  # steps whose gradients were not finite: not applied, not counted in ``step``
    bad_in_a_row: int = 0  # the newest of them in a row (train.max_bad_steps stops training at that many)
    # epochs whose last batch an applied step trained (None: not recorded): where training stopped after skipped
    # steps, an epoch that ended in one is still to be reported (train.interval_unit "epochs"), at the next step
    epochs_done: int | None = None
    world_size: int = 1  # data-parallel ranks that trained up to here
    best_value: float | None = None  # train.keep_best's best value so far, at step best_step
    best_step: int = 0
    evals_since_best: int = 0  # evaluations of it since (train.patience stops training at that many)
    batch_order: int = BATCH_ORDERS[-1]  # BatchOrder's seeding: a run keeps its own (a record without one: 1)


def keeping(tokens: int, max_tokens: int, update_freq: int, world: int, max_len: int,
            accumulate: bool = True) -> str | None:
    """The --set options that keep a resumed run's ``tokens`` per step on ``world`` ranks, a rank's batch never
    above ``max_tokens`` (its memory) nor below ``max_len`` (a longest pair's, which would be a batch of its own):
    the fewest accumulated batches whose size divides the step (on fewer ranks, a whole update_freq; on more,
    where none is whole, a smaller max_tokens too); None where none does. ``accumulate`` False: update_freq 1 alone
    (train.cuda_graphs refuses more)."""
    for freq in range(1, (MAX_UPDATE_FREQ if accumulate else 1) + 1):
        size, rest = divmod(tokens, freq * world)
        if size < max_len:
            break
        if not rest and size <= max_tokens:
            said = [f"train.update_freq={freq}"] if freq != update_freq else []
            said += [f"train.max_tokens={size}"] if size != max_tokens else []
            return " --set ".join(said) or None
    return None


def unresumable(ckpt: Checkpoint) -> str | None:
    """Why ``ckpt``'s record cannot be resumed from, else None: the fields ``Trainer.resume`` reads, each as
    training writes it. A record edited by hand ("step": "30", no "config") failed deep in the resume as an
    internal error; its sha256 sums cover the tensors, not the record itself."""
    meta = ckpt.meta
    if not isinstance(meta.get("config"), dict):
        return "its record holds no config table"
    if not isinstance(meta.get("optim_param_groups"), list):
        return "its record holds no optim_param_groups list"
    state = meta.get("train_state")
    if not isinstance(state, dict):
        return "its record holds no train_state object"
    fields = {f.name: f for f in dataclasses.fields(TrainState)}
    for key, value in state.items():
        if key not in fields:
            return f"train_state.{key}: not a field of the training state"
        default, count = fields[key].default, "int" in str(fields[key].type).split(" | ")  # int, or int | None
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        none = value is None and default is None  # a field not recorded yet
        if count and not none and not (number and isinstance(value, int) and value >= 0):
            return f"train_state.{key} is {value!r}, not a count"
        if not (number and math.isfinite(value) or none):
            return f"train_state.{key} is {value!r}, not a finite number"
    if state.get("batch_order", 1) not in BATCH_ORDERS:
        return f"train_state.batch_order is {state['batch_order']!r}, none of the batch orders {BATCH_ORDERS}"
    if isinstance(meta.get("step"), bool) or not isinstance(meta.get("step"), int):
        return f"its step is {meta.get('step')!r}, not a count"
    return None


@dataclass
class Run:
    """A run folder's fixed parts: config, vocabulary, data."""

    cfg: Config
    out: Path
    tokenizer: Tokenizer
    train: list[Example] | TokenStore  # anything indexable by example, giving an Example
    valid: list[Example]
    # the text of the validation pairs kept, as read once: dev BLEU translates those (read again, it translated
    # the pairs validation leaves out, a line too long for memory among them, and a pipe gave nothing the second time)
    valid_text: list[tuple[str, str]]
    batches: list[list[int]]
    sampled: SampledEpochs | None = None  # data.subword_alpha > 0: each epoch's own examples and batches
    # the sha256 of the training text's files (of a token store's meta.json), recorded in every checkpoint: a file
    # changed in place since (the config naming the same one) is refused at a resume
    text_sha256: dict[str, str] | None = None
    # the validation files' (a resume compares a file named otherwise, from another folder, by its content)
    valid_sha256: dict[str, str] | None = None


def shape_buckets(t: TrainConfig) -> ShapeBuckets | None:
    """The shapes train.shape_buckets pads the training batches to; None: the batches as §5.1 makes them."""
    return ShapeBuckets(t.shape_buckets, t.max_tokens) if t.shape_buckets else None


def run_logger(out: Path, quiet: bool = False):
    """Returns log(msg): appends to train.log and prints above the progress bar (not with ``terminal=False``:
    what the command line says there itself)."""
    path = out / "train.log"
    with contextlib.suppress(OSError):  # a line a full disk cut short: the next attempt's first line starts anew
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if size:
                f.seek(size - 1)
            cut = size > 0 and f.read(1) != b"\n"
        if cut:
            files.append_text(path, "\n")

    def log(msg: str, terminal: bool = True) -> None:
        files.append_text(path, f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg}\n")
        if terminal and not quiet:
            try:
                tqdm.write(msg)
                sys.stdout.flush()  # a pipe, nohup or a batch system's log gets each line as it is said
            except OSError as e:
                # the terminal hung up (EIO; its SIGHUP may come after), the pipe's reader left (`| head`, a tee
                # that died: EPIPE), the disk filled: train on, the lines in train.log; it ended training at once,
                # without a checkpoint
                leave_output(hung_up=e.errno == errno.EIO)
                files.append_text(path, f"{time.strftime('%Y-%m-%d %H:%M:%S')} standard output: "
                                        f"{e.strerror or e}; the log goes on here alone\n")
    return log


def leave_output(hung_up: bool) -> None:
    """Points at /dev/null what can take no more lines. After a hang-up, stdout and stderr where they are the
    terminal (a character device): every write to it fails (EIO), and training still has its step and its
    checkpoint to finish; the progress bar stops itself on that error (tqdm's own). Else stdout alone (a pipe
    whose reader left, a full disk), and the lines queued for it with it."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2) if hung_up else (1,):
            with contextlib.suppress(OSError):
                if not hung_up or stat.S_ISCHR(os.fstat(fd).st_mode):
                    os.dup2(null, fd)
    finally:
        os.close(null)


def weight_shapes(model: ModelConfig, vocab_size: int) -> dict[str, tuple[int, ...]]:
    """The name and shape of every weight of that model (``model.on_meta``: nothing allocated)."""
    return {name: tuple(w.shape) for name, w in on_meta(model, vocab_size).state_dict().items()}


DATA_FILES = ("train_src", "train_tgt", "train_store", "valid_src", "valid_tgt", "test_src", "test_tgt", "test_tok_ref")


def anchored(cfg: Config) -> Config:
    """``cfg`` with each data file given from the current folder or from ~ (a path that is there) made absolute: the
    run's records keep where it trained from, and `evaluate RUN` from another folder scored whatever file of that
    name was there, or none. A path found under a data root (multi30k/train.en.gz) stays as it is."""
    found = {}
    for name in DATA_FILES:  # "~/data/x.en" too: the run's records would depend on $HOME
        path = getattr(cfg.data, name)
        given = os.path.expanduser(path) if path else ""
        if path and not os.path.isabs(path) and os.path.exists(given):
            found[name] = os.path.abspath(given)
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, **found)) if found else cfg


def misfits(theirs: ModelConfig, ours: ModelConfig, vocab_size: int, changes: list[str]) -> list[str]:
    """Of ``changes`` ("model.x: a -> b", ``Config.differences``'), those that alone change a weight's shape: the
    refusal listed a dropout rate beside d_model as a change the weights would not fit. All of them where none
    does alone."""
    shapes, alone = weight_shapes(theirs, vocab_size), []
    for change in changes:
        field = change.split(":", 1)[0].removeprefix("model.")
        try:
            fits = weight_shapes(dataclasses.replace(theirs, **{field: getattr(ours, field)}), vocab_size) == shapes
        except (ConfigError, ValueError, TypeError):  # a value that is no model without the others' changes
            fits = False
        if not fits:
            alone.append(change)
    return alone or changes


def data_paths(cfg: Config) -> dict[str, Path]:
    """The files training reads (data.train_src / train_tgt or train_store, valid_src / valid_tgt) by field,
    each found (``resolve_data_path``); one not set or not found is refused, naming it."""
    d = cfg.data
    needed = ("valid_src", "valid_tgt") if d.train_store else ("train_src", "train_tgt", "valid_src", "valid_tgt")
    if missing := [f"data.{name}" for name in needed if not getattr(d, name)]:
        nor = f" (nor {', '.join(missing[1:])})" if len(missing) > 1 else ""
        raise ConfigError(f"{missing[0]} is not set{nor}: name the files in the config's [data] (as the complete "
                          f"recipe configs/multi30k_en_de.toml does) or with --set {missing[0]}=FILE, one --set each")
    paths = {name: resolve_data_path(getattr(d, name), f"data.{name}")
             for name in needed + (("train_store",) if d.train_store else ())}
    for name in ("train_src", "train_tgt"):
        if name in paths:
            read_twice(paths[name], f"data.{name}")
    return paths


def _saved_config(out: Path, config_path: Path) -> tuple[Config, Path] | None:
    """The config a run to resume was trained with, and the file that says it: the newest checkpoint's record,
    else (none written yet) its config.toml; None for a run that has neither. The record first: config.toml is
    written as a run starts, so a resume with changes stopped before its first checkpoint left one that names
    settings no checkpoint was trained with."""
    for record in reversed(list_checkpoints(out)):
        try:
            return config_from_dict(checkpoint_record(record)["config"], f"{record} (config)"), record
        except (CheckpointError, KeyError, ConfigError):
            continue  # a damaged record: resume() skips its checkpoint too, naming why
    if config_path.exists():
        return config_from_dict(read_toml(config_path), str(config_path)), config_path
    return None


RUN_MARKS = (".lock", "train.log", "spm.model", "checkpoints")  # one at least in a folder training has written


def disagreement(ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    """What two ranks' identities ({"config": ..., "vocabulary": sha256, and optionally "data": {what: sha256},
    "resume": bool, "init_from": path}) differ in, the first few: "model.d_ff 64 (rank 0) vs 96" (the error named
    neither the field nor the rank)."""
    mine, other = ours["config"], theirs["config"]
    said = [f"{section}.{key} {mine.get(section, {}).get(key)!r} (rank 0) vs {other.get(section, {}).get(key)!r}"
            for section in dict.fromkeys([*mine, *other])
            for key in dict.fromkeys([*mine.get(section, {}), *other.get(section, {})])
            if mine.get(section, {}).get(key) != other.get(section, {}).get(key)]
    if ours["vocabulary"] != theirs["vocabulary"]:
        said.append(f"the vocabulary (spm.model sha256 {ours['vocabulary'][:12]} (rank 0) vs "
                    f"{theirs['vocabulary'][:12]})")
    mine, other = ours.get("data", {}), theirs.get("data", {})
    said += [f"data.{name}'s file (sha256 {mine.get(name, '-')[:12]} (rank 0) vs {other.get(name, '-')[:12]})"
             for name in dict.fromkeys([*mine, *other]) if mine.get(name) != other.get(name)]
    said += [f"{option} {ours.get(key)} (rank 0) vs {theirs.get(key)}"
             for key, option in (("resume", "--resume"), ("init_from", "--init-from"))
             if ours.get(key) != theirs.get(key)]
    return "; ".join(said[:3]) + (f"; and {len(said) - 3} more" if len(said) > 3 else "")


def open_store(d: DataConfig, store_path: Path, vocabulary: Path | None, valid_pairs: list[tuple[str, str]],
               valid_tgt: Path, log) -> tuple[Tokenizer, TokenStore]:
    """A token-store run's store and vocabulary, checked: ``vocabulary`` (the run's own, where its checkpoints or
    its parent settled it), else the store's. Refused, the task first (a parsing run given a translation store was
    first told to change data.vocab_size): a store of the other task, another data.vocab_size than the store's
    vocabulary when it is the run's (its config would record a vocabulary its model does not have; a settled
    vocabulary's run logs that data.vocab_size does not apply), pairs longer than data.max_len."""
    if not store_path.is_dir():  # a text file named in its place was "a token store without spm.model"
        raise DataError(f"data.train_store {store_path}: a file, not a token store's folder (`transformer "
                        "preprocess` writes one)")
    if vocabulary is None and not (store_path / "spm.model").exists():
        raise DataError(f"{store_path}: the token store has no spm.model (write it with `transformer preprocess`)")
    tokenizer = Tokenizer(vocabulary or store_path / "spm.model")
    store = TokenStore(store_path, vocab_sha256=tokenizer.sha256)
    if store.stats.get("task", d.task) != d.task:  # a store written before the task was recorded is not checked
        kinds = {"parse": "trees", "translate": "sentences"}
        raise DataError(f"data.train_store {store_path}: pairs of data.task {store.stats['task']!r} "
                        f"({kinds.get(store.stats['task'], '?')}), and this run's data.task is {d.task!r} "
                        f"({kinds[d.task]}): write a store with this run's config")
    if vocabulary is None and tokenizer.vocab_size != d.vocab_size:  # else settled: data.vocab_size does not apply
        raise ConfigError(f"data.vocab_size {d.vocab_size}: the token store {store_path} was written with a "
                          f"vocabulary of {tokenizer.vocab_size} pieces; set data.vocab_size = {tokenizer.vocab_size}")
    if d.task == "parse":  # the store holds ids alone: the validation trees show the brackets it should have
        check_tree_symbols(tokenizer, valid_tgt, [t for _, t in valid_pairs], log, "validation")
    log(f"train: token store {store_path}, {len(store)} pairs (skipped {store.stats['skipped_empty']} with an "
        f"empty side, {store.stats['skipped_long']} longer than {store.stats['max_len']} pieces)")
    longest = int(max(store.src_lengths.max(), store.tgt_lengths.max())) if len(store) else 0
    if longest > d.max_len:  # text is cut at data.max_len as it is read; a store was cut when it was written
        raise DataError(f"{store_path}: the token store holds pairs of up to {longest} pieces (written with "
                        f"data.max_len {store.stats['max_len']}), longer than this run's data.max_len {d.max_len}: "
                        f"write it again with --set data.max_len={d.max_len}, or train with data.max_len "
                        f"{store.stats['max_len']}")
    return tokenizer, store


def prepare_run(cfg: Config, out: Path, resume: bool, log, write: bool = True,
                allow_changes: bool = False, vocabulary_of: Path | None = None,
                held: contextlib.ExitStack | None = None, init_from: Path | None = None) -> Run:
    """Creates or re-opens the run folder, trains or loads the BPE vocabulary, reads the data.

    ``write=False`` (data-parallel ranks other than 0) only reads what rank 0 wrote. Resuming with
    a config that changes the model, the data or the optimisation is refused with the list of
    fields, unless ``allow_changes`` (then the list is logged; model changes only where every weight
    keeps its name and shape, e.g. dropout, since the checkpoint's weights are loaded as they are). ``vocabulary_of``: a run folder whose
    spm.model this run takes unchanged (fine-tuning) instead of training its own. ``held``: where the run
    folder's lock is kept (``files.hold_folder``), taken as the folder is made, so that one training at a time
    writes it.
    """
    d, data = cfg.data, data_paths(cfg)  # before the run folder is made or its config written
    # read now, not after the vocabulary's training: a validation file of another length was found minutes later;
    # and a new run's training text before its folder is made: refused (its lines, a byte, a gzip cut short), it
    # left a folder of config.toml alone, no log saying why (a resume's, after the checks that may refuse it)
    valid_pairs = read_parallel(data["valid_src"], data["valid_tgt"])
    new = not any((out / name).exists() for name in RUN_MARKS)
    pairs = read_parallel(data["train_src"], data["train_tgt"]) if new and not d.train_store else None
    if out.is_dir() and not any((out / name).exists() for name in RUN_MARKS) and (others := sorted(out.iterdir())):
        # `--out data` or a folder of the user's own config.toml: it was written over without a word
        listed = ", ".join(p.name for p in others[:3]) + (", ..." if len(others) > 3 else "")
        raise TrainError(f"{out}: a folder of other files ({listed}), not a run folder: a run writes config.toml, "
                         "train.log, spm.model and more there, over files of those names; give a new or empty folder")
    # a new run's store, opened before its folder is made (a fine-tune's with its parent's vocabulary): refused,
    # it left a folder of config.toml and .lock
    store_said: list[str] = []
    opened = (open_store(d, data["train_store"], None if vocabulary_of is None else vocabulary_of / "spm.model",
                         valid_pairs, data["valid_tgt"], store_said.append) if new and d.train_store else None)
    if new and pairs is not None and vocabulary_of is not None and d.task == "parse":
        # a fine-tune's inherited vocabulary without the trees' symbols, refused before its folder is made: refused
        # after it, the folder held the parent's vocabulary, and a run there was told to give --init-from again
        check_tree_symbols(Tokenizer(vocabulary_of / "spm.model"), data["train_tgt"], [t for _, t in pairs],
                           lambda _: None)  # a warning of symbols missing: logged once the run's log is open
    if held is not None:
        held.enter_context(files.hold_folder(out, "--out"))
    out.mkdir(parents=True, exist_ok=True)
    config_path = out / "config.toml"
    # list_checkpoints refuses a "checkpoints" that is no folder (a link to a disk not mounted), taken for none
    has_checkpoints = bool(list_checkpoints(out)) or any((out / "checkpoints").glob("*.json"))
    if has_checkpoints and not resume:
        raise TrainError(f"{out} already holds checkpoints: pass --resume to continue, or choose another --out")
    if has_checkpoints:  # before the newest record's config is compared: another run's differs in its model
        one_run(list_checkpoints(out))
    # what a run started here would delete (tensor files without their record: debris at its first save) or replace
    # (train.keep_best's best model), and no checkpoint to resume: an earlier run's, copied in or kept when its
    # checkpoints were removed, or this run's own from a first save killed midway. A new run is refused; a resume
    # (a job's relaunch) moves them aside once nothing refuses it, kept, and says so
    leftovers = [] if has_checkpoints else [*unrecorded(out / "checkpoints"), *(
        p for p in (out / "best.safetensors", out / "best.json") if p.exists())]
    if leftovers and not resume:
        names = ", ".join(str(p.relative_to(out)) for p in leftovers[:3]) + (
            f" and {len(leftovers) - 3} more" if len(leftovers) > 3 else "")
        raise TrainError(f"{out}: {names}: an earlier training's (tensor files without their record, a best model), "
                         "and no checkpoint to resume: a run started here would delete or replace them; move them "
                         "away, give another --out, or pass --resume to set them aside and train")
    if vocabulary_of is None and not has_checkpoints and (parent := recorded_init_from(out)) is not None:
        # a fine-tune stopped before its first checkpoint: its vocabulary is not a new run's (nor its config.toml)
        raise TrainError(f"{out / 'spm.model'} is the vocabulary of {parent}, taken by --init-from, and this run holds "
                         f"no checkpoint yet: give --init-from {parent} again (or --resume) to fine-tune, or another "
                         "--out to train a run of its own")
    if resume and (found := _saved_config(out, config_path)) is not None:
        saved, source = found
        recorded = checkpoint_record(source) if has_checkpoints and source.suffix == ".json" else {}

        def spelt_otherwise(change: str) -> bool:  # a data file named as the record's, with its content: `train.en`
            key = change.partition(":")[0].removeprefix("data.")  # from one folder, `/runs/x/train.en` from another
            hashes = recorded.get("valid_sha256" if key.startswith("valid_") else "text_sha256")
            if not isinstance(hashes, dict) or key not in hashes or key not in data:
                return False
            return files.file_sha256(data[key] / "meta.json" if key == "train_store" else data[key]) == hashes[key]

        changed = [c for c in cfg.resume_differences(saved) if not spelt_otherwise(c)]
        vocabulary_file = out / "spm.model"
        if has_checkpoints and vocabulary_file.is_file() and (
                recorded_init_from(out) is not None or Tokenizer(vocabulary_file).vocab_size != saved.data.vocab_size):
            # the run's vocabulary was never data.vocab_size's (a fine-tune's, its parent's; or one found in the
            # folder): that value applies neither then nor now (its true size was refused as a change)
            changed = [c for c in changed if not c.startswith("data.vocab_size:")]
        if changed:
            vocabulary = [c for c in changed if c.startswith(("data.vocab_size:", "data.spm_input_sentences:"))]
            if vocabulary and has_checkpoints:  # recorded in config.toml, they would describe a vocabulary it has not
                raise TrainError(f"--resume cannot change how the vocabulary is made, {'; '.join(vocabulary)}: the "
                                 f"run keeps {out / 'spm.model'}, which its checkpoints were trained with (even with "
                                 "--allow-config-change); train a new vocabulary as a new run, with another --out")
            if (drawn := next((c for c in changed if c.startswith("train.init_qkv_gain:")), None)) and has_checkpoints:
                raise TrainError(f"--resume cannot change {drawn}: it sets how a new model's first weights are drawn, "
                                 "and the run's were drawn when it started (even with --allow-config-change, the run's "
                                 "record would claim what it never had): leave it as it was, or train a new run with "
                                 "another --out")
            model = [c for c in changed if c.startswith("model.")]
            if model and weight_shapes(saved.model, saved.data.vocab_size) != weight_shapes(cfg.model, saved.data.vocab_size):
                model = misfits(saved.model, cfg.model, saved.data.vocab_size, model)
                others = [c for c in changed if c not in model]  # said too: not one refusal at a time
                raise TrainError(f"--resume cannot take model changes that change the weights' shapes, "
                                 f"{'; '.join(model)}: the checkpoint's weights would not fit them (even with "
                                 "--allow-config-change, or --init-from); train this model as a new run, with "
                                 "another --out" + (f" (the config differs also in: {'; '.join(others)})"
                                                    if others else ""))
            if not allow_changes:
                raise TrainError(f"--resume with a config that differs from {source} in: {'; '.join(changed)} "
                                 "(pass --allow-config-change to resume anyway)")
            log(f"resuming with changed config (--allow-config-change): {'; '.join(changed)}")
        # what a resume changes, said: not of a folder without checkpoints, whose run starts from scratch (a
        # "resuming with another budget" came before "starting from scratch")
        if has_checkpoints:
            valid = [c for c in cfg.differences(saved, "data", ("valid_src", "valid_tgt")) if not spelt_otherwise(c)]
            if valid:
                # may change: said, as it splits the curve
                log(f"resuming with another validation set: {'; '.join(valid)}; validation figures from here on are "
                    "of it, those logged before of the earlier one" + (
                        " (train.keep_best's best so far, too, which later ones are compared with)"
                        if cfg.train.keep_best else ""))
            if budget := cfg.differences(saved, "train", ("max_steps", "max_minutes")):  # a budget is not part of
                cooldown = cfg.train.cooldown_fraction  # what a run is: running it for longer (or less) needs no flag
                log(f"resuming with another budget: {'; '.join(budget)}" + (
                    f"; the cooldown (train.cooldown_fraction {cooldown:g}) is the new budget's last part, so a run "
                    "already cooled down goes back to eq. (3)'s rate until then" if cooldown else ""))
            if clock := cfg.differences(saved, "train", ("save_every", "save_minutes")):  # allowed, and said
                log(f"resuming with another save clock: {'; '.join(clock)}; until decode.average_last checkpoints of "
                    "it are written, the average of the last ones spans both clocks, unevenly spaced")
            if numerics := cfg.differences(saved, "train", ("precision", "threads", "compile")):  # a run moved, say
                log(f"resuming with other numerics: {'; '.join(numerics)}; the same batches, other rounding: the "
                    "weights will not be bit for bit those of a run never stopped")
            said = {c.partition(":")[0] for c in [*changed, *valid, *budget, *clock, *numerics]}
            # the rest a resume may change (logging, evaluation, interval_unit, decode.*): said, not taken silently
            if rest := [c for section in ("train", "decode") for c in cfg.differences(saved, section)
                        if c.partition(":")[0] not in said]:
                log(f"resuming with other settings: {'; '.join(rest)}")
    if write and leftovers:  # a resume's (a new run's were refused), once its config is taken
        aside = Path(tempfile.mkdtemp(dir=out, prefix=f"set_aside_{time.strftime('%Y%m%d_%H%M%S')}_"))
        for path in leftovers:  # a move: checkpoints/ may be a link to another disk
            shutil.move(path, aside / path.name)
        log(f"{aside}: {', '.join(p.name for p in leftovers)} moved here, kept: the run holds no checkpoint to "
            "resume, and training would have deleted or replaced them")
    if write and not (resume and has_checkpoints):  # a resume's, once nothing refuses it (Trainer.__init__)
        files.write_text(config_path, dump_toml(cfg))

    spm_path = out / "spm.model"
    if vocabulary_of is not None:
        inherit_vocabulary(vocabulary_of / "spm.model", spm_path, write, init_from or vocabulary_of)
    if d.train_store:  # encoded once by `transformer preprocess`, with its own vocabulary
        store_path = data["train_store"]
        # the run's vocabulary is its checkpoints' or its parent's; else the store's, which replaces one left by
        # an attempt that wrote no checkpoint, and is copied in once the store has passed its checks
        settled = spm_path.exists() and (has_checkpoints or vocabulary_of is not None)
        if opened is None:
            tokenizer, store = open_store(d, store_path, spm_path if settled else None, valid_pairs, data["valid_tgt"],
                                          log)
        else:  # opened before the run's folder was made: what it said goes to the run's log now
            tokenizer, store = opened
            tokenizer = Tokenizer(spm_path) if settled else tokenizer  # a fine-tune's copy, as a resume reads it
            for line in store_said:
                log(line)
        if write and not settled and not (spm_path.exists() and files.file_sha256(spm_path) == tokenizer.sha256):
            if spm_path.exists():
                log(f"{spm_path}: left by an earlier attempt, and no checkpoint was trained with it: the token store's "
                    "vocabulary in its place")
            # its record first, naming the store: a later run of text in this folder trains a vocabulary of its own
            files.write_text(spm_path.with_suffix(".json"), json.dumps({"train_store": str(store_path)}, indent=2)
                             + "\n")
            files.write_bytes(spm_path, (store_path / "spm.model").read_bytes())
        train, src_lengths, tgt_lengths = store, store.src_lengths, store.tgt_lengths
    else:
        train_src, train_tgt = data["train_src"], data["train_tgt"]
        if pairs is None:  # checked (line counts, UTF-8) before a BPE is trained on them
            pairs = read_parallel(train_src, train_tgt)
        tokenizer = open_vocabulary(cfg, train_src, train_tgt, spm_path, log,
                                    resuming=has_checkpoints or vocabulary_of is not None, write=write)
        if d.task == "parse":
            check_tree_symbols(tokenizer, train_tgt, [t for _, t in pairs], log)
        if len(pairs) >= LARGE_TEXT:
            log(f"train: encoding {len(pairs):,} pairs (a token store, `transformer preprocess`, is read without "
                "this step, and shared by data-parallel processes)")
        train, stats = encode_pairs(pairs, tokenizer, d.max_len)
        del pairs
        log(f"train: {len(train)} pairs used of {stats.n_pairs}; skipped {stats.skipped_empty} with an empty "
            f"side, {stats.skipped_long} longer than {d.max_len} pieces with EOS ({pair_named(train_src, train_tgt)})")
        if not train:  # as the token store says it (store.write_store)
            raise DataError(f"{train_src}: no usable training pairs of {stats.n_pairs:,} ({stats.skipped_empty:,} with "
                            f"an empty side, {stats.skipped_long:,} longer than data.max_len {d.max_len} pieces with "
                            "EOS)")
        if warning := stats.unknown_warning("train", str(tokenizer.path)):
            log(warning)
        if stats.skipped_long > len(train):
            log(f"warning: most training pairs ({stats.skipped_long} of {stats.n_pairs}) are longer than data.max_len "
                f"({d.max_len} pieces with EOS) and are left out; raise data.max_len to train on them")
        src_lengths, tgt_lengths = lengths(train)
    if tokenizer.vocab_size != d.vocab_size:  # a token store's or an inherited vocabulary decides the model's
        log(f"vocabulary: {tokenizer.vocab_size} pieces ({tokenizer.path}); data.vocab_size {d.vocab_size} does "
            "not apply")
    # DEVIATION(§5.1, A10): the authors' evaluation dropped no pair by length; here the training pairs' bound
    # holds for validation too: one stray long line would take memory and time with the
    # square of its length at every validation, and a learned position table (row E) has no rows beyond it
    kept: list[int] = []
    valid, stats = encode_pairs(valid_pairs, tokenizer, d.max_len, kept)
    log(f"valid: {len(valid)} pairs used of {stats.n_pairs}; skipped {stats.skipped_empty} with an empty side, "
        f"{stats.skipped_long} longer than {d.max_len} pieces with EOS "
        f"({pair_named(data['valid_src'], data['valid_tgt'])})")  # which copy: a mistyped data folder falls through
    # a misnamed file (.jp for ja) or swapped sides: BLEU tokenized, and a card written, for another language
    langs = {side: primary_language(getattr(d, f"{side}_lang")) for side in ("src", "tgt")}
    codes = {side: language_code(getattr(d, f"train_{side}")) for side in ("src", "tgt")}
    if d.task == "translate" and not d.train_store and codes["src"] == langs["tgt"] and codes["tgt"] == langs["src"]:
        log(f"note: data.train_src ends in '{codes['src']}' and data.train_tgt in '{codes['tgt']}', where "
            f"data.src_lang is '{langs['src']}' and data.tgt_lang '{langs['tgt']}': the sides look swapped")
    elif d.task == "translate" and not d.train_store:  # a token store's files are not read here
        for side in ("src", "tgt"):
            if codes[side] and codes[side] != langs[side]:
                log(f"note: data.train_{side} {Path(getattr(d, f'train_{side}')).name} ends in '{codes[side]}', and "
                    f"data.{side}_lang is '{langs[side]}': the file's name is taken as its language (by the BLEU "
                    f"tokenizers of training and evaluate; an export's card takes data.{side}_lang); rename the file, "
                    f"or correct data.{side}_lang")
    if (env := os.environ.get("TRANSFORMER_DATA")) and not Path(env).expanduser().is_dir():
        log(f"note: TRANSFORMER_DATA {env} is no folder (the files above were found without it)")
    if warning := stats.unknown_warning("valid", str(tokenizer.path)):
        log(warning)
    if not valid:
        raise DataError(f"{data['valid_src']}: no usable validation pairs of {stats.n_pairs} ({stats.skipped_empty} "
                        f"with an empty side, {stats.skipped_long} longer than data.max_len {d.max_len} pieces with "
                        "EOS); validation "
                        "loss, patience and the best checkpoint need some")
    buckets = shape_buckets(cfg.train)
    batches = make_batches_from_lengths(src_lengths, tgt_lengths, cfg.train.max_tokens, buckets)
    shapes = f" in {len(buckets.shapes(src_lengths, tgt_lengths, batches))} shapes" if buckets else ""
    alone = int((np.maximum(src_lengths, tgt_lengths) > cfg.train.max_tokens).sum())
    log(f"{len(batches)} batches of <= {cfg.train.max_tokens} tokens per side{shapes}"
        + (f" ({alone} pairs longer than that, each a batch of its own)" if alone else "")
        + f"; padding {100 * padding_fraction(src_lengths, tgt_lengths, batches, buckets):.1f}% of positions")
    sampled = None
    if d.subword_alpha:
        log(f"subword regularization: every epoch segments the training text anew (BPE-dropout, alpha "
            f"{d.subword_alpha}) and is batched again; the batches above are those of the deterministic segmentation")
        sampled = SampledEpochs(train_src, train_tgt, tokenizer.path, d.subword_alpha, cfg.train.seed, d.max_len,
                                cfg.train.max_tokens, buckets)
    # what the run trains on, for a resume to compare: the text's bytes, or a token store's record (its counts and
    # sources: another corpus encoded into the same folder was resumed on without a word; its ids are not read)
    text = ({"train_store": files.file_sha256(data["train_store"] / "meta.json")} if d.train_store else
            {name: files.file_sha256(data[name]) for name in ("train_src", "train_tgt")})
    valid_sha256 = {name: files.file_sha256(data[name]) for name in ("valid_src", "valid_tgt")}
    return Run(cfg, out, tokenizer, train, valid, [valid_pairs[i] for i in kept], batches, sampled, text,
               valid_sha256)


def parent_run(init_from: Path) -> Path:
    """The run folder ``--init-from`` names: itself, the run a weights file lies in (beside its spm.model, or
    in its checkpoints/), or, for a file `transformer average` wrote elsewhere, the run it was averaged from."""
    if init_from.is_dir():
        run = init_from
        if not (run / "spm.model").is_file():  # a folder names no run but itself
            inside = " (give the run folder, or one checkpoint file)" if run.name == "checkpoints" else ""
            raise TrainError(f"--init-from {init_from}: not a run folder (no spm.model){inside}")
    elif init_from.is_file():
        if init_from.suffix.lower() not in (".safetensors", ".json"):  # a pickle (.pt, .bin) is not opened at all
            why = ("pickle files are refused unopened (.pt, .bin)" if init_from.suffix.lower() in PICKLE_SUFFIXES else
                   f"give its run folder, {init_from.parent}" if init_from.name == "spm.model" else "")
            raise TrainError(f"--init-from {init_from}: not a run folder or a weights file of this package "
                             f"(.safetensors, or its .json record){why and ': '}{why}")
        run = init_from.parent.parent if files.kept_by_training(init_from.parent) else init_from.parent
        if (not (run / "spm.model").is_file() and init_from.suffix.lower() in (".safetensors", ".json")
                and (named := checkpoint_record(init_from).get("run"))):
            run = Path(named)
    else:
        raise TrainError(f"--init-from {init_from}: no such run folder or weights file")
    if not (run / "spm.model").is_file():
        beside = init_from.parent.parent if files.kept_by_training(init_from.parent) else init_from.parent
        named = (f"the run it names, {run}, is no run folder now (no spm.model: moved or removed?)" if run != beside
                 else f"{run} is not a run folder (no spm.model), and the file names no run whose vocabulary it was "
                      "trained with")
        raise TrainError(f"--init-from {init_from}: {named}: put it in its run folder, beside spm.model")
    return run


def refuse_misfit(init_from: Path, parent: Path, cfg: Config) -> None:
    """Refuses ``--init-from`` weights whose shapes this config's model does not have, or trained with another
    vocabulary than the spm.model beside them, or a run folder with no checkpoint, from the records alone:
    before the new run folder, its config or vocabulary are written (the weights themselves are checked as
    they are loaded, ``Trainer.start_from``)."""
    if init_from.is_dir():
        if not (paths := list_checkpoints(parent)):
            raise TrainError(f"--init-from {init_from}: no checkpoints in {parent / 'checkpoints'}")
        record = checkpoint_record(paths[-1])
    elif init_from.suffix.lower() in (".safetensors", ".json"):  # anything else is refused as it is loaded
        record = checkpoint_record(init_from)
    else:
        return
    # before the run folder takes the parent's spm.model: refused after it, a corrected retry into the same --out
    # was refused too, its spm.model "differs"
    vocabulary = parent / "spm.model"
    if record.get("vocab_sha256") not in (None, files.file_sha256(vocabulary)):
        raise TrainError(f"--init-from {init_from}: its weights were trained with another vocabulary than {vocabulary}")
    vocab = record.get("vocab_size")
    theirs = config_from_dict(record.get("config"), f"{init_from} (config)")
    if isinstance(vocab, int) and weight_shapes(theirs.model, vocab) != weight_shapes(cfg.model, vocab):
        raise TrainError(f"--init-from {init_from}: its model does not fit this config "
                         f"({'; '.join(misfits(theirs.model, cfg.model, vocab, cfg.differences(theirs, 'model')))})")


Inherited = tuple[dict[str, Any], dict[str, torch.Tensor], list[Path]]  # a record, its weights, their files


def parent_weights(init_from: Path, parent: Path) -> Inherited:
    """The weights ``init_from`` names, read and their sha256 checked: a run folder's average of its last
    decode.average_last checkpoints (of a run still training too), or one weights file."""
    if init_from.is_dir():
        paths = list_checkpoints(parent)  # some: refuse_misfit
        meta = load_checkpoint(paths[-1], with_state=False).meta
        last = config_from_dict(meta["config"], f"{paths[-1]} (config)").decode.average_last
        chosen, weights = average_last(parent, last)
        return meta, weights, chosen
    ckpt = load_checkpoint(init_from, with_state=False)
    # the weights file its record names: given the optimizer state's (step_N.state), its step's weights
    return ckpt.meta, ckpt.weights, [ckpt.path.parent / ckpt.meta["files"]["weights"]["name"]]


def inherit_vocabulary(parent: Path, path: Path, write: bool, init_from: Path) -> None:
    """``path`` becomes a byte copy of the parent run's vocabulary; one already there must be that. Its record
    (spm.json, written first) names ``init_from``: a fine-tune stopped before its first checkpoint resumes from
    those weights again (``inherited_from``), and a new run in the folder does not take the vocabulary for its
    own (``prepare_run`` refuses it)."""
    if path.exists() and files.file_sha256(path) != files.file_sha256(parent):
        raise TrainError(f"{path} differs from {parent}, the vocabulary --init-from names: choose another --out")
    if write:
        files.write_text(path.with_suffix(".json"), json.dumps({INIT_FROM: str(init_from.resolve())}, indent=2) + "\n")
        if not path.exists():
            files.write_bytes(path, parent.read_bytes())


# the key of a vocabulary record (spm.json) that names the weights a fine-tune took the vocabulary with
INIT_FROM = "init_from"


def recorded_init_from(out: Path) -> Path | None:
    """The weights a fine-tune in ``out`` was started from, as its vocabulary's record names them
    (``inherit_vocabulary``); None for a run with a vocabulary of its own."""
    try:
        record = json.loads((out / "spm.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return Path(record[INIT_FROM]) if isinstance(record, dict) and isinstance(record.get(INIT_FROM), str) else None


def inherited_from(out: Path) -> Path | None:
    """``recorded_init_from``, for a resume: a TrainError where those weights are gone."""
    init_from = recorded_init_from(out)
    if init_from is not None and not init_from.exists():
        raise TrainError(f"--resume: {out} is a fine-tune started with --init-from {init_from}, which is gone, and "
                         "holds no checkpoint yet: give --init-from the weights to start from, or another --out")
    return init_from


def batch_loss(model: torch.nn.Module, batch: Batch, eps_ls: float) -> torch.Tensor:
    """Label-smoothed loss summed over the batch's non-pad target tokens (ε_ls = 0: the NLL)."""
    return batch_losses(model, batch, (eps_ls,))[0]


def batch_losses(model: torch.nn.Module, batch: Batch, eps_ls: tuple[float, ...]) -> tuple[torch.Tensor, ...]:
    """``batch_loss`` at each of several ε_ls, from one forward pass.

    Goes through ``model(...)`` so that a DistributedDataParallel wrapper sees the forward pass.
    """
    # the target positions are selected after the model: a compiled graph then takes the batch's shape alone,
    # not also its count of target tokens (CUDA graphs replay one shape: train.shape_buckets)
    hidden = model(batch.src, batch.tgt_in, logits=False).flatten(0, 1).index_select(0, batch.positions)
    inner = getattr(model, "_orig_mod", model)  # through torch.compile's and DDP's wrappers
    weight = (inner.module if isinstance(inner, DistributedDataParallel) else inner).output_weight
    target = batch.tgt_out.flatten().index_select(0, batch.positions)
    return tuple(label_smoothed_loss(hidden, weight, target, eps) for eps in eps_ls)


def resolved_precision(precision: str, device: torch.device) -> str:
    """train.precision with "auto" resolved for ``device``: bf16 where it is native, else fp32."""
    if precision != "auto":
        return precision
    return "bf16" if native_bf16(device) else "fp32"


def compiled(model: torch.nn.Module, raw: Transformer, device: torch.device,
             mode: str | None = None) -> torch.nn.Module:
    """``model`` (``raw`` itself, or a DDP wrapper of it) through torch.compile for training (train.compile).

    The sinusoid table is made before tracing, not by the first compiled call, whose guard it would break
    (a second compilation); batch shapes vary, so the graph is shape-generic from the start. ``mode``:
    torch.compile's (``"reduce-overhead"``: CUDA graphs, one per batch shape met; benchmarks/gpu.py)."""
    raw.positions(1, 0, "src_pos", device)
    return torch.compile(model, dynamic=True, mode=mode)


def new_window(t0: float | None = None) -> dict[str, Any]:
    """What the next log line averages: the loss and tokens of its steps, their gradient norms, its start
    (``t0``, default now) and the time its last step was done (``t1``)."""
    start = time.monotonic() if t0 is None else t0
    return {"loss": 0.0, "tokens": 0, "norms": [], "t0": start, "t1": start}


def saved_window(window: dict[str, Any]) -> dict[str, Any]:
    """The steps of the next log line so far, as a checkpoint's record keeps them (its seconds: their time)."""
    return {"loss": window["loss"], "tokens": window["tokens"], "norms": list(window["norms"]),
            "seconds": window["t1"] - window["t0"]}


def resumed_window(record: Any) -> dict[str, Any]:
    """``new_window`` holding the steps a checkpoint's ``saved_window`` kept, as if they had just been
    trained: a run resumed between two log lines logs the next one over all its steps, as an uninterrupted
    run does. A record without one (a checkpoint of an earlier version) or of another shape: an empty window."""
    window = new_window()
    number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)  # noqa: E731
    if not (isinstance(record, dict) and all(number(record.get(k)) for k in ("loss", "tokens", "seconds"))
            and isinstance(record.get("norms"), list) and all(map(number, record["norms"]))):
        return window
    window.update(loss=float(record["loss"]), tokens=int(record["tokens"]), norms=[float(x) for x in record["norms"]])
    window["t0"] -= max(float(record["seconds"]), 0.0)
    return window


@dataclass
class StepResult:
    loss: float  # label-smoothed loss summed over the step's tokens, all ranks
    n_tokens: int  # non-pad target tokens of the step, all ranks
    applied: bool  # False: the gradients were not finite and the step was skipped
    grad_norm: float  # the gradients' global L2 norm before clipping (train.clip_norm), as fairseq logs it


@dataclass
class QueuedStep:
    """A step whose work is queued on the device and whose outcome is not read yet (``queue_step``)."""

    outcome: torch.Tensor  # [loss sum, 1.0 if applied, gradient norm], on the device
    n_tokens: int

    def result(self) -> StepResult:
        """The step's outcome: its one host synchronisation (it waits for the device to finish the step)."""
        loss_sum, applied, grad_norm = self.outcome.tolist()
        return StepResult(loss_sum, self.n_tokens, applied == 1.0, grad_norm)


@dataclass
class InFlight:
    """A step the trainer queued and has not booked yet (``Trainer.run`` queues the next one first)."""

    queued: QueuedStep
    lr: float
    # epochs drawn through its batches (``epochs_into``), for its log line: by then the host has drawn the next step's
    epoch: float
    # when its work was done, where queueing it did it (a CPU computes as it queues); None: when it is read
    done_at: float | None = None


@dataclass
class AfterStep:
    """What booking an applied step does besides counting it, decided before another step is queued."""

    intervals: int  # Trainer.intervals_done() once the step is applied
    logged: bool  # a log line
    evaluates: bool  # ... that validates or translates (rank 0; the others wait for it)
    save: bool  # a checkpoint
    check: bool  # the ranks' parameter checksums compared (data parallel)

    @property
    def reads_weights(self) -> bool:
        """Whether it reads the weights as the step leaves them: then nothing may be queued before it."""
        return self.evaluates or self.save or self.check


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: list[Batch], eps_ls: float,
               lr: float, clip_norm: float = 0.0, dist: Dist | None = None,
               scaler: torch.amp.GradScaler | None = None, amp_dtype: torch.dtype | None = None) -> StepResult:
    """One optimizer step over accumulated batches (and, data parallel, over all ranks' batches).

    The loss is normalised by the non-pad target tokens of the whole step, all ranks together (A3):
    accumulating batches, or splitting them over ranks that hold different numbers of tokens,
    gives the same update as one batch holding them all. DDP averages gradients over ranks, so
    each rank scales its sum by world / tokens. A step whose gradients are not finite (inf/NaN:
    fp16 overflow, a bad batch) changes nothing: no parameter, optimizer moment or step count.
    """
    return queue_step(model, optimizer, batches, eps_ls, lr, clip_norm, dist, scaler, amp_dtype).result()


def queue_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: list[Batch], eps_ls: float,
               lr: float, clip_norm: float = 0.0, dist: Dist | None = None,
               scaler: torch.amp.GradScaler | None = None, amp_dtype: torch.dtype | None = None) -> QueuedStep:
    """``train_step`` without waiting for its outcome: on a GPU, with fused Adam, the host can collate and
    queue the next step while the device still runs this one, and read this one's ``result()`` after."""
    dist = dist or Dist()
    n_tokens = int(distributed.all_sum(dist, [float(sum(b.n_tgt_tokens for b in batches))])[0])
    for group in optimizer.param_groups:
        group["lr"] = lr
    total = torch.zeros((), device=dist.device)
    for i, batch in enumerate(batches):
        # data parallel: gradients are all-reduced once, after the last accumulated batch
        no_sync = isinstance(model, DistributedDataParallel) and i < len(batches) - 1
        with model.no_sync() if no_sync else contextlib.nullcontext():
            with torch.autocast(dist.device.type, dtype=amp_dtype) if amp_dtype else contextlib.nullcontext():
                loss = batch_loss(model, batch.to(dist.device), eps_ls)
            scaled = loss * (dist.world / n_tokens)
            (scaler.scale(scaled) if scaler else scaled).backward()
        total += loss.detach()  # summed where it is: no wait for the device per batch
    if dist.enabled:  # the step's loss over all ranks' tokens, as its token count (on the device: no wait)
        torch.distributed.all_reduce(total)
    if scaler:
        scaler.unscale_(optimizer)
    # the norm of the (all-reduced) gradients is the same on every rank, so all ranks skip together
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    finite = torch.isfinite(norm)
    if optimizer.defaults.get("fused"):
        # fused Adam skips the update on the device when found_inf is 1 (parameters, moments and step
        # count untouched), so the update is queued before anything waits for the device; it divides each
        # gradient by grad_scale as it reads it: clipping takes no pass over the gradients of its own
        optimizer.found_inf = (~finite).float()
        if clip_norm:  # clip_grad_norm_'s factor min(1, clip_norm / (norm + 1e-6)), as a divisor
            optimizer.grad_scale = ((norm + 1e-6) / clip_norm).clamp(min=1.0)
        optimizer.step()
        optimizer.found_inf = optimizer.grad_scale = None
    elif finite:  # the one wait for the device that a step without fused Adam makes before its end
        if clip_norm:
            torch.nn.utils.clip_grads_with_norm_(params, clip_norm, norm)
        optimizer.step()
    if scaler:
        scaler.update()  # after an overflow: a smaller scale next step
    optimizer.zero_grad(set_to_none=True)
    return QueuedStep(torch.stack([total.float(), finite.float(), norm.float()]), n_tokens)


@torch.inference_mode()
def validate(model: Transformer, examples: list[Example], max_tokens: int,
             eps_ls: float | None = None) -> dict[str, float]:
    """Per-token NLL and perplexity without smoothing (Table 3's PPL is per word-piece; A3); with
    ``eps_ls``, also the per-token label-smoothed loss (§5.4) that training minimises."""
    model.eval()
    nll_sum, smoothed_sum, n = 0.0, 0.0, 0
    device = next(model.parameters()).device
    for indices in make_batches(examples, max_tokens):
        batch = collate(examples, indices).to(device)
        nll, *smoothed = batch_losses(model, batch, (0.0,) if eps_ls is None else (0.0, eps_ls))
        nll_sum += nll.item()
        smoothed_sum += sum(x.item() for x in smoothed)  # nothing without eps_ls
        n += batch.n_tgt_tokens
    model.train()
    nll = nll_sum / max(n, 1)
    scores = {"valid_nll": nll, "valid_ppl": math.exp(min(nll, 50.0))}
    if eps_ls is not None:
        scores["valid_smoothed_loss"] = smoothed_sum / max(n, 1)
    return scores


def dev_bleu(model: Transformer, tokenizer: Tokenizer, pairs: list[tuple[str, str]], cfg: Config) -> float:
    """sacreBLEU of the model's beam-search translations (the run's decode settings, §6.1) of ``pairs``:
    the request `translate` makes by default, answered as a loaded run would answer it."""
    from .evaluate import sacrebleu_scores
    from .request import DecodeRequest
    from .translator import Translator

    hyps = Translator.of_model(model, tokenizer, cfg).translate([s for s, _ in pairs], DecodeRequest())  # in eval mode
    return sacrebleu_scores(hyps, [t for _, t in pairs], cfg.data.language("tgt"))["bleu"]


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    """Adam's state as flat tensors (for safetensors) and its JSON-able param groups."""
    sd = optimizer.state_dict()
    tensors = {f"optim.{i}.{k}": torch.as_tensor(v) for i, s in sd["state"].items() for k, v in s.items()}
    return tensors, sd["param_groups"]


def load_optimizer_tensors(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor],
                           groups: list[dict[str, Any]], where: Path, step: int) -> None:
    """Adam's state as ``optimizer_tensors`` wrote it (none at ``step`` 0), refused (CheckpointError)
    unless every parameter has its step and its two moments, of the parameter's shape, finite: load_state_dict
    takes any, and moments a row short ended the process in a segmentation fault at the next step, keys missing
    in a KeyError."""
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        if name.startswith("optim."):
            _, i, k = name.split(".", 2)
            state.setdefault(int(i) if i.isdigit() else -1, {})[k] = value
    # none at all: a checkpoint of step 0 (stopped before its first update)
    params = [p for group in optimizer.param_groups for p in group["params"]] if state or step else []
    for i, param in enumerate(params):
        own = state.get(i, {})
        if sorted(own) != ["exp_avg", "exp_avg_sq", "step"]:
            raise CheckpointError(f"{where}: Adam's state of parameter {i} holds {sorted(own)}, not step, exp_avg and "
                                  "exp_avg_sq")
        if bad := next((k for k in ("exp_avg", "exp_avg_sq") if own[k].shape != param.shape
                        or not own[k].is_floating_point() or not bool(torch.isfinite(own[k]).all())), None):
            raise CheckpointError(f"{where}: Adam's {bad} of parameter {i} is not a finite float tensor of its "
                                  f"shape {tuple(param.shape)} ({own[bad].dtype}, {tuple(own[bad].shape)})")
    if state and len(state) != len(params):
        raise CheckpointError(f"{where}: Adam's state of {len(state)} parameters, the model has {len(params)}")
    try:
        optimizer.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, KeyError, TypeError) as e:  # param_groups of another layout
        raise CheckpointError(f"{where}: Adam's parameter groups do not fit the model ({e})") from None


def rng_state(dist: Dist) -> dict[str, torch.Tensor]:
    """This rank's random state: the CPU generator, and the GPU's (dropout masks on a GPU come from it)."""
    states = {"rng.torch": torch.get_rng_state()}
    if dist.device.type == "cuda":
        states["rng.cuda"] = torch.cuda.get_rng_state(dist.device)
    return states


def set_rng_state(dist: Dist, state: dict[str, torch.Tensor]) -> None:
    """Restores what ``rng_state`` saved for this rank (rank r > 0: the keys end in ".r"). A run
    resumed on another device type keeps only the CPU state."""
    suffix = f".{dist.rank}" if dist.rank else ""
    if (cpu := state.get("rng.torch" + suffix)) is not None:
        torch.set_rng_state(cpu)
    if dist.device.type == "cuda" and (gpu := state.get("rng.cuda" + suffix)) is not None:
        torch.cuda.set_rng_state(gpu, dist.device)


def train(cfg: Config, out: Path, resume: bool = False, quiet: bool = False,
          allow_config_change: bool = False, init_from: Path | None = None) -> dict[str, Any]:
    """Trains until train.max_steps or train.max_minutes; returns a summary of the run.

    ``init_from`` (fine-tuning; not in the paper): a run folder, or a weights file in one, whose
    vocabulary the new run takes unchanged and whose weights it starts from (a run folder's: the
    average of its last decode.average_last checkpoints, the weights `translate` uses), with a fresh
    optimizer and schedule from ``cfg``.

    Under torchrun, every rank runs this function: rank r takes every world-th batch of one seeded
    order (``BatchOrder``), DDP averages gradients, and rank 0 alone writes the run folder.
    """
    if not isinstance(cfg, Config):  # a preset's name, say: load_config reads one
        raise ConfigError(f"cfg: a Config (load_config(PRESET or FILE)), not {type(cfg).__name__} {cfg!r}")
    check_bools(resume=resume, quiet=quiet, allow_config_change=allow_config_change)
    # a Config edited after load_config (cfg.train.max_steps = -5, a str for an int) is checked as a file's values
    cfg = anchored(config_from_dict(cfg.to_dict(), "cfg").validate())
    out, init_from = as_path(out, "out"), None if init_from is None else as_path(init_from, "init_from")
    files.check_output(out, "out", folder=True)  # a file, or a folder under one: an OSError deep in training
    t = cfg.train
    if t.threads:
        torch.set_num_threads(t.threads)
    # Adam's second moments of rarely seen embedding rows decay into denormal floats, which make
    # CPU arithmetic (sqrt in the update) tens of times slower; flushing them to zero costs nothing.
    torch.set_flush_denormal(True)
    keep_freed_memory()
    dist = distributed.setup(t.dist_timeout_s)
    log = out / "train.log"
    logged = log.stat().st_size if log.is_file() else None
    default_dtype = torch.get_default_dtype()  # a host's float64 (a notebook's) trained the model in float64
    torch.set_default_dtype(torch.float32)  # train.precision says the arithmetic; restored when training ends
    try:
        with contextlib.ExitStack() as held:  # the run folder's lock (rank 0's), released however training ends
            return Trainer(cfg, out, resume, quiet, dist, allow_config_change, init_from, held).run()
    except (Exception, KeyboardInterrupt, Terminated) as e:  # why the run ended, in the log it wrote (nohup: stderr
        # may be gone); the command line says it on the terminal. A refusal before the log's first line leaves it as
        # it was; a stop in the loop logged its own, one before it (the vocabulary's training: minutes) is said here
        if dist.main and not isinstance(e, TrainInterrupted) and log.is_file() and log.stat().st_size != logged:
            said = ("interrupted (SIGINT): stopped at once" if isinstance(e, KeyboardInterrupt) else
                    f"{signal.Signals(e.signum).name}: stopped at once" if isinstance(e, Terminated)
                    else distributed.lost_contact_line(e) or error_line(e))
            with contextlib.suppress(OSError):  # a full disk: said on stderr alone
                files.append_text(log, f"{time.strftime('%Y-%m-%d %H:%M:%S')} {said}\n")
        raise
    finally:
        torch.set_default_dtype(default_dtype)
        distributed.teardown(dist)


def budget_used(step: int, max_steps: int, elapsed_s: float, max_minutes: float) -> int:
    """Thousandths of the training budget used: of the updates, or of the minutes when those run out
    first, whichever is further along (what the progress bar shows)."""
    used = step / max_steps
    if max_minutes:
        used = max(used, elapsed_s / (60 * max_minutes))
    return min(1000, int(1000 * used))


class Board:
    """TensorBoard's event file (tb/): a copy of what metrics.jsonl and train.log hold. A write it cannot make (a
    full disk, tb/ removed to make room, a read-only folder) is said once in the log and ends its writing, not
    the training, whose own files go on; its writer thread's traceback, printed beside the trainer's one line,
    is not (the thread's error comes again at the next write, where it is said)."""

    def __init__(self, folder: Path, purge_step: int | None, log) -> None:
        """``purge_step``: TensorBoard hides the folder's earlier events of this step and later ones."""
        from torch.utils.tensorboard import SummaryWriter  # imported late: it is slow to import

        self.folder, self.log, self.writer = folder, log, None
        before, self.hook = set(threading.enumerate()), threading.excepthook
        try:
            self.writer = SummaryWriter(str(folder), purge_step=purge_step)
        except OSError as e:
            self._stop(e)
        own = set(threading.enumerate()) - before  # its writer's thread: a host's own writers' errors are printed

        def quiet(args: threading.ExceptHookArgs) -> None:
            if not (args.thread in own and issubclass(args.exc_type, OSError)):
                self.hook(args)

        threading.excepthook = quiet  # until close(): the process's hook as it was

    def add(self, values: dict[str, float], step: int) -> None:
        if self.writer is None:  # stopped
            return
        try:
            for key, value in values.items():
                self.writer.add_scalar(key, value, step)
        except OSError as e:
            self._stop(e)

    def close(self) -> None:
        """Closes the event file, once; however training ended (a stop, an error), else its thread lives on."""
        try:
            if self.writer is not None:
                self.writer.close()
                self.writer = None
        except OSError as e:
            self._stop(e)
        finally:
            threading.excepthook = self.hook

    def _stop(self, error: OSError) -> None:
        writer, self.writer = self.writer, None
        where = os.fsdecode(error.filename) if error.filename else self.folder  # its writer names files in bytes
        self.log(f"note: the TensorBoard log stopped: {where}: {error.strerror or error}; "
                 "training goes on, and metrics.jsonl and train.log hold the same values")
        with contextlib.suppress(Exception):  # its file is what failed: closing it fails too
            if writer is not None:
                writer.close()


class Trainer:
    """One rank's training run, in the pieces that make it: set-up (``__init__``), resume, the next
    batch, a step, the log line with validation, a checkpoint, and the loop that calls them (``run``)."""

    def __init__(self, cfg: Config, out: Path, resume: bool, quiet: bool, dist: Dist,
                 allow_config_change: bool, init_from: Path | None = None,
                 held: contextlib.ExitStack | None = None) -> None:
        self.cfg, self.out, self.quiet, self.dist, t = cfg, out, quiet, dist, cfg.train
        own = bool(list_checkpoints(out)) if resume or init_from is not None else False  # the run's checkpoints
        # a fine-tune stopped before its first checkpoint goes on as one: from the weights it was started from
        self.init_again = inherited_from(out) if resume and init_from is None and not own else None
        init_from = self.init_from = init_from or self.init_again
        if allow_config_change and not resume:  # a new run has no earlier config to change
            raise TrainError("--allow-config-change is for a resume (with --resume): a new run takes its config as "
                             "it is")
        if init_from is not None and t.init_qkv_gain != 1.0:  # refused before anything is written
            raise TrainError(f"train.init_qkv_gain = {t.init_qkv_gain:g} sets how a new model's first weights are "
                             f"drawn, and --init-from starts from {init_from}'s instead: give one of them")
        if t.cuda_graphs and dist.enabled:  # refused before anything is written, as above
            raise TrainError("train.cuda_graphs is for one process: with data parallelism the gradients' all-reduce "
                             "would be captured in the graphs, which this trainer does not do")
        if problem := cfg.training_problem():  # as above
            raise TrainError(problem)
        if t.bleu_every and cfg.data.task == "translate":  # dev BLEU's tokenizer can be had (ja, ko: MeCab)
            from .evaluate import bleu_metric
            bleu_metric(cfg.data.language("tgt"))
        parent = None if init_from is None else parent_run(init_from)
        if init_from is not None:  # refused before anything is written, as above
            refuse_misfit(init_from, parent, cfg)
        # read now, their sha256 checked, where the run starts from them (no checkpoint of its own, resumed or not): a
        # damaged parent found after the vocabulary was written left a folder behind
        inherited = None if init_from is None or own else parent_weights(init_from, parent)
        with distributed.rank0_alone(dist):  # the others wait for rank 0's vocabulary and config
            if dist.main:
                self.log = run_logger(out, quiet)
                self.run_data = prepare_run(cfg, out, resume, self.log, allow_changes=allow_config_change,
                                            vocabulary_of=parent, held=held, init_from=init_from)
        if not dist.main:
            self.log = lambda msg, terminal=True: None
            self.run_data = prepare_run(cfg, out, resume, self.log, write=False, allow_changes=True,
                                        vocabulary_of=parent)
        tokenizer = self.run_data.tokenizer
        # every rank must train the same model on the same data, started alike: a rank's files of other content
        # (a node's stale copy) went unseen where the vocabulary is not trained (--init-from, a resume), and a rank
        # alone given --resume ended in DDP's internal error (the ranks' collectives out of step). The files'
        # bytes, as a checkpoint records them: a resume compares those on every rank (a gzip made at another
        # time, a store's meta.json naming other paths passed here and stopped one rank at the next resume)
        identities = distributed.gather(dist, {
            "config": cfg.to_dict(), "vocabulary": tokenizer.sha256, "resume": resume,
            "init_from": None if init_from is None else str(init_from),
            "data": {**(self.run_data.text_sha256 or {}), **(self.run_data.valid_sha256 or {})}})
        if other := next((r for r, x in enumerate(identities) if x != identities[0]), None):
            raise TrainError(f"the ranks disagree on the config, the data or the vocabulary: rank {other} differs from "
                             "rank 0 in "
                             f"{disagreement(identities[0], identities[other])} (each rank must be started with the "
                             "same command, config, data and run folder; the data files byte for byte, as a resume "
                             "compares them: copy one to every machine, not a gzip made again or a store written "
                             "from other paths)")
        torch.manual_seed(t.seed)
        self.raw = Transformer(cfg.model, tokenizer.vocab_size, t.init_qkv_gain).to(dist.device)
        self.optimizer = make_optimizer(self.raw, t)
        self.state = TrainState(world_size=dist.world)
        self.pending_best: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None  # keep_best's, for save()
        self.replaying_to = 0  # the step of a best taken from best.safetensors on --resume (reconcile_best)
        self.precision = resolved_precision(t.precision, dist.device)
        self.scaler = torch.amp.GradScaler(dist.device.type) if self.precision == "fp16" else None  # dynamic loss scale
        self.meta_base = {"config": cfg.to_dict(), "config_sha256": cfg.sha256(), "vocab_sha256": tokenizer.sha256,
                          "model_hash": cfg.model_hash(), "vocab_size": tokenizer.vocab_size,
                          "batches_sha256": batches_sha256(self.run_data.batches),
                          "text_sha256": self.run_data.text_sha256, "valid_sha256": self.run_data.valid_sha256,
                          # one run's checkpoints, and only they, are averaged (a resume keeps its checkpoint's)
                          "run_id": uuid.uuid4().hex}
        if dist.enabled:
            torch.manual_seed(t.seed + 1000 * dist.rank)  # each rank its own dropout masks
        self.saved_on_clock = -1  # the step of the newest checkpoint the save clock wrote (``save``)
        self.writing = False  # a checkpoint being written (``save``): what a second signal interrupted
        self.validated: tuple[int, dict[str, float]] = (-1, {})  # the step last validated, and its scores
        self.batches_then = 0  # a resumed run batched otherwise, or on other ranks: its epoch's batches then
        self.window_then: Any = None  # the steps of the next log line the checkpoint resumed from kept
        self.spent = False  # resumed with its budget spent: nothing to train, and its summary.json stands
        self.resumed_from: tuple[str, Any] | None = None  # the checkpoint --resume took: its name and run_id
        if resume:
            self.resume(allow_config_change)
            # every rank from the same checkpoint: ranks that each see a run folder of their own (nodes without a
            # shared disk) resumed one at step 20 and one from scratch, and trained on, out of step, to "done"
            if len(set(taken := distributed.gather(dist, self.resumed_from))) > 1:
                # the same names of two runs (folders copied, or trained apart) differ in their run ids alone
                same = len({t[0] if t else None for t in taken}) == 1
                said = ", ".join(f"rank {rank}: {t[0] if t else 'none'}{f' of run {t[1]}' if same and t else ''}"
                                 for rank, t in enumerate(taken))
                raise TrainError(f"--resume: the ranks found different checkpoints in {out} ({said}): every rank must "
                                 "see the same run folder (on several machines, one on a file system they share)")
            if dist.main:  # not before: a refused resume leaves the config its checkpoints were trained with
                files.write_text(out / "config.toml", dump_toml(cfg))
        if init_from is not None and self.state.step == 0:  # a resumed run goes on from its own checkpoints
            self.meta_base["init_from"] = self.start_from(init_from, parent,
                                                          inherited or parent_weights(init_from, parent))
        elif init_from is not None:
            self.log(f"--init-from {init_from}: not used; the run goes on from its own checkpoint (step "
                     f"{self.state.step})")
        inherited = None  # the parent's weights, a model's worth, not held through the training
        self.raw.train()
        self.model: torch.nn.Module = DistributedDataParallel(self.raw) if dist.enabled else self.raw
        self.buckets = shape_buckets(t)
        if t.compile:
            self.model = compiled(self.model, self.raw, dist.device, "reduce-overhead" if t.cuda_graphs else None)
        self.amp_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[self.precision]
        self.log(f"transformer {__version__}, torch {torch.__version__}, python {platform.python_version()}; seed "
                 f"{t.seed}; config sha256 {cfg.sha256()[:16]}; vocabulary sha256 {tokenizer.sha256[:16]}")
        auto = " (auto)" if t.precision == "auto" else ""
        self.log(f"model: {count_parameters(self.raw):,} parameters; vocabulary {tokenizer.vocab_size}; "
                 f"{self.precision}{auto} on {dist.device.type}; per step at most {t.max_tokens} tokens per side x "
                 f"update_freq {t.update_freq} x {dist.world} rank(s) = {t.max_tokens * t.update_freq * dist.world}")
        if t.save_every and t.save_minutes not in (0, TrainConfig.save_minutes):  # set, and without effect: unsaid
            self.log(f"note: train.save_minutes {t.save_minutes:g} is not used: train.save_every {t.save_every} sets the "
                     "save clock (set train.save_every = 0 to save by time)")
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        if dist.device.type == "cpu" and t.threads * dist.world > cores:  # threads waiting for a core, each step
            self.log(f"note: train.threads {t.threads} x {dist.world} rank(s), on {cores} core(s) this process may "
                     "use: threads beyond the cores wait for each other at every product, many times slower (0: "
                     "torch's default)")
        if dist.device.type == "cpu" and emulated_on_cpu(self.precision):  # fp16 trained at a seventh of fp32's rate
            self.log(f"note: train.precision {self.precision} on this CPU, which has no {self.precision} matrix "
                     "units: its products are emulated, far slower than fp32's (train.precision = \"auto\" picks by "
                     "the hardware)")
        if t.cuda_graphs and dist.device.type != "cuda":
            self.log(f"train.cuda_graphs: no CUDA graphs on {dist.device.type}; the compiled graphs run as they are")
        self.start_epoch(self.state.epoch)  # with subword sampling, its first segmentation: data preparation, off the clock
        if self.batches_then:  # batched otherwise, or on other ranks, since the checkpoint: the same share of the epoch
            done = round(self.state.batch_in_epoch * len(self.epoch_order) / self.batches_then)
            self.state.batch_in_epoch = min(done, len(self.epoch_order))

    def resume_note(self) -> str:
        """What --resume does after a stop without a checkpoint of its own."""
        return (f"--resume continues from the newest in {self.out / 'checkpoints'}" if list_checkpoints(self.out)
                else "none was written before it, so --resume starts the run again")  # it named a missing folder

    def start_from(self, init_from: Path, parent: Path, inherited: Inherited) -> dict[str, Any]:
        """Loads the weights ``init_from`` names (fine-tuning; ``parent_weights``' reading of them); what the run's
        records say it started from."""
        meta, weights, chosen = inherited
        if meta.get("vocab_sha256") != self.run_data.tokenizer.sha256:
            raise TrainError(f"--init-from {init_from}: its weights were trained with another vocabulary than "
                             f"{parent / 'spm.model'}")
        differ = self.cfg.differences(config_from_dict(meta.get("config"), f"{init_from} (config)"), "model")
        try:  # the shapes its record says were checked (refuse_misfit): a record may not say its tensors' truth
            load_weights(self.raw, weights, f"--init-from {init_from}")
        except CheckpointError as e:
            raise TrainError(str(e)) from None
        names = [p.stem for p in chosen]
        self.log(f"starting from the weights of {init_from} ({', '.join(names)}), with a fresh optimizer and "
                 f"schedule" + (f"; model settings changed: {'; '.join(differ)}" if differ else ""))
        return {"path": str(init_from.resolve()), "weights": names, "vocab_sha256": meta.get("vocab_sha256")}

    def resume(self, allow_changes: bool = False) -> None:
        """Weights, optimizer moments, position in the data and random state from the newest intact checkpoint.
        Training text changed in its files since (the config names the same ones) is refused unless
        ``allow_changes``, as text of other files is."""
        if self.dist.main and (self.out / "checkpoints").is_dir():  # a prune or write killed: what no record owns
            clear_debris(self.out / "checkpoints", self.log)
        ckpt = latest_checkpoint(self.out, warn=self.log, refuses=unresumable)
        if ckpt is None and (found := list_checkpoints(self.out)):  # training anew would write over them
            raise TrainError(f"--resume: none of the {len(found)} checkpoints in {self.out / 'checkpoints'} holds an "
                             f"intact training state (each is named {'in train.log' if self.quiet else 'above'}); to "
                             "train this run anew, move that folder away first (weights that verify still serve "
                             "`transformer average` and --checkpoint)")
        if ckpt is None:
            self.log(f"--resume: no checkpoint in {self.out}/checkpoints; " + (
                f"starting again from the weights of --init-from {self.init_again}, which the run was started with"
                if self.init_again else f"starting from the weights of --init-from {self.init_from}"
                if self.init_from else "starting from scratch"))
            return
        if ckpt.meta.get("vocab_sha256") != self.run_data.tokenizer.sha256:
            raise TrainError(f"{ckpt.path}: trained with another vocabulary than {self.out / 'spm.model'}")
        then, now = ckpt.meta.get("text_sha256"), self.meta_base["text_sha256"]
        if isinstance(then, dict) and now and then != now and not allow_changes:  # a checkpoint of before its record (2026-12-05): none
            changed = ", ".join(f"data.{k}" for k in now if then.get(k) != now[k])
            raise TrainError(f"--resume: {changed} changed since {ckpt.path.name} was written (the files' content, "
                             "their names the same): resume with the text the run trained on, or pass "
                             "--allow-config-change to go on with this text (its data order then differs from an "
                             "uninterrupted run's)")
        # the rate is the checkpoint's too: set again at every step, it is what a run resumed at its end records again
        settings = [{k: v for k, v in g.items() if k not in ("params", "lr")} for g in self.optimizer.param_groups]
        try:  # a file training wrote fits; one rebuilt or foreign, its hashes recomputed, loaded cast or crashed
            load_weights(self.raw, ckpt.weights, str(ckpt.path))
            load_optimizer_tensors(self.optimizer, ckpt.state, ckpt.meta["optim_param_groups"], ckpt.path,
                                   ckpt.meta["step"])
        except CheckpointError as e:
            raise TrainError(f"--resume: {e}; move it out of {self.out / 'checkpoints'} to resume from the one "
                             "before it") from None
        if ckpt.meta.get("on_clock", True):  # a run resumed at its end does not write that checkpoint again
            self.saved_on_clock = ckpt.meta["step"]
        if "init_from" in ckpt.meta:  # where the run started, in every later record too
            self.meta_base["init_from"] = ckpt.meta["init_from"]
        if "run_id" in ckpt.meta:  # a checkpoint of before run ids (2026-12-05) has none: the run takes a new one
            self.meta_base["run_id"] = ckpt.meta["run_id"]
        for group, own in zip(self.optimizer.param_groups, settings):  # Adam's moments and step are the checkpoint's;
            group.update(own)  # its settings the config's (--allow-config-change may change β2, ε, weight decay)
        if self.scaler and ckpt.meta.get("scaler"):  # checkpoints before the scaler was saved restart it
            self.scaler.load_state_dict(ckpt.meta["scaler"])
        # a checkpoint of before the fields: one rank, and the first batch order (2026-12-05)
        self.state = TrainState(**{"world_size": 1, "batch_order": 1, **ckpt.meta["train_state"]})
        self.window_then = ckpt.meta.get("log_window")
        if "clock_s" not in ckpt.meta["train_state"]:  # a checkpoint of an earlier version: the clock starts at it
            self.state.clock_s = self.state.elapsed_s
        saved = config_from_dict(ckpt.meta["config"], f"{ckpt.path} (config)")  # as prepare_run read it
        then, now = saved.train.keep_best, self.cfg.train.keep_best
        if then != now and self.state.best_value is not None:  # a value of another metric: compared with none
            self.state.best_value, self.state.best_step, self.state.evals_since_best = None, 0, 0
            if now:
                self.log(f"train.keep_best is {now}, the run until step {self.state.step} kept {then}: the best so "
                         f"far and the patience count start anew (best.safetensors, of {then}, goes at the first "
                         "evaluation)")
        self.reconcile_best()
        set_rng_state(self.dist, ckpt.state)
        # batches_sha256 is of the deterministic segmentation's batches: sampled epochs are batched otherwise
        rebatched = (ckpt.meta.get("batches_sha256") != self.meta_base["batches_sha256"]
                     or saved.data.subword_alpha != self.cfg.data.subword_alpha)
        if self.state.world_size != self.dist.world:
            # the step, the schedule and Adam's moments continue; the data order cannot
            then_tokens = saved.train.max_tokens * saved.train.update_freq * self.state.world_size
            now_tokens = self.cfg.train.max_tokens * self.cfg.train.update_freq * self.dist.world
            batch = f"tokens per step {now_tokens:,} as before"
            if then_tokens != now_tokens:
                batch = f"tokens per step {then_tokens:,} -> {now_tokens:,} (eq. 3's schedule was set for the batch"
                t = self.cfg.train
                keep = keeping(then_tokens, t.max_tokens, t.update_freq, self.dist.world, self.cfg.data.max_len,
                               accumulate=not t.cuda_graphs)
                batch += f"; to keep {then_tokens:,}: --set {keep} --allow-config-change)" if keep else ")"
            self.log(f"resuming a run trained on {self.state.world_size} rank(s) with {self.dist.world}: {batch}; the "
                     "position in the epoch is rescaled, and the batch order and dropout masks may differ from an "
                     "uninterrupted run's")
            # rescaled as the same share of the epoch's batches then and now (__init__, once the epoch's are drawn):
            # an epoch the ranks had finished stays finished (by world sizes, 2 ranks' 22 of 22 were 44 of 45, and its
            # last batch was trained as the end of that epoch again, reported, validated and saved twice)
            self.batches_then = self.state.epoch_batches
            self.state.world_size = self.dist.world
        if rebatched:
            # a checkpoint before batches were recorded (2026-12-02) was batched by (target, source) length
            self.log(f"the training batches differ from those {ckpt.path.name}'s run drew (another train.max_tokens, "
                     "data.subword_alpha, other data, or a version that batched otherwise): the step, the schedule "
                     "and Adam's moments continue; the position in the epoch is rescaled, and the data order from "
                     "here on differs from an uninterrupted run")
            self.batches_then = self.state.epoch_batches
        self.resumed_from = (ckpt.path.name, ckpt.meta.get("run_id"))
        self.log(f"resumed from {ckpt.path.name} at step {self.state.step}")

    def reconcile_best(self) -> None:
        """A best.safetensors newer than the checkpoint resumed from (killed, or the disk full, between the two
        writes of ``save``; the debris of a write killed midway goes first): its value and step are the best so
        far, so no worse model can replace it, and the evaluations replayed until that step do not count against
        train.patience (the run that reached it did not run out of patience before; counted, one resume could
        stop a run at once). One that is not this run's (another vocabulary or model), or not newer than the
        checkpoint, is left to be replaced, and said (another run's: copied in, its record's run_id another)."""
        best, state = self.out / "best.safetensors", self.state
        for debris in self.out.glob(".best.*.tmp"):  # of a write killed midway (files.atomic_path's names)
            debris.unlink(missing_ok=True)
        if not self.cfg.train.keep_best or not best.with_suffix(".json").is_file():
            return
        try:
            meta = load_checkpoint(best, with_state=False).meta
            model = self.cfg.differences(config_from_dict(meta.get("config"), f"{best} (config)"), "model")
            # dropout shapes training alone: --allow-config-change may change it
            runs = (meta.get("run_id"), self.meta_base["run_id"])  # a record of before run ids (2026-12-05): none
            foreign = (meta.get("vocab_sha256") != self.run_data.tokenizer.sha256 or None not in runs and runs[0] !=
                       runs[1] or any(not change.startswith("model.p_drop") for change in model))
        except (CheckpointError, ConfigError) as e:
            self.log(f"{best.name}: {e}; the run's next best replaces it")
            return
        record = meta.get("best") if isinstance(meta.get("best"), dict) else {}
        value, step = record.get("value"), record.get("step")
        if (record.get("metric") != self.cfg.train.keep_best or not isinstance(value, (int, float))
                or not isinstance(step, int) or step < state.step or step == state.best_step):
            return  # the checkpoint's own best is the newer (of its own step: the budget's end, validated after it)
        if foreign:
            self.log(f"{best.name} (best {record['metric']} {value:.4g} at step {step}) is of another run, "
                     "vocabulary or model than this run's: not taken; the run's next best replaces it")
            return
        if self.improves(value):
            state.best_value, state.best_step, state.evals_since_best = value, step, 0
            self.replaying_to = step
            self.log(f"best {record['metric']} {value:.4g} at step {step} taken from {best.name} (newer than the "
                     "checkpoint)")

    def elapsed(self) -> float:
        """Seconds of training, earlier attempts of a resumed run included."""
        return self.state.elapsed_s + time.monotonic() - self.start

    def start_epoch(self, epoch: int) -> None:
        """The examples, batches and batch order of ``epoch`` (its own segmentation with subword sampling)."""
        run, t = self.run_data, self.cfg.train
        self.examples, self.batches = run.sampled(epoch) if run.sampled else (run.train, run.batches)
        self.epoch_order = BatchOrder(len(self.batches), t.seed, self.dist.rank, self.dist.world,
                                      self.state.batch_order).epoch_order(epoch)
        self.state.epoch_batches = len(self.epoch_order)

    def intervals_done(self, step: int | None = None) -> int:
        """How many train.interval_unit have passed: optimizer steps (``step`` of them, default the steps
        applied), or epochs whose last batch is trained (the next epoch starts only when its first batch is
        drawn)."""
        state = self.state
        if self.cfg.train.interval_unit == "steps":
            return state.step if step is None else step
        return state.epoch + int(state.batch_in_epoch >= len(self.epoch_order))

    def ends(self, every: int, intervals: tuple[int, int] | None = None) -> bool:
        """Whether the step just taken completed a multiple of ``every`` intervals (0 = never). Counted
        from the last applied step, so an epoch that ends in a skipped step is reported at the next one.
        ``intervals``: (at the last applied step, now) as booking a step in flight would leave them."""
        before, now = intervals or self.intervals
        return bool(every) and now // every > before // every

    def next_batch(self) -> Batch:
        state = self.state
        if state.batch_in_epoch >= len(self.epoch_order):
            state.epoch, state.batch_in_epoch = state.epoch + 1, 0
            self.start_epoch(state.epoch)
        indices = self.batches[self.epoch_order[state.batch_in_epoch]]
        state.batch_in_epoch += 1
        batch = collate(self.examples, indices, self.buckets)
        # from page-locked memory the copy to a GPU is queued like a kernel; from pageable memory it can wait
        # for the GPU, and the host would not run ahead of it (``run``)
        return batch.pin_memory() if self.dist.device.type == "cuda" else batch

    def save(self, on_clock: bool) -> None:
        """A checkpoint of this moment: every rank's random state, rank 0's weights and optimizer. ``on_clock``:
        written by the save clock, not at the end of the budget or on a signal, whose checkpoint goes once a
        newer one is written (``checkpoint._prune``): a point to resume from, or the run's last weights."""
        self.writing = True  # still set where a second signal interrupts it: run() says what was written
        rng_states = distributed.gather(self.dist, rng_state(self.dist))  # every rank takes part
        if on_clock:  # every rank's clock of train.save_minutes starts again (after())
            self.state.clock_s = self.elapsed()
        if self.dist.main:
            self.write(on_clock, rng_states)
        self.writing = False

    def write(self, on_clock: bool, rng_states: list[dict[str, torch.Tensor]]) -> None:
        """``save``'s files, on rank 0."""
        weights = self.raw.state_dict()
        if not torch.stack([w.isfinite().all() for w in weights.values() if w.is_floating_point()]).all():
            # a step applied with finite gradients can still take the weights past float's range (a rate far too
            # high): written, they were averaged into translations and resumed from, and the run's end said they
            # were finite
            newest = list_checkpoints(self.out)
            kept = f"the newest is of step {record_step(newest[-1])}" if newest else "none was written before"
            raise TrainError(f"step {self.state.step}: the weights are not finite (a step at too high a rate "
                             f"overflowed them); no checkpoint written, {kept}. Lower train.lr_scale and train anew")
        tensors, groups = optimizer_tensors(self.optimizer)
        for r, states in enumerate(rng_states):
            tensors.update({f"{name}.{r}" if r else name: state for name, state in states.items()})
        meta = dict(self.meta_base, optim_param_groups=groups, on_clock=on_clock,
                    train_state={**self.state.__dict__, "elapsed_s": self.elapsed()},
                    log_window=saved_window(self.window),  # the next log line's steps so far: it averages them all
                    # fp16's loss scale and its steps since the last overflow: a resumed step scales as this one would
                    scaler=self.scaler.state_dict() if self.scaler else None)
        try:
            if self.pending_best is not None:  # before the checkpoint that records it (resume() reconciles a crash between)
                write_model(self.out / "best.safetensors", *self.pending_best)
                self.pending_best = None
            save_checkpoint(self.out, self.state.step, weights, tensors, meta, self.cfg.train.keep_last, self.log)
        except OSError as e:  # disk full, folder gone or read-only: the earlier checkpoints are intact
            fix = {errno.ENOSPC: "make room", errno.EDQUOT: "make room", errno.EFBIG: "make room",
                   errno.EACCES: "make the folder writable", errno.EPERM: "make the folder writable",
                   errno.EROFS: "make the folder writable"}.get(e.errno, "mend that")
            kept = "earlier checkpoints are intact" if list_checkpoints(self.out) else "there is no earlier checkpoint"
            # the file where one is named: best.safetensors, or a file made immutable
            where = f"({e.filename})" if e.filename else f"in {self.out / 'checkpoints'}"
            raise TrainError(f"cannot write the checkpoint of step {self.state.step} {where}: "
                             f"{e.strerror or e}; {kept}: {fix} and --resume") from None

    def learning_rate(self, time_used: float, ahead: int = 0) -> float:
        """Eq. (3) for the next step, cooled down over the end of the budget when the config says so.
        ``ahead``: steps in flight, or a step just skipped, counted as applied (a step queued after one whose
        gradients turn out not finite takes the rate one step further on; the skipped step itself changes nothing)."""
        t, done = self.cfg.train, self.state.step + ahead
        lr = learning_rate(done + 1, self.cfg.model.d_model, t.warmup_steps, t.lr_scale)  # eq. (3)
        if t.cooldown_fraction:  # rank 0's clock decides, so every rank takes the same rate
            lr *= cooldown(max(done / t.max_steps, time_used), t.cooldown_fraction)
        return lr

    def queue(self, lr: float) -> InFlight:
        """The next step's batches drawn and its work queued on the device, its outcome not read."""
        t = self.cfg.train
        if t.cuda_graphs:  # the outputs of the step before's graphs are no longer read: their memory is free
            torch.compiler.cudagraph_mark_step_begin()
        queued = queue_step(self.model, self.optimizer, [self.next_batch() for _ in range(t.update_freq)], t.eps_ls,
                            lr, t.clip_norm, self.dist, self.scaler, self.amp_dtype)
        # on a CPU the step is done when queue_step returns, before the next one is queued; a log line's time
        # must not take in the step queued after its last one
        return InFlight(queued, lr, epochs_into(vars(self.state)),  # every step: the fields, not asdict's deep copy
                        time.monotonic() if self.dist.device.type == "cpu" else None)

    def after(self) -> AfterStep:
        """What booking the step in flight will do if it applies: a log line, validation, a checkpoint, the
        checksums. Called when every step before it is booked and no batch is drawn after its own; every
        rank calls it once per step (a checkpoint is due on every rank when any rank's save clock says so)."""
        t, step = self.cfg.train, self.state.step + 1  # the number the step in flight takes if applied
        intervals = (self.intervals[1], self.intervals_done(step))
        logged = self.ends(t.log_every, intervals) or step == t.max_steps
        # minutes of training, earlier attempts of a resumed run included: a run stopped more often than its
        # clock still writes the checkpoints (and so the average) of a run never stopped
        # one clock: save_every's where set, the minutes' otherwise (both at once, the average of the last N took
        # checkpoints of either, unevenly spaced, and keep_last counted both)
        due = self.ends(t.save_every, intervals) if t.save_every else (
            t.save_minutes and self.elapsed() - self.state.clock_s >= 60 * t.save_minutes)
        return AfterStep(intervals[1], logged, logged and self.evaluates(intervals),
                         bool(distributed.all_sum(self.dist, [float(bool(due))])[0]),
                         self.dist.enabled and step % t.check_every == 0)

    def book(self, step: InFlight, plan: AfterStep, bar: tqdm) -> None:
        """Reads ``step``'s outcome (the wait for the device) and counts it; if it was applied, does what
        ``plan`` says. A step whose gradients were not finite is counted as skipped, and many in a row stop
        training."""
        t, state = self.cfg.train, self.state
        result = step.queued.result()
        done = step.done_at if step.done_at is not None else time.monotonic()
        if not result.applied:
            state.skipped_steps += 1
            state.bad_in_a_row += 1
            self.log(f"step {state.step + 1}: gradients are not finite (loss {result.loss:.4g}); step skipped "
                     f"({state.skipped_steps} so far)")
            if state.bad_in_a_row >= t.max_bad_steps:
                newest = list_checkpoints(self.out)
                last = record_step(newest[-1]) if newest else None
                if last is None:
                    kept = "no checkpoint was written yet"
                elif last == state.step:  # the weights these steps started from: resumed, met again
                    kept = f"the newest checkpoint, of step {state.step}, holds the weights they started from"
                else:
                    kept = f"the newest checkpoint is of step {last}"
                # before any update the rate has played no part: the initial model's gradients overflow
                fix = ("Lower train.lr_scale (or check train.init_qkv_gain, train.adam_eps)" if state.step else
                       "The initial model's gradients overflow: check the dropout rates (model.p_drop*), "
                       "model.ln_eps and train.init_qkv_gain")
                raise TrainError(f"{state.bad_in_a_row} steps in a row had non-finite gradients; stopping at step "
                                 f"{state.step} ({kept}). {fix}"
                                 + (", or use fp32/bf16 instead of fp16" if self.precision == "fp16" else ""))
            return
        state.bad_in_a_row = 0
        state.step += 1
        # the plan's count: by now the state may hold the batches of the step queued after this one
        state.epochs_done = plan.intervals if t.interval_unit == "epochs" else None
        state.tgt_tokens += result.n_tokens
        self.window["loss"] += result.loss
        self.window["tokens"] += result.n_tokens
        self.window["norms"].append(result.grad_norm)
        self.window["t1"] = done
        if plan.check:
            sums = distributed.gather(self.dist, distributed.parameter_checksum(self.raw))
            if any(abs(x - sums[0]) > 1e-6 * max(1.0, abs(sums[0])) for x in sums):
                raise TrainError(f"step {state.step}: the ranks' parameters drifted apart (checksums {sums})")
        bar.update(budget_used(state.step, t.max_steps, self.elapsed(), t.max_minutes) - bar.n)
        self.intervals = (self.intervals[1], plan.intervals)
        with distributed.rank0_alone(self.dist, wait=plan.evaluates):  # the others wait while rank 0 validates
            if self.dist.main and plan.logged:
                self.report(step, bar)
        if plan.save:
            with distributed.rank0_alone(self.dist):  # while rank 0 writes it
                self.save(on_clock=True)
            self.saved_on_clock = self.state.step

    def evaluate(self) -> dict[str, float]:
        """Validation loss and perplexity of the model as it is now."""
        t = self.cfg.train
        return validate(self.raw, self.run_data.valid, t.max_tokens,
                        t.eps_ls if t.keep_best == "valid_smoothed_loss" else None)

    def improves(self, value: float) -> bool:
        """Whether ``value`` of train.keep_best's metric beats the best so far (lower for the losses,
        higher for dev BLEU)."""
        best = self.state.best_value
        if not math.isfinite(value):  # NaN: no value beats it, nor does it beat any (a NaN best stalled patience)
            return False
        if best is None:
            return True
        return value > best if self.cfg.train.keep_best == "dev_bleu" else value < best

    def keep_best(self, value: float) -> None:
        """train.keep_best: a better value than any before is kept for best.safetensors (+ its JSON record with
        the metric, step and value), written with the next checkpoint (``save``); with train.patience, that
        many evaluations without one end training."""
        t, state = self.cfg.train, self.state
        if self.improves(value):
            state.best_value, state.best_step, state.evals_since_best = value, state.step, 0
            # written with the next checkpoint, whose record holds this best: a resume never rewinds it
            self.pending_best = ({k: v.detach().to("cpu", copy=True) for k, v in self.raw.state_dict().items()},
                                 dict(self.meta_base, best={"metric": t.keep_best, "step": state.step, "value": value}))
            self.log(f"best {t.keep_best} so far: {value:.4g} at step {state.step} (kept in best.safetensors "
                     "with the next checkpoint)")
            return
        if state.step <= self.replaying_to:  # before a best taken from best.safetensors (reconcile_best)
            return
        state.evals_since_best += 1
        if not math.isfinite(value):
            self.log(f"{t.keep_best} is {value}: not a best, counted as no improvement")
        if t.patience and state.evals_since_best >= t.patience:
            self.out_of_patience = True
            kept = ("no evaluation had a finite value" if state.best_value is None else
                    f"the best, {state.best_value:.4g} at step {state.best_step}, is in best.safetensors")
            evals = f"evaluation{'s' * (state.evals_since_best != 1)}"
            self.log(f"stopping: {state.evals_since_best} {evals} of {t.keep_best} without improvement "
                     f"(train.patience); {kept}")

    def validate_end(self) -> None:
        """The budget's end (not a signal's), its checkpoint written: the last step validated where no evaluation
        of train.eval_every did (for the summary), and a train.keep_best loss that beats the best kept in
        best.safetensors, as fairseq keeps its end's: the summary showed a better loss than the run's "best",
        which --checkpoint best then decoded with. Written after the step's checkpoint, whose record holds the
        best before it: resume() takes the file as the newer. Not counted against train.patience, which training
        has no more use for; dev BLEU is not translated again here."""
        t, state = self.cfg.train, self.state
        if self.spent or state.step == 0 or self.validated[0] == state.step:
            return
        self.validated = (state.step, self.evaluate())
        metric = {"valid_loss": "valid_nll", "valid_smoothed_loss": "valid_smoothed_loss"}.get(t.keep_best)
        if metric is None or not self.improves(value := self.validated[1][metric]):
            return
        state.best_value, state.best_step, state.evals_since_best = value, state.step, 0
        write_model(self.out / "best.safetensors", self.raw.state_dict(),
                    dict(self.meta_base, best={"metric": t.keep_best, "step": state.step, "value": value}))
        self.log(f"best {t.keep_best} so far: {value:.4g} at step {state.step}, the budget's end (kept in "
                 "best.safetensors)")

    def bleu_due(self, intervals: tuple[int, int] | None = None) -> bool:
        return self.ends(self.cfg.train.bleu_every, intervals) and self.cfg.data.task == "translate"

    def evaluates(self, intervals: tuple[int, int] | None = None) -> bool:
        """Whether rank 0's log line of this step validates or translates (work the other ranks wait for)."""
        return self.ends(self.cfg.train.eval_every, intervals) or self.bleu_due(intervals)

    def report(self, step: InFlight, bar: tqdm) -> None:
        """Rank 0's log line of ``step``, just booked (loss, rate, tokens/s; validation and dev BLEU when
        due): to the progress bar, train.log, metrics.jsonl and TensorBoard."""
        t, state, window, lr = self.cfg.train, self.state, self.window, step.lr
        dt = max(window["t1"] - window["t0"], 1e-9)  # from the window's start to its last step's end
        # epochs trained (fractional mid-epoch): 7 at the end of the seventh, as fairseq numbers it
        rec = {"step": state.step, "epoch": round(step.epoch, 3),
               "minutes": self.elapsed() / 60, "lr": lr,
               "train_loss": window["loss"] / window["tokens"],  # per target token, all ranks
               "tokens_per_s": window["tokens"] / dt, "grad_norm": statistics.fmean(window["norms"]),
               "grad_norm_max": max(window["norms"])}
        budget = f"{state.step}/{t.max_steps}" + (f", {rec['minutes']:.1f}/{t.max_minutes:g} min" if t.max_minutes else "")
        bar.set_postfix(step=budget, loss=f"{rec['train_loss']:.3f}", lr=f"{lr:.2e}", tok_s=f"{rec['tokens_per_s']:.0f}")
        evaluating = time.monotonic()
        if self.evaluates():  # the bar stands still meanwhile (a large validation set, dev BLEU: minutes)
            bar.set_description_str("train (validating)")
        if self.ends(t.eval_every):
            self.validated = (state.step, self.evaluate())
            rec.update(self.validated[1])
        if self.bleu_due():
            from .translator import ModelOverflow

            try:
                rec["valid_bleu"] = dev_bleu(self.raw, self.run_data.tokenizer,
                                             self.run_data.valid_text[:t.bleu_sentences], self.cfg)
            except ModelOverflow as e:  # its "line 1" named no file: the first validation sentence of this step
                raise TrainError(f"step {state.step}: dev BLEU, validation sentence {e}") from None
        evaluated = time.monotonic() - evaluating
        bar.set_description_str("train")
        self.board.add({k: v for k, v in rec.items() if k not in ("step", "epoch")}, state.step)
        files.append_text(self.out / "metrics.jsonl", json.dumps(rec) + "\n")
        self.log(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in rec.items()))
        metric = {"valid_loss": "valid_nll", "valid_smoothed_loss": "valid_smoothed_loss",
                  "dev_bleu": "valid_bleu"}.get(t.keep_best)
        if metric in rec:
            self.keep_best(rec[metric])
        # the next line's time runs on from this step's end, less the validation and translation just done; a line
        # of the step budget's end alone (off train.log_every) leaves its steps to the checkpoint: a run continued
        # for longer averages them in its next line, as a run never stopped does (``trim_metrics``)
        if self.ends(t.log_every):
            self.window = new_window(window["t1"] + evaluated)

    def trim_metrics(self, again: bool = False) -> None:
        """metrics.jsonl as of the step resumed from: the records of later steps (logged after the checkpoint
        resumed from, they come again) and lines that are no record (a last line cut short by a disk that filled
        up, one damaged by hand: what ``figures.metrics_record`` refuses) go, so that the file holds each step once,
        in order, and every line reads (``plot``: a damaged line kept had the resumed run's records written after
        it, and the whole file refused).
        ``again``: the record of the step resumed from goes too (the line of a step budget's end, whose steps the
        next line averages again)."""
        path, step = self.out / "metrics.jsonl", self.state.step
        if not path.exists():
            return
        lines = path.read_bytes().splitlines(keepends=True)

        from .figures import FigureError, metrics_record  # what plot reads

        def step_of(line: bytes) -> int | None:
            try:
                return metrics_record(line.decode("utf-8"), "")["step"] if line.endswith(b"\n") else None
            except (FigureError, UnicodeDecodeError):
                return None

        steps = [step_of(line) for line in lines]
        kept = [line for line, s in zip(lines, steps) if s is not None and (s < step or s == step and not again)]
        if len(kept) < len(lines):
            files.write_bytes(path, b"".join(kept))
            damaged = steps.count(None)
            later = len(lines) - len(kept) - damaged
            said = [f"{later} record(s) after step {step}, the step resumed from{' (or of it)' if again else ''}, "
                    "left out (they are logged again)"] if later else []
            said += [f"{damaged} line(s) that are no record (cut short, or damaged), left out"] if damaged else []
            self.log(f"metrics.jsonl: {'; '.join(said)}")

    def run(self) -> dict[str, Any]:
        """Steps until train.max_steps or train.max_minutes (or a signal), saving on the clock; then the
        last checkpoint and the summary."""
        t, dist, state = self.cfg.train, self.dist, self.state
        # set by keep_best on rank 0 (every rank stops after the same step); a run resumed after its patience
        # ran out stops at once, unless the new config allows more
        self.out_of_patience = bool(t.patience and state.evals_since_best >= t.patience)
        if dist.main:
            # the checkpoint's log window holds steps that a line of the step budget's end logged (``report``):
            # training on, the next line averages them again and takes that line's place
            again = state.step < t.max_steps and resumed_window(self.window_then)["tokens"] > 0
            # resumed from an older checkpoint than the last line logged, TensorBoard hides what came after it; from
            # none, every step an attempt that wrote no checkpoint logged (metrics.jsonl's go: trim_metrics)
            self.board = Board(self.out / files.BOARD, state.step + int(not again), self.log)
            self.trim_metrics(again)
            if state.step >= t.max_steps:
                self.log(f"train.max_steps {t.max_steps}: already reached at step {state.step}; nothing to train")
                self.spent = True  # summary.json, of the attempt that trained, stands
            elif self.out_of_patience:  # as spent: it stops at once (said below)
                self.spent = True
            elif (self.out / "summary.json").exists():  # written again when this budget ends
                (self.out / "summary.json").unlink()
        self.start = time.monotonic()
        self.window = resumed_window(self.window_then)
        # the bar counts down whichever budget ends first, updates or minutes (in thousandths of it); at a
        # terminal only: into a file (nohup, a batch job's log) its redraws would fill the log between its lines
        bar = tqdm(total=1000, initial=budget_used(state.step, t.max_steps, self.elapsed(), t.max_minutes),
                   desc="train", disable=self.quiet or not dist.main or not sys.stderr.isatty(), dynamic_ncols=True,
                   mininterval=1.0,
                   bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining}{postfix}")
        # (at the last applied step, now), for ends(); resumed after skipped steps that ended an epoch, that epoch
        # is reported at the next applied step, as in a run never stopped
        done = self.intervals_done()
        if t.interval_unit == "epochs" and state.bad_in_a_row and state.epochs_done is not None:
            done = state.epochs_done
        self.intervals = (done,) * 2
        if self.out_of_patience and state.step < t.max_steps:  # it ended at once, said only in summary.json
            evals = f"evaluation{'s' * (state.evals_since_best != 1)}"
            self.log(f"train.patience {t.patience}: already run out at step {state.step} ({state.evals_since_best} "
                     f"{evals} of {t.keep_best} without improvement); nothing to train: raise train.patience to "
                     "train on")
        stop = StopSignals()
        stopped_by: int | None = None  # the signal that stops every rank, whichever rank it came to
        # the host runs a step ahead: it queues step k + 1 before it reads step k's outcome, so that on a GPU
        # the next batch is collated and its kernels launched while step k still runs. Step k is booked
        # first, with nothing queued after it, where booking it reads the weights (validation, a
        # checkpoint), where it may be the last, and where training stops.
        pending: InFlight | None = None
        ended = False  # the budget's end's checkpoint written
        try:
            while True:
                plan = self.after() if pending else None
                if pending and (plan.reads_weights or state.step + 1 >= t.max_steps):
                    self.book(pending, plan, bar)
                    pending = None
                if state.step >= t.max_steps:
                    break
                # rank 0's clock decides, so that every rank stops after the same step; a signal on any rank
                # stops them all
                time_used = self.elapsed() / (60 * t.max_minutes) if dist.main and t.max_minutes else 0.0
                out_of_time, sigterm, sigint, patience, time_used = distributed.all_sum(
                    dist, [float(time_used >= 1.0), float(stop.received in (signal.SIGTERM, *HANGUP)),
                           float(stop.received == signal.SIGINT), float(self.out_of_patience), time_used])
                if sigterm or sigint:  # this rank's signal, or another's: every rank stops as signalled
                    stopped_by = stop.received or (signal.SIGTERM if sigterm else signal.SIGINT)
                if out_of_time or sigterm or sigint or patience:
                    if pending:
                        self.book(pending, plan, bar)
                    break
                # a step in flight counts as applied, and so does one just skipped (gradients not finite): the step
                # after a skipped one takes the rate one step on whether it was queued before that one was booked or
                # after (where training stopped, or the budget's last step was due): as in a run never stopped
                ahead = int(bool(pending) or state.bad_in_a_row > 0)
                queued = self.queue(self.learning_rate(time_used, ahead=ahead))
                if pending:
                    self.book(pending, plan, bar)
                pending = queued
            bar.close()
            # the last checkpoint, taken with the signals still held: the ranks of a job see a stop signal at
            # different moments (a killed launcher's, each within a second), and one stopped by another's took its
            # own here as "terminated", losing the checkpoint and every step since the one before;
            # the budget's end or a signal: off the clock, unless the clock wrote this step's already (it was written
            # twice, weights and Adam's moments: 2.6 GB for big at every run's end on a save_every multiple)
            if self.saved_on_clock != state.step:
                self.save(on_clock=False)
            ended = True
            if stopped_by is None and dist.main:  # after the checkpoint: a validation that fails loses no step
                self.validate_end()
        except KeyboardInterrupt:
            if stop.again is None:  # not StopSignals' (no main thread, say): as it came
                raise
            name, where = signal.Signals(stop.again).name, f"in step {state.step + 1}"
            what = "without writing a checkpoint"
            if ended:  # in the budget's end's validation
                where, what = f"after step {state.step}", "its checkpoint written"
            elif self.writing:  # the budget's last checkpoint, or the clock's (in book())
                where = f"while writing the checkpoint of step {state.step}"
                if (self.out / "checkpoints" / f"step_{state.step:08d}.json").is_file():  # its record renamed in
                    where, what = f"as the checkpoint of step {state.step} was written", "that checkpoint whole"
            then = self.resume_note()
            self.log(f"{name} again: stopped at once, {where}, {what}; {then}", terminal=False)
            again = TrainInterrupted(stop.again, f"{name} again: training stopped at once, {where}, {what}; {then}")
            again.said = self.dist.main  # every rank takes it: rank 0 says so for the job (it was said once a rank)
            raise again from None
        except Exception as e:
            if stop.received is None or not distributed.lost_contact(e):
                raise
            # the signal reached the ranks at different moments: one still starting (before the loop) stops at
            # once with nothing to save, and this one, waiting for it at the step's end, lost it; it was told as a
            # crash ("lost the other processes ... a remote worker crashing") with a traceback file
            name = signal.Signals(stop.received).name
            then = self.resume_note()
            raise TrainInterrupted(stop.received, f"{name}: training stopped in step {state.step + 1}, without a "
                                   f"checkpoint of it: another process of the job had stopped on the signal before "
                                   f"it; {then}") from None
        finally:
            try:  # while a second signal is still StopSignals' to take
                if self.run_data.sampled:
                    self.run_data.sampled.close()
            finally:
                stop.restore()
                if dist.main:  # however training ended: the summary below writes nothing to it
                    self.board.close()
        if (stopped_by := stopped_by or stop.received) is not None:
            # die_with_launcher's SIGTERM: no one sent it
            gone = stop.received == signal.SIGTERM and distributed.LAUNCHER_GONE.is_set()
            why = " (to another rank)" if not stop.received else " (its launcher is gone)" if gone else ""
            name = signal.Signals(stopped_by).name + why
            self.log(f"{name}: stopped after step {state.step}, checkpoint written; continue with --resume")
            stopped = TrainInterrupted(stopped_by, f"{name}: training stopped after step {state.step} with its "
                                       f"checkpoint written to {self.out / 'checkpoints'}; continue with --resume")
            stopped.said = self.dist.main  # every rank stops after the same step: rank 0 says so for the job
            raise stopped
        summary = {"step": state.step, "train_minutes": self.elapsed() / 60, "tgt_tokens": state.tgt_tokens,
                   "tokens_per_s": state.tgt_tokens / max(self.elapsed(), 1e-9), "skipped_steps": state.skipped_steps}
        if "init_from" in self.meta_base:
            summary["init_from"] = self.meta_base["init_from"]
        if t.keep_best:
            summary["best"] = {"metric": t.keep_best, "step": state.best_step, "value": state.best_value,
                               "stopped_by_patience": self.out_of_patience}
        if dist.main:
            with contextlib.suppress(OSError, ValueError):  # none, or unreadable: written again below
                if self.spent and isinstance(kept := json.loads((self.out / "summary.json").read_text()), dict) \
                        and kept.get("step") == state.step:
                    self.log(f"done: {json.dumps(kept)}")  # rewritten, its minutes were this call's, not training's
                    return kept
            # the last step's validation where it had one (the same weights: on a large validation set, minutes)
            step, scores = self.validated
            summary.update({k: scores[k] for k in ("valid_nll", "valid_ppl")} if step == state.step else
                           validate(self.raw, self.run_data.valid, t.max_tokens))
            self.log(f"done: {json.dumps(summary)}")
            files.write_text(self.out / "summary.json", json.dumps(summary, indent=2) + "\n")  # what benchmarks read
            if not math.isfinite(summary["valid_nll"]):  # it ended with 0, a model no search can rank outputs of
                raise TrainError(f"the trained model's validation loss is {summary['valid_nll']}: its weights "
                                 "overflow the arithmetic (too high a rate: train.lr_scale, train.warmup_steps)")
        return summary
