"""Files that are never half-written: the one way this package creates a file a user keeps.

A file is written under a temporary name beside its final one, flushed to disk, given the mode
the user's umask allows (0644 under the usual 022: another account may read a run it serves), and
renamed over the final name, which is atomic; the rename is made durable by an fsync of the
folder. A crash or an error at any point leaves the old file or none, never part of a new one,
and no temporary file behind; one a killed process left (``.NAME.XXXXXXXX.tmp``, a file or a folder:
``staging``) goes at a later write of that name, once an hour old (a folder: once no live writer holds it). A link to
something is followed (its target is replaced, the link stays; a dangling link is replaced as a file would
be), and a path that names no regular file (a pipe, a terminal,
/dev/null) is written in place, as a stream.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import http.client
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import IO, Any
from pathlib import Path

from tqdm import tqdm

from .errors import UserError, stops_held

try:
    import fcntl
except ImportError:  # Windows: no flock, and what a killed writer left stays
    fcntl = None  # type: ignore[assignment]


def umask() -> int:
    """The process's umask, read without changing it (Linux's /proc), else by setting it back at once."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        status = Path("/proc/self/status").read_text().splitlines()
        return int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fsync_dir(directory: Path) -> None:
    """Makes a rename durable: os.replace is atomic, but only the folder's fsync persists it."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def share(path: Path) -> None:
    """Gives ``path`` the mode the umask allows, as a file created by open(): mkstemp's 0600 (and that of
    writers that create through their own temporary file, as safetensors') would keep every other account out."""
    os.chmod(path, 0o666 & ~umask())


class OutputError(UserError):
    """An output path the command could not write: refused before the work that would fill it."""


# the user's to fix, not a bug (EFBIG: a size limit, ulimit -f, FAT32; EPERM: an immutable file, another user's)
UNWRITABLE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EFBIG, errno.EPERM})


class WriteError(OutputError, OSError):
    """A file the system would not take (disk or quota full, read-only, not permitted), named in one line. An
    OSError still, so a caller that can say more catches it as any failed write (training: the earlier
    checkpoints are intact)."""

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


def _unwritable(path: Path, error: OSError) -> WriteError | None:
    """``error``, met writing ``path``, as a WriteError naming it when the user can fix it (UNWRITABLE)."""
    return WriteError(error.errno, error.strerror, str(path)) if error.errno in UNWRITABLE else None


def os_error_in(error: BaseException, path: Path | None = None) -> OSError | None:
    """The OSError that safetensors' own error type reports in its text ("... (os error 28)"), naming ``path``;
    None for any other error."""
    code = re.search(r"os error (\d+)", str(error)) if type(error).__name__ == "SafetensorError" else None
    return None if code is None else OSError(int(code[1]), os.strerror(int(code[1])), *([str(path)] if path else []))


def staged_write_error(error: BaseException, staged: Path, out: Path) -> WriteError | None:
    """A failed write into a folder being staged beside ``out`` (an export, a token store), as a WriteError
    naming ``out``: a full disk or quota whatever the file the error names (shutil names the source it copied
    from), the system's refusal of a file in the staged folder, and safetensors' own error type, which holds
    the OS error in its text; None for any other error."""
    error = os_error_in(error) or error
    if not isinstance(error, OSError) or isinstance(error, WriteError) or error.errno not in UNWRITABLE:
        return None
    named = [Path(os.fsdecode(n)) for n in (error.filename, error.filename2) if n is not None]
    if error.errno in (errno.ENOSPC, errno.EDQUOT) or not named or any(staged in (n, *n.parents) for n in named):
        return WriteError(error.errno, error.strerror, str(out))
    return None


def is_stream(path: Path) -> bool:
    """Whether ``path`` names something there that is no regular file, links followed: a pipe, a terminal,
    /dev/null; or one of this process's descriptors (/dev/stdout, whatever a shell redirected it to).
    Written in place, as a stream: a file put in its place would cut the reader (or the shell) off."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # not there (or not to be looked at): a file to write
        return False
    return not stat.S_ISDIR(mode) and (not stat.S_ISREG(mode) or descriptor(path) is not None)


_DESCRIPTOR = re.compile(r"/dev/std(?P<std>in|out|err)|/dev/fd/(?P<fd>\d+)|/proc/(?P<pid>\w[\w-]*)/fd/(?P<proc>\d+)")


def descriptor(path: Path) -> int | None:
    """The number of this process's open descriptor that ``path`` names (/dev/stdout, /dev/fd/3,
    /proc/self/fd/1, or a link to one), None for any other path: opened by name, a regular file behind it
    would be opened again, from its start, and not where the shell's own writes to it go on."""
    name = os.path.abspath(path)
    for _ in range(40):  # the kernel's bound on links followed
        match = _DESCRIPTOR.fullmatch(name)
        if match and match["pid"] in (None, "self", "thread-self", str(os.getpid())):
            std, fd, proc = match.group("std", "fd", "proc")
            return ("in", "out", "err").index(std) if std else int(fd or proc)
        try:
            target = os.readlink(name)
        except OSError:  # no link (or none to read): the path names a file of its own
            return None
        name = os.path.normpath(os.path.join(os.path.dirname(name), target))
    return None


STALE_S = 3600.0  # a staging entry younger than this is never taken for a killed writer's: no write takes an hour


def _locked(fd: int) -> bool:
    """Whether an exclusive lock on the open folder ``fd`` was taken, without waiting. The lock ends with its
    process; a file system without such locks (NFS, for a folder opened to read) takes none."""
    if fcntl is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held, or not to be had: not known to be free
        return False
    return True


def clear_stale(folder: Path, name: str) -> list[Path]:
    """Removes what killed writers of ``name`` left in ``folder`` (``staging``'s names), a model's size each time
    of a big export: a file over ``STALE_S`` old (its writer's library may have renamed its own over it, so it
    holds no lock), a folder over ``STALE_S`` old that no live writer holds (``staging``'s lock; where the file
    system takes none, it stays). Returns what went."""
    pattern = re.compile(rf"\.{re.escape(name)}\.[a-z0-9_]{{8}}\.tmp")  # mkstemp's and mkdtemp's names
    try:
        entries = [e for e in os.scandir(folder) if pattern.fullmatch(e.name)]
    except OSError:
        return []
    removed = []
    for entry in entries:
        path = Path(entry.path)
        try:
            found = entry.stat(follow_symlinks=False)
            if time.time() - found.st_mtime < STALE_S:
                continue
            if stat.S_ISREG(found.st_mode):
                path.unlink()
            elif stat.S_ISDIR(found.st_mode) and fcntl is not None:  # a link, a pipe: no staging of ours
                fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
                try:
                    if not _locked(fd):
                        continue
                    shutil.rmtree(path, ignore_errors=True)
                finally:
                    os.close(fd)
            else:
                continue
        except OSError:  # gone meanwhile, or another user's to remove
            continue
        if not path.exists():
            removed.append(path)
    return removed


@contextlib.contextmanager
def staging(folder: Path, name: str, directory: bool = False) -> Iterator[Path]:
    """A new temporary file (``directory``: folder) in ``folder`` to write ``name`` under, ``.NAME.XXXXXXXX.tmp``;
    what killed writers of ``name`` left goes first (``clear_stale``). A folder is locked while the block runs,
    where the file system takes the lock. The block renames it into place; what is still there when the block
    ends (it failed) is removed. An OSError of the block's making is the caller's to say."""
    clear_stale(folder, name)
    if not directory:
        fd, path = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
        os.close(fd)  # open, it could not be renamed on Windows
        try:
            yield Path(path)
        finally:
            with contextlib.suppress(OSError):  # an error of its own would hide the block's
                os.unlink(path)
        return
    path = tempfile.mkdtemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    fd = None
    if fcntl is not None:
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            _locked(fd)
    try:
        yield Path(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)  # before the lock goes: no clear_stale takes it meanwhile
        if fd is not None:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path to write ``path``'s content to; when the block ends without an error the
    file there becomes ``path`` (see the module's docstring), otherwise it is removed. A failed write
    the user can fix (UNWRITABLE) is a WriteError naming ``path``. A stream (``is_stream``) is written in
    place, and a link's target is replaced, not the link (a dangling link is replaced itself)."""
    path = Path(path)
    if is_stream(path):
        if (fd := descriptor(path)) is None or not stat.S_ISREG(os.fstat(fd).st_mode):  # a pipe, a terminal
            yield path
            return
        # the file a shell redirected a descriptor to (`>> job.log`): written whole, once done, at that
        # descriptor's own offset, between what the shell wrote there before and writes after
        with tempfile.TemporaryDirectory(prefix="transformer-") as folder:
            tmp = Path(folder) / path.name
            yield tmp
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(OSError, ValueError):  # closed, or no file: nothing of ours held
                    stream.flush()
            with open(tmp, "rb") as src, open(os.dup(fd), "wb") as out:
                shutil.copyfileobj(src, out)
        return
    if path.is_symlink() and path.exists():  # a dangling link is replaced as a file would be
        path = path.resolve()
    with contextlib.ExitStack() as held:
        try:
            tmp = held.enter_context(staging(path.parent, path.name))
        except OSError as e:
            # a folder that exists and takes no new file (/proc says ENOENT) is the user's to fix, whatever the errno
            if told := _unwritable(path, e) or (path.parent.is_dir() and WriteError(e.errno, e.strerror, str(path))):
                raise told from None
            raise
        try:
            yield tmp
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            try:  # a file written over keeps its mode, as `>` keeps it (a private one was made readable to all);
                mode = stat.S_IMODE(os.stat(path).st_mode)  # set once written: a read-only one's stays writable so far
            except OSError:  # none there (a link to nothing, a loop: replaced as a file)
                mode = None
            os.chmod(tmp, mode) if mode is not None else share(tmp)
            os.replace(tmp, path)
        except BaseException as e:
            mine = isinstance(e, OSError) and (e.filename is None or Path(e.filename) == tmp)  # not an input's, say
            if mine and (told := _unwritable(path, e)):
                raise told from None
            raise
    fsync_dir(path.parent)


@contextlib.contextmanager
def atomic_paths(*paths: Path) -> Iterator[list[Path]]:
    """``atomic_path`` for files that belong together (a model's weights and the record that vouches for them):
    each is written to its temporary path, and none takes its name before all are written, then in the order
    given, a stop signal held until all have; a write that fails (a full disk) leaves the old set whole. An error
    of the block's own that names a temporary path is said naming its file."""
    with contextlib.ExitStack() as stack:  # left last in, first out: paths[0] takes its name first
        yield [stack.enter_context(atomic_path(path)) for path in reversed(paths)][::-1]
        # the names taken with no stop between two (acted on after): a Ctrl-C or SIGTERM after the first left the
        # new weights beside the old record, neither set loadable
        with stops_held():
            stack.close()


def write_bytes(path: Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def append_text(path: Path, text: str) -> None:
    """Adds ``text`` at the end of ``path`` (a log: not atomic, a line at a time); a failed write the user can fix
    (UNWRITABLE) is a WriteError naming ``path``."""
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        if told := _unwritable(path, e):
            raise told from None
        if e.errno == errno.ENOENT and not Path(path).parent.is_dir():  # a run folder renamed while it trains
            raise WriteError(e.errno, f"its folder {Path(path).parent} is gone (moved or removed while in use)",
                             str(path)) from None
        raise


def hold_folder(folder: Path, option: str) -> IO[str]:
    """An exclusive lock on ``folder`` (its file ".lock", created with the folder), held until the returned
    file is closed: a second process that would write the same folder (two trainings started into one
    run folder) is refused at once, with the holder's pid, instead of interleaving their checkpoints and
    logs. The lock is the kernel's (flock): it ends with its process, however that ends (none on Windows)."""
    import socket

    folder.mkdir(parents=True, exist_ok=True)
    f = open(folder / ".lock", "a+", encoding="utf-8")
    try:
        if fcntl is not None:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise OutputError(f"{option} {folder}: {holder} is writing this folder; wait for it to end, or choose "
                          f"another {option}") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    f.flush()
    return f


def check_output(path: Path, option: str, suffixes: tuple[str, ...] = (), folder: bool = False,
                 replaced: bool = False) -> Path:
    """``path`` checked before a command starts the work whose result goes there, so that nothing
    finished is lost to a path that cannot be written: its folder exists and is writable, the path is
    not a folder (a file is asked for; ``folder``: a folder is, existing or not), and its suffix is one
    of ``suffixes`` when given. ``replaced``: the folder is written beside itself and renamed into place
    (an export, a token store), so an existing one's parent must take files too. OutputError names
    ``option`` and the path otherwise."""
    path = Path(path)
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OutputError(f"{option} {path}: a loop of symbolic links, which leads to no file; remove it or give "
                              "another name") from None
    if not folder and is_stream(path):  # a pipe, a terminal, /dev/null: written in place, as it is
        if not os.access(path, os.W_OK):
            raise OutputError(f"{option} {path}: not writable")
        return path
    parent = path.parent
    if folder:  # made with its missing parents: the nearest folder that exists must take it
        parent = next(p for p in (path, *path.parents) if p.exists()) if not path.is_dir() else path
        if not parent.is_dir():
            raise OutputError(f"{option} {path}: {parent} is a file; give a folder")
    if not parent.is_dir():
        raise OutputError(f"{option} {path}: {parent} is a file, not a folder" if parent.exists() else
                          f"{option} {path}: the folder {parent} does not exist")
    # a folder that exists and is replaced from beside it: its parent takes the new one before the rename
    for folder_in in (parent, path.parent) if replaced and path.is_dir() else (parent,):
        if not os.access(folder_in, os.W_OK | os.X_OK):
            raise OutputError(f"{option} {path}: the folder {folder_in} is not writable")
        try:  # os.access answers for the mode bits alone: a folder may still take no file (/proc, /sys, as root)
            fd, probe = tempfile.mkstemp(dir=folder_in, prefix=".probe.", suffix=".tmp")
        except OSError as e:
            raise OutputError(f"{option} {path}: the folder {folder_in} takes no new file ({e.strerror})") from None
        os.close(fd)
        os.unlink(probe)
    if not folder and path.is_dir():
        raise OutputError(f"{option} {path}: is a folder; give a file name")
    if not folder and path.exists() and not os.access(path, os.W_OK):
        raise OutputError(f"{option} {path}: the file is not writable")
    if suffixes and not path.name.lower().endswith(suffixes):
        raise OutputError(f"{option} {path}: give a {' or '.join(suffixes)} file")
    return path


def not_replaceable(folder: Path, marker: str, names: set[str] | None = None) -> str | None:
    """Why a command's new output may not replace the non-empty ``folder`` (export's and preprocess's
    --overwrite), or None when it may: only an earlier output of the command is replaced, a folder of
    files holding ``marker``, which the command writes, and (``names`` given) no file of another name. A run
    folder, a folder of runs, the run's checkpoints or a corpus named by mistake would be deleted whole, and
    files a user put beside an earlier output with it."""
    if folders := sorted(p.name for p in Path(folder).iterdir() if p.is_dir()):
        return f"it holds folders ({', '.join(folders[:3])}{', ...' if len(folders) > 3 else ''}), as no output of this command does"
    if not (Path(folder) / marker).is_file():
        return f"it has no {marker}, which every output of this command has"
    if names is not None and (others := sorted(p.name for p in Path(folder).iterdir() if p.name not in names)):
        return f"it holds {', '.join(others[:3])}{', ...' if len(others) > 3 else ''}, which this command does not write"
    return None


class DownloadError(UserError):
    """A download that failed or is not the file expected; nothing of it was kept."""


def download(url: str, path: Path, sha256: str | None = None) -> str:
    """``url`` to ``path``, written atomically with a progress bar; returns the file's sha256. A failed
    or short read (fewer bytes than the Content-Length said) or, with ``sha256``, other bytes than
    expected keep nothing and raise DownloadError naming the url and what went wrong."""
    received, expected = 0, None
    digest = hashlib.sha256()
    try:
        with atomic_path(path) as part:
            with urllib.request.urlopen(url, timeout=60) as response, open(part, "wb") as out:
                expected = int(response.headers.get("Content-Length") or 0) or None
                with tqdm(total=expected, unit="B", unit_scale=True, desc=path.name, disable=None) as bar:
                    while block := response.read(1 << 20):
                        out.write(block)
                        digest.update(block)
                        received += len(block)
                        bar.update(len(block))
            if expected is not None and received != expected:
                raise DownloadError(f"{url}: download cut short: received {received} bytes of {expected} "
                                    "(Content-Length)")
            if sha256 is not None and digest.hexdigest() != sha256:
                raise DownloadError(f"{url}: the download has sha256 {digest.hexdigest()}, expected {sha256}; "
                                    "discarded it")
    except (OSError, http.client.HTTPException, ValueError) as e:  # URLError, HTTPError, timeouts, IncompleteRead,
        # disk full; ValueError: a URL that is none ("http://[::1"), a Content-Length that is no number
        reason = " ".join(str(getattr(e, "reason", None) or e).split()) or type(e).__name__
        if isinstance(e, urllib.error.HTTPError):
            reason = f"HTTP {e.code} {reason}"
        raise DownloadError(f"{url}: download failed after {received} bytes of {expected or 'an unknown size'} "
                            f"({reason})") from None
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in blocks (the hashes a checkpoint's and the vocabulary's records hold;
    a checkpoint is verified on the bytes it loads, a download as it arrives)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def refuse_special(path: Path, error: type[UserError], label: str) -> None:
    """``error`` for a ``path`` that is neither a file nor a folder (a named pipe, a device), as a checkpoint's file
    given: reading it waited for a writer for good, or never ended."""
    with contextlib.suppress(OSError):  # not there, or not to be looked at: the read says why
        if not stat.S_ISREG(mode := os.stat(path).st_mode) and not stat.S_ISDIR(mode):
            raise error(f"{label}: not a regular file (a named pipe or a device)")


def read_record(path: Path, error: type[UserError], missing: str, fmt: str,
                label: str | None = None) -> dict[str, Any]:
    """The JSON object in ``path`` (a checkpoint record, a token store's meta), with
    ``error`` naming the file when it is missing (``missing`` says what that means and what to do), unreadable,
    not an object, or a record of another format than ``fmt``: a foreign file is refused, never half-read.
    Errors start with ``label`` (default: the path); a missing file's with the path, where it was looked for."""
    label = label or str(path)
    refuse_special(path, error, label)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(f"{path}: missing ({missing})") from None
    # ValueError: JSON's own, and an integer of more digits than Python converts; RecursionError: arrays nested
    # deeper than the parser goes (a hostile record was an internal error, and stopped --resume for good)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise error(f"{label}: unreadable ({str(e)[:200]})") from None
    if not isinstance(record, dict):
        raise error(f"{label}: not a JSON object but {type(record).__name__}")
    if record.get("format") != fmt:
        raise error(f"{label}: not a {fmt} record (format: {record.get('format')!r})")
    return record


BOARD = "tb"  # a run's folder of TensorBoard event files (train.Board)


def kept_by_training(folder: Path) -> bool:
    """Whether ``folder`` is one of a run's folders of weights that training keeps: checkpoints/, or a
    set_aside_* folder a resume moved an earlier training's files into (``train.prepare_run``)."""
    return folder.name == "checkpoints" or folder.name.startswith("set_aside_")
