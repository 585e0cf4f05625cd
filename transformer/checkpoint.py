"""Checkpoints: safetensors tensors + a JSON record; written atomically, verified on load (§6.1).

A checkpoint is a JSON file naming its tensor files with their size and sha256. The JSON is written
last and is the commit marker: tensor files without it are leftovers of a crashed write, never a
checkpoint. Every file is written through files.atomic_path (temp file, fsync, rename, fsync of the
folder), so a crash leaves either the old state or the new one, never half of a file under the final name.

Nothing here unpickles: tensors are read by safetensors (a JSON header and raw bytes), and pickle
files (.pt, .pth, .bin, .pkl, .pickle, .ckpt) are refused by their suffix before they are opened, because
loading a pickle runs whatever code its author put in it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save_file
from torch import Tensor

from .config import Config, ConfigError, as_path, check_count, check_sequence, config_from_dict, edited_model
from .errors import UserError
from .files import atomic_path, atomic_paths, file_sha256, os_error_in, read_record, refuse_special, write_text

FORMAT = "transformer-checkpoint/1"
PICKLE_SUFFIXES = frozenset({".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt"})
_STEP_JSON = re.compile(r"step_(\d{8,})\.json")
_STEP_DATA = re.compile(r"step_(\d{8,})(\.state)?\.safetensors")


def _suffix(path: str | Path) -> str:
    """``path``'s suffix in lower case: the command line takes --out x.SAFETENSORS as a model file, so
    every check of a suffix here does too (and a pickle's .PT is refused as its .pt is)."""
    return Path(path).suffix.lower()


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be used; the one-line message names the file and the problem."""


class CheckpointMismatch(CheckpointError):
    """Checkpoints, each intact, that cannot be averaged together (another vocabulary, run or model)."""


@dataclass
class Checkpoint:
    """A verified checkpoint, fully in memory."""

    path: Path  # the .json record
    weights: dict[str, Tensor]
    state: dict[str, Tensor] | None  # optimizer moments, RNG states; None if not asked for or absent
    meta: dict[str, Any]  # the whole JSON record: the caller's meta + "format", "files" (+ "step")


def _save_file(tensors: dict[str, Tensor], path: Path) -> None:
    """safetensors' save_file, with the I/O errors it reports as its own exception type (a full
    disk, say) raised as the OSError they are, so callers handle them as any failed write."""
    try:
        save_file(tensors, str(path), metadata={"format": "pt"})
    except SafetensorError as e:
        if (error := os_error_in(e, path)) is None:
            raise
        raise error from None


def _write_tensors(path: Path, tensors: dict[str, Tensor]) -> dict[str, Any]:
    """Writes a .safetensors file atomically; returns its {"name", "sha256", "bytes"} entry."""
    with atomic_path(path) as tmp:
        return _stage_tensors(tmp, path.name, tensors)


def _stage_tensors(tmp: Path, file_name: str, tensors: dict[str, Tensor]) -> dict[str, Any]:
    """Writes the tensors to ``tmp``, the temporary file of ``file_name``; returns its entry."""
    seen: set[int] = set()
    ready = {}
    for name, t in tensors.items():
        t = t.detach().to("cpu").contiguous()
        # safetensors refuses tensors sharing storage (tied weights): give each its own copy.
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen and t.numel() > 0:
            t = t.clone()
        seen.add(ptr)
        ready[name] = t
    _save_file(ready, tmp)
    # checksummed after the write, from the file itself (what load will verify is what is on disk), before it
    # takes its name: a record written over goes on naming the old bytes for no longer than a rename
    return {"name": file_name, "sha256": file_sha256(tmp), "bytes": tmp.stat().st_size}


def _record_text(record: dict[str, Any]) -> str:
    # NaN/inf are kept (Python reads them back): losing a checkpoint to a NaN metric would be worse.
    return json.dumps(record, indent=2) + "\n"


def _write_record(json_path: Path, record: dict[str, Any]) -> None:
    write_text(json_path, _record_text(record))


def _own_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """The caller's meta without "format"/"files": those describe the files being written, so a copy
    taken from another checkpoint's record is stale. Fails before any file is written."""
    meta = {k: v for k, v in meta.items() if k not in ("format", "files")}
    json.dumps(meta)  # raises TypeError if not JSON-able
    return meta


def write_model(path: Path, weights: dict[str, Tensor], meta: dict[str, Any]) -> Path:
    """Writes a self-describing model: `path` (.safetensors) + `path.with_suffix(".json")`.

    meta should carry "config" and "vocab_sha256" so the model can be rebuilt from the file alone.
    Returns the JSON path (the commit marker, written last).
    """
    path = Path(path)
    if _suffix(path) != ".safetensors":
        raise ValueError(f"{path.name}: model files must end in .safetensors")
    meta = _own_meta(meta)
    path.parent.mkdir(parents=True, exist_ok=True)
    json_path = path.with_suffix(".json")
    # written over (train.keep_best's best.safetensors, an average): both files are written before either takes
    # its name, so a write that fails (a full disk) or is killed leaves the old pair whole. The weights with a
    # record written after them had been replaced when the record's write failed: neither pair was left
    with atomic_paths(path, json_path) as (weights_tmp, record_tmp):
        entry = _stage_tensors(weights_tmp, path.name, weights)
        text = _record_text({"format": FORMAT, **meta, "files": {"weights": entry}})
        try:
            record_tmp.write_text(text, encoding="utf-8")
        except OSError as e:  # said naming the record, not the weights written before it
            e.filename = str(record_tmp)
            raise
    return json_path


def save_checkpoint(run_dir: Path, step: int, weights: dict[str, Tensor], state: dict[str, Tensor],
                    meta: dict[str, Any], keep_last: int, warn: Callable[[str], None] = print) -> Path:
    """Writes run_dir/checkpoints/step_NNNNNNNN.{safetensors,state.safetensors,json}; returns the .json.

    Then deletes the checkpoints older than the newest `keep_last` on the save clock (those
    checkpoints_to_average would take, so an average of up to `keep_last` is always there to make),
    and the debris of crashed writes (temp files, tensor files without their JSON). A file that cannot be
    deleted stays, said through ``warn``: the checkpoint is written (it ended training as one that was not).
    """
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    meta = _own_meta(meta)
    if meta.get("step", step) != step:
        raise ValueError(f"meta says step {meta['step']}, saving step {step}")
    ckpt_dir = Path(run_dir) / "checkpoints"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    stem = f"step_{step:08d}"
    json_path = ckpt_dir / f"{stem}.json"
    json_path.unlink(missing_ok=True)  # re-saving a step: the old record must not vouch for new bytes
    try:
        files = {"weights": _write_tensors(ckpt_dir / f"{stem}.safetensors", weights),
                 "state": _write_tensors(ckpt_dir / f"{stem}.state.safetensors", state)}
        _write_record(json_path, {"format": FORMAT, "step": step, **meta, "files": files})
    except BaseException:  # a full disk, say: the tensor files already written, without their record, go now
        if json_path.exists():  # the record renamed in (a second Ctrl-C as its folder was synced): written whole
            raise
        for suffix in (".safetensors", ".state.safetensors"):  # (they stayed until the next checkpoint, taking room)
            with contextlib.suppress(OSError):
                (ckpt_dir / f"{stem}{suffix}").unlink(missing_ok=True)
        raise
    _prune(ckpt_dir, keep_last, warn)
    return json_path


def _prune(ckpt_dir: Path, keep_last: int, warn: Callable[[str], None]) -> None:
    """JSON first, then data: a half-deleted checkpoint is one without JSON, which never loads.

    Kept: the newest checkpoint, the newest `keep_last` on the save clock, and those an average of
    `keep_last` takes. One written off the clock (at the end of the budget, on a signal) does not count
    against `keep_last`: counting it left a run whose budget ended just after an epoch with one
    checkpoint too few for its decode.average_last. Once a newer one is written, a signal's checkpoint
    goes, and the clock's before it stay: the run resumed from it keeps the checkpoints, and so the
    average, of a run never interrupted. A record that cannot be read is neither counted nor deleted (resume
    and average name it): counted as the newest, a truncated one had the good checkpoint before it deleted.
    With a record of another shape among them (edited by hand), none is deleted. A file that cannot be deleted
    (EPERM: another user's, in a sticky folder) is said and left.
    """
    readable: list[tuple[Path, dict[str, Any]]] = []
    for path in list_checkpoints(ckpt_dir.parent):
        with contextlib.suppress(CheckpointError):
            readable.append((path, checkpoint_record(path)))
    found = [path for path, _ in readable]
    try:
        clock = [path for path, record in readable if record.get("on_clock") is not False]
        keep = {*found[-1:], *clock[-keep_last:], *checkpoints_to_average(ckpt_dir.parent, keep_last, found)}
    except CheckpointError:
        keep = set(found)
    for old in found:
        if old not in keep:
            _delete(old, warn)
    clear_debris(ckpt_dir, warn)


def unrecorded(ckpt_dir: Path) -> list[Path]:
    """The tensor files of ``ckpt_dir`` without their record (step_N.json), in order."""
    if not ckpt_dir.is_dir():
        return []
    return sorted(p for p in ckpt_dir.iterdir() if (data := _STEP_DATA.fullmatch(p.name)) is not None
                  and not (ckpt_dir / f"step_{data.group(1)}.json").exists())


def unrecorded_note(run_dir: Path, newest: Path) -> str | None:
    """A note naming the weights files of ``run_dir`` newer than ``newest`` (the newest record an average took) that
    have no record: left out, as an unfinished write must be, and said, as a record lost (deleted by hand, a copy
    that missed it) was not."""
    after = record_step(newest)
    newer = [p.name for p in unrecorded(Path(run_dir) / "checkpoints") if not p.name.endswith(".state.safetensors")
             and int(_STEP_DATA.fullmatch(p.name).group(1)) > after]
    if not newer:
        return None
    return (f"note: {', '.join(newer)} in {Path(run_dir) / 'checkpoints'} {'has' if len(newer) == 1 else 'have'} no "
            "JSON record (a write under way, or the record lost): left out, as a file no record vouches for is")


def clear_debris(ckpt_dir: Path, warn: Callable[[str], None]) -> None:
    """Deletes what no checkpoint owns: tensor files without their record (a prune killed between the two) and
    the temporary files of writes killed midway; a resume does it too, so a run killed in its last prune
    (nothing left to train, no checkpoint to write) does not keep three model sizes of them. (Of a folder
    with no record at all, a new run refuses them and a resume sets them aside: ``train.prepare_run``.)"""
    orphans = set(unrecorded(ckpt_dir))
    for p in ckpt_dir.iterdir():
        # ours (files.atomic_path), and safetensors' own (.tmpXXXXXX, renamed onto ours) of a write killed midway
        if p in orphans or (p.name.startswith(".step_") and p.name.endswith(".tmp")) or p.name.startswith(".tmp"):
            _delete(p, warn)


def _delete(path: Path, warn: Callable[[str], None]) -> None:
    """``path`` deleted, or said where it cannot be (EPERM: another user's, in a sticky folder)."""
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        warn(f"cannot delete the old checkpoint file {path}: {e.strerror or e}; it stays")


def json_for(path: Path) -> Path:
    """Maps any file of a checkpoint to its JSON record."""
    if _suffix(path) == ".json":
        return path
    if path.name.lower().endswith(".state.safetensors"):
        return path.with_name(path.name[: -len(".state.safetensors")] + ".json")
    if _suffix(path) == ".safetensors":
        return path.with_suffix(".json")  # as write_model names it, whatever the case of the suffix
    raise CheckpointError(f"{path}: not a checkpoint file (expected .json or .safetensors)")


def _read_tensors(directory: Path, entry: Any, role: str, json_name: str) -> dict[str, Tensor]:
    """Reads one listed file, verifying size and sha256 on the very bytes that are then parsed. Errors name the
    files by their paths: a bare name (step_00000020.safetensors) did not say which run of an ensemble, or of
    several commands, was damaged."""
    if not isinstance(entry, dict) or not {"name", "sha256", "bytes"} <= entry.keys():
        raise CheckpointError(f"{json_name}: malformed entry for the {role} file")
    if isinstance(entry["bytes"], bool) or not isinstance(entry["bytes"], int) or not isinstance(entry["sha256"], str):
        raise CheckpointError(f"{json_name}: the {role} file's entry must give its bytes as an integer and its "
                              f"sha256 as a string, not {entry['bytes']!r} and {entry['sha256']!r}")
    name = entry["name"]
    if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
        raise CheckpointError(f"{json_name}: {role} file name {name!r} is not a plain file name")
    if _suffix(name) in PICKLE_SUFFIXES:
        raise CheckpointError(f"{directory / name}: pickle files are refused (they can run code when loaded)")
    path = directory / name
    refuse_special(path, CheckpointError, str(path))
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read {role} file ({e.strerror or e})") from None
    if len(data) != entry["bytes"]:
        raise CheckpointError(f"{path}: size {len(data)} bytes, expected {entry['bytes']} "
                              "(truncated or replaced)")
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise CheckpointError(f"{path}: sha256 mismatch (file corrupt or modified, or a write stopped between it "
                              "and its record)")
    try:
        return st_load(data)
    except Exception as e:  # safetensors raises its own error types for a bad header
        raise CheckpointError(f"{path}: not a valid safetensors file ({e})") from None


def checkpoint_record(path: Path) -> dict[str, Any]:
    """A checkpoint's JSON record (its config, vocabulary hash, what it was averaged from), its tensors unread."""
    path = Path(path)
    json_path = json_for(path)
    record = read_record(json_path, CheckpointError, f"{path.name} without its JSON record is an unfinished write, "
                         "or weights from elsewhere (an export?): not a checkpoint; the record travels with its "
                         "weights file, copy both", FORMAT, label=str(json_path))
    # a training checkpoint is named by its step, and averaging and resuming go by the name: a record copied or
    # renamed to another step's name was averaged in place of that step's, and a resume rewound to it
    named = _STEP_JSON.fullmatch(json_path.name)
    if named and record.get("step", step := int(named.group(1))) != step:
        raise CheckpointError(f"{json_path}: its record is of step {record['step']!r}, not {step} (renamed or "
                              "copied from another step's)")
    return record


def load_checkpoint(path: Path, with_state: bool = True) -> Checkpoint:
    """Loads and verifies a checkpoint given its .json or its weights .safetensors.

    Every failure is a CheckpointError naming the file at fault; nothing is returned half-loaded.
    """
    path = as_path(path, "checkpoint")
    if _suffix(path) in PICKLE_SUFFIXES:
        raise CheckpointError(f"{path}: pickle files are refused (they can run code when loaded); "
                              "convert the weights to safetensors")
    json_path = json_for(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file")
    record = checkpoint_record(path)
    files = record.get("files")
    if not isinstance(files, dict) or "weights" not in files:
        raise CheckpointError(f"{json_path}: record lists no weights file")
    weights = _read_tensors(json_path.parent, files["weights"], "weights", str(json_path))
    state = None
    if with_state and "state" in files:
        state = _read_tensors(json_path.parent, files["state"], "state", str(json_path))
    return Checkpoint(path=json_path, weights=weights, state=state, meta=record)


def load_weights(model: torch.nn.Module, weights: dict[str, Tensor], where: str) -> None:
    """``weights`` into ``model``, or a CheckpointError "WHERE: weights do not fit the config (...)" where a
    tensor is missing, unexpected or of another shape, or is no float tensor, or not finite, where the model's
    is a float one: load_state_dict casts, so integer weights loaded (a resume went on from them, its loss
    jumping) and NaNs translated to noise. Training writes none of these: such a file is foreign or rebuilt."""
    own = model.state_dict()
    if bad := next((k for k, t in weights.items() if k in own and own[k].is_floating_point()
                    and not (t.is_floating_point() and bool(torch.isfinite(t).all()))), None):
        raise CheckpointError(f"{where}: weights do not fit the config ({bad} is " + (
            "not finite" if weights[bad].is_floating_point() else f"{weights[bad].dtype}, not a float tensor")
            + "; training writes neither)")
    try:
        missing, unexpected = model.load_state_dict(weights, strict=False)
    except RuntimeError as e:  # a tensor of the wrong shape
        first = str(e).split("\n\t")[1] if "\n\t" in str(e) else str(e)
        raise CheckpointError(f"{where}: weights do not fit the config ({first})") from None
    if missing or unexpected:
        raise CheckpointError(f"{where}: weights do not fit the config (missing {missing[:3]}, unexpected "
                              f"{unexpected[:3]})")


def run_folder(run_dir: Path) -> Path:
    """``run_dir``, a folder that is there: else a CheckpointError that says so (a mistyped run folder was told
    as a run without checkpoints, or without spm.model)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: {'a file, not a run folder' if run_dir.exists() else 'no such folder'}")
    if (run_dir / "meta.json").is_file() and (run_dir / "src.ids").is_file() and not (run_dir / "config.toml").exists():
        # its spm.model was taken for a run's, and the folder told as a run without checkpoints
        raise CheckpointError(f"{run_dir}: a token store (transformer preprocess), not a run folder: give the folder "
                              "of a run trained on it (train --out)")
    return run_dir


def chosen_weights(run_dir: Path, checkpoint: str | Path | None) -> Path | None:
    """The file --checkpoint names: its path, "best" for train.keep_best's ``best.safetensors`` in the run
    folder (a CheckpointError when the run kept none), None (the average decoding takes) as None."""
    if checkpoint is None or str(checkpoint) != "best":
        return None if checkpoint is None else Path(checkpoint)
    best = Path(run_dir) / "best.safetensors"
    if not best.is_file():
        raise CheckpointError(f"{run_dir}: no best.safetensors (train.keep_best writes it at the run's evaluations, "
                              "every train.eval_every; the run had none, or was trained without it)")
    return best


def list_checkpoints(run_dir: Path) -> list[Path]:
    """The JSON records of a run's training checkpoints, oldest step first. A ``checkpoints`` that is there but
    no folder (a link to a disk not mounted, a file) is a CheckpointError: taken for none, `--resume` trained
    the run anew over its metrics and best.safetensors."""
    ckpt_dir = as_path(run_dir, "run_dir") / "checkpoints"
    if not ckpt_dir.is_dir():
        if ckpt_dir.is_symlink() or ckpt_dir.exists():
            what = "a link to nothing" if not ckpt_dir.exists() else "a file"
            raise CheckpointError(f"{ckpt_dir}: {what}, not a folder of checkpoints (a link to a disk that is not "
                                  "mounted?)")
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := _STEP_JSON.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


def of_another_run(run_dir: Path, meta: dict[str, Any]) -> bool:
    """Whether a weights file's record (``meta``, of --checkpoint's file) is of another run than ``run_dir``'s
    checkpoints, by its run_id (`average` keeps it): its model is decoded from its own record, and the run folder's
    summary and averaging are not its own. A record or a run without one (before run ids, 2026-12-05; a run of no
    checkpoints) is taken for the run's."""
    theirs = meta.get("run_id")
    try:
        records = list_checkpoints(run_dir) if isinstance(theirs, str) else []
        ours = checkpoint_record(records[-1]).get("run_id") if records else None
    except CheckpointError:  # the run's own errors are its decoding's to say
        return False
    return isinstance(ours, str) and ours != theirs


def one_run(records: list[Path]) -> None:
    """Refuses checkpoint records of more than one run (their run_id): one run folder's checkpoints are one run's
    (a resume keeps its run_id), so another is a file copied in, which averaging took for a model change and a
    resume for a config change. A record that cannot be read, or of before run ids, is not compared here."""
    runs: dict[str, list[str]] = {}
    for path in records:
        try:
            run = checkpoint_record(path).get("run_id")
        except CheckpointError:
            continue
        if isinstance(run, str):
            runs.setdefault(run, []).append(path.stem)
    if len(runs) > 1:
        listed = "; ".join(f"{', '.join(names)} (run {run[:8]})" for run, names in runs.items())
        raise CheckpointMismatch(f"{records[0].parent}: checkpoints of {len(runs)} runs: {listed}. Another run's "
                                 "checkpoint copied in? Remove the files that are not this run's")


def record_step(record: Path) -> int:
    """The step a checkpoint record's name gives (``list_checkpoints``'s step_00001000.json: 1000)."""
    return int(_STEP_JSON.fullmatch(record.name).group(1))


def weights_step(record: dict[str, Any]) -> Any:
    """The update a weights file's record is of: a training checkpoint's step, best.safetensors' best step;
    None for a file `average` wrote (its record names the checkpoints it is the mean of)."""
    return record.get("step", (record.get("best") or {}).get("step"))


def epochs_into(state: dict[str, Any]) -> float:
    """How far into training a checkpoint's train_state is, in epochs (fractional mid-epoch)."""
    return state["epoch"] + state["batch_in_epoch"] / max(state["epoch_batches"], 1)


def checkpoints_to_average(run_dir: Path, n: int, found: list[Path] | None = None) -> list[Path]:
    """The records of the last ``n`` checkpoints on the run's save clock, oldest first (§6.1 averages
    the last checkpoints "written at 10-minute intervals").

    A checkpoint less than half a save interval (train.save_every steps or epochs, else train.save_minutes)
    older than a newer one that is kept is left out: the one written at the end of the budget or on
    a signal, just after a checkpoint of the clock, would otherwise count twice the same weights. The
    newer takes the older's place, so the averaged weights keep their spacing and the newest updates.
    A checkpoint written off the clock (its record's ``on_clock`` false) that is not the newest is left out:
    it was written on a signal for the run to resume from, and an uninterrupted run never had it. The
    checkpoints are those of the newest's model (``_computed``): a run resumed with a model change
    (--allow-config-change) averages those since the change, fewer until ``n`` are written (the weights of
    before compute another function; averaged in, decoding was refused until then).
    ``found``: the records to choose from (default: all of the run's).
    """
    check_count(n, "how many checkpoints to average", 1)  # 0 averaged every checkpoint, silently
    kept: list[Path] = []
    newer: dict[str, Any] | None = None
    model: dict[str, Any] | None = None
    found = list_checkpoints(run_dir) if found is None else found
    one_run(found)
    for path in reversed(found):
        try:
            record = checkpoint_record(path)  # an object of this format, else a CheckpointError naming it
            record_config(record, path)
            if kept and record.get("on_clock") is False:  # a signal's checkpoint, superseded: a resume point only
                continue
            if isinstance((record.get("config") or {}).get("model"), dict):
                if model is None:
                    model = _computed(record, path.name)
                elif _computed(record, path.name) != model:  # before a model change: not this model's
                    break
            train, state = record.get("config", {}).get("train", {}), record.get("train_state")
            if state is not None and (bad := _not_a_count(state)):  # named here: the next record compares with it
                raise CheckpointError(f"{path}: unreadable checkpoint record (train_state.{bad} is "
                                      f"{state.get(bad)!r}, not a number)")
            if newer is not None and state is not None and train:
                if train["save_every"] and train.get("interval_unit") == "epochs":
                    gap, interval = epochs_into(newer) - epochs_into(state), train["save_every"]
                elif train["save_every"]:
                    gap, interval = newer["step"] - state["step"], train["save_every"]
                else:
                    gap, interval = (newer["elapsed_s"] - state["elapsed_s"]) / 60, train["save_minutes"]
                if gap < interval / 2:
                    continue
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # a field of another shape
            raise CheckpointError(f"{path}: unreadable checkpoint record ({type(e).__name__}: {e})") from None
        kept.append(path)
        newer = state
        if len(kept) == n:
            break
    return kept[::-1]


def average_last(run_dir: Path, n: int, tries: int = 3) -> tuple[list[Path], dict[str, Tensor]]:
    """The records ``checkpoints_to_average`` chooses and their average (``average_checkpoints``; none: {}),
    chosen again where a run still training pruned one of them between the listing and its reading: `average`
    of a live run failed now and then ("no such file", or "without its JSON record"). An error of files that
    are all still there is theirs, raised at once."""
    for _ in range(tries - 1):
        paths: list[Path] = []
        try:
            paths = checkpoints_to_average(run_dir, n)
            return paths, average_checkpoints(paths) if paths else {}
        except CheckpointMismatch:  # each intact: not a race
            raise
        except CheckpointError:
            if paths and all(p.exists() and p.with_suffix(".safetensors").exists() for p in paths):
                raise
    paths = checkpoints_to_average(run_dir, n)
    return paths, average_checkpoints(paths) if paths else {}


def _not_a_count(state: dict[str, Any]) -> str | None:
    """The first of a record's train_state fields that ``checkpoints_to_average`` computes with that is not a
    number (step and elapsed_s always; the epoch's, where given); None when all are."""
    for key in ("step", "elapsed_s", "epoch", "batch_in_epoch", "epoch_batches"):
        value = state.get(key, 0 if key not in ("step", "elapsed_s") else None)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return key
    return None


def latest_checkpoint(run_dir: Path, warn: Callable[[str], None] = print,
                      refuses: Callable[[Checkpoint], str | None] = lambda ckpt: None) -> Checkpoint | None:
    """The newest checkpoint that verifies and holds a training state to resume from; each refused newer
    one is reported through warn() (a model file without the optimizer's state, `average`'s, say).
    ``refuses``: why a checkpoint that verifies still cannot be resumed from (its record's fields: the
    sha256 sums cover the tensors, not the record), or None."""
    for path in reversed(list_checkpoints(run_dir)):
        try:
            ckpt = load_checkpoint(path)
        except CheckpointError as e:
            warn(f"skipping {e}")
            continue
        if ckpt.state is not None and (why := refuses(ckpt)) is not None:
            warn(f"skipping {path.name}: {why}")
            continue
        if ckpt.state is not None:  # save_checkpoint's optimizer state: write_model writes none
            return ckpt
        warn(f"skipping {path.name}: weights without the training state (a model file, not a training checkpoint)")
    return None


def same_model(a: Path, b: Path) -> bool:
    """Whether two checkpoints' records are of one model (``_computed``): what ``checkpoints_to_average`` stops
    at, for saying why it chose fewer."""
    return _computed(checkpoint_record(a), a.name) == _computed(checkpoint_record(b), b.name)


def _computed(meta: dict[str, Any], name: str) -> dict[str, Any]:
    """A checkpoint's model config less its dropout rates, which shape training alone: checkpoints of one run
    resumed with other dropout (--allow-config-change) compute the same function of their weights."""
    model = meta.get("config", {}).get("model") if isinstance(meta.get("config"), dict) else None
    if not isinstance(model, dict):  # a record edited by hand: the model its weights are for is unknown
        raise CheckpointError(f"{name}: the record holds no model config (every record "
                              "training writes has one), so the model its weights are for is unknown")
    # sinusoids have no weights: their table's length bounds the decoding's length alone (max_len_offset)
    ignored = ("p_drop", "p_drop_attn", "p_drop_relu") + (("max_positions",) if model.get("positional") !=
                                                           "learned" else ())
    return {k: v for k, v in model.items() if k not in ignored}


def record_config(meta: dict[str, Any], record: Path) -> Config:
    """The config a checkpoint's record holds, refused (a CheckpointError naming the record) where it holds none,
    a value of the wrong type or out of range, or a model section edited by hand (its model_hash another's): the
    weights would compute another function. Decoding and averaging read a record alike: `average` took an
    edited one that `translate` refused, and wrote weights nothing could load."""
    where = f"{record}: its config"  # the record's own values: an error in them is the file's
    if "config" not in meta:  # a record edited or written by hand: the model's shape is nowhere else
        raise CheckpointError(f"{record}: the record holds no config (every record training writes has one), so "
                              "the model its weights are for is unknown")
    try:
        cfg = config_from_dict(meta["config"], where)
    except ConfigError as e:
        raise CheckpointError(str(e)) from None
    if edited_model(meta, cfg):
        raise CheckpointError(f"{record}: its model config (hash {cfg.model_hash()}) is not the one its weights were "
                              f"trained as (model_hash {meta['model_hash']}): the record was edited, and the weights "
                              "would compute another function; use the record training wrote")
    try:
        cfg.validate()
    except ConfigError as e:
        raise CheckpointError(f"{where}: {e}") from None
    return cfg


def average_checkpoints(paths: list[Path]) -> dict[str, Tensor]:
    """§6.1: the uniform mean of the checkpoints' weights (A12), accumulated in float64.

    Each tensor is cast back to its own dtype. Non-float tensors are not averaged: they must be
    equal in every file. Files must agree on keys, shapes, vocabulary and the model config (its dropout rates
    aside: ``_computed``), and be of one run (its record's run_id, where both have one): another run's checkpoint
    of the same vocabulary and model, copied into checkpoints/, was averaged in without a word.
    """
    if isinstance(paths, (str, Path)):  # one file, read a character a file
        raise ConfigError(f"paths: a list of checkpoint files, not one ({str(paths)!r}): put it in a list")
    check_sequence(paths, "paths", "a list of checkpoint files")
    if not paths:
        raise ConfigError("paths: no checkpoint to average")
    first = load_checkpoint(paths[0], with_state=False)
    acc = {k: t.double() if t.is_floating_point() else t for k, t in first.weights.items()}
    dtypes = {k: t.dtype for k, t in first.weights.items()}
    model = _computed(first.meta, str(first.path))
    for path in paths[1:]:
        ckpt = load_checkpoint(path, with_state=False)
        name = ckpt.path  # whole: files of one name in two runs' folders were told apart by none
        if ckpt.meta.get("vocab_sha256") != first.meta.get("vocab_sha256"):
            raise CheckpointMismatch(f"{name}: trained with another vocabulary than {first.path}")
        runs = (first.meta.get("run_id"), ckpt.meta.get("run_id"))
        if None not in runs and runs[0] != runs[1]:  # the records of before run ids (2026-12-05) have none
            raise CheckpointMismatch(f"{name}: a checkpoint of another run than {first.path}'s (another run_id in "
                                  "its record: copied into this run's checkpoints?): average the checkpoints of one "
                                  "run")
        theirs = _computed(ckpt.meta, str(name))
        if differ := [f"model.{k}: {model.get(k)!r} in {first.path.name}, {theirs.get(k)!r} here"
                      for k in sorted(model.keys() | theirs.keys()) if model.get(k) != theirs.get(k)]:
            raise CheckpointMismatch(f"{name}: a model that computes otherwise than {first.path}'s "
                                  f"({'; '.join(differ)}), changed on a resume with --allow-config-change: average "
                                  "the checkpoints of one setting (fewer of the last), or give one --checkpoint")
        extra, missing = ckpt.weights.keys() - acc.keys(), acc.keys() - ckpt.weights.keys()
        if extra or missing:
            key, what = (min(extra), "unexpected") if extra else (min(missing), "missing")
            raise CheckpointError(f"{name}: {what} key {key!r} (compared with {first.path})")
        for k, t in ckpt.weights.items():
            if t.shape != acc[k].shape or t.dtype != dtypes[k]:
                raise CheckpointError(f"{name}: key {k!r} is {t.dtype} {list(t.shape)}, "
                                      f"expected {dtypes[k]} {list(acc[k].shape)}")
            if t.is_floating_point():
                acc[k] += t.double()
            elif not torch.equal(t, acc[k]):
                raise CheckpointError(f"{name}: non-float key {k!r} differs between checkpoints")
    n = len(paths)
    return {k: (a / n).to(dtypes[k]) if a.is_floating_point() else a for k, a in acc.items()}
