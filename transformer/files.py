"""Files that are never half-written: the one way this package creates a file a user keeps.

A file is written under a temporary name beside its final one, flushed to disk, given the mode
the user's umask allows (0644 under the usual 022: another account may read a run it serves), and
renamed over the final name, which is atomic; the rename is made durable by an fsync of the
folder. A crash or an error at any point leaves the old file or none, never part of a new one,
and no temporary file behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


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


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path to write ``path``'s content to; when the block ends without an error the
    file there becomes ``path`` (see the module's docstring), otherwise it is removed."""
    path = Path(path)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp's 0600 would keep every other account out
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_bytes(path: Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in blocks (checkpoints and downloads are verified by it)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()
