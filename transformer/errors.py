"""The one base of the errors a user can cause: the command line catches it and prints one line."""

import contextlib
import os
import re
import signal
import threading
from collections.abc import Iterator
from typing import Any


class UserError(Exception):
    """A problem in what the user asked for or gave (a config, a data file, a run folder, a model file):
    the message is one line naming the file, line or field; `transformer` prints "LABEL: message" and
    exits with ``exit_code``, never a traceback."""

    exit_code = 1
    label = "error"
    said = True  # False: another process of the job says it (rank 0 of a data-parallel job), not this one


class OutOfMemory(UserError):
    """An allocation the machine could not make, caused by the size of what the user gave (a very long line)."""


def install_extra(extra: str) -> str:
    """How to install one of the package's optional extras: its requirements as the installed package's metadata
    lists them (a wheel's user has no checkout), else the checkout's editable install. No index holds the package
    under its name: `pip install 'transformer[...]'` would fail, or find another's."""
    from importlib import metadata

    try:
        marker = f'extra == "{extra}"'
        wanted = [r.split(";")[0].strip() for r in metadata.requires("transformer") or [] if marker in r]
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        wanted = []
    if wanted:
        return f"pip install {' '.join(repr(r) for r in wanted)} (the [{extra}] extra)"
    return f"pip install -e '.[{extra}]' in the project's checkout"


def job_world() -> int:
    """The processes of the job this one is a rank of (torchrun's WORLD_SIZE), 1 when unset or no whole number:
    for the command line's error handlers, which must not fail on it (distributed.job_environment refuses it).
    Here, not in distributed.py: that module imports torch, which a handler of Ctrl-C must not wait for."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def first_line(error: BaseException, limit: int = 200) -> str:
    """The first line of ``error``'s message, cut to ``limit`` characters: torch's C++ errors run to pages."""
    message = next(iter(str(error).strip().splitlines()), "")
    return message if len(message) <= limit else message[:limit - 1] + "…"


def summary(error: BaseException) -> str:
    """``error`` in the one line `transformer` names it by: "LABEL: message" for a user's error,
    "internal error: TYPE: its first line" for any other (a bug)."""
    if isinstance(error, UserError):
        return f"{error.label}: {error}"
    return f"internal error: {type(error).__name__}: {first_line(error)}"


class Terminated(BaseException):
    """SIGTERM while a command runs, outside training's own handling of it (``train.StopSignals``): raised in the
    main thread as Ctrl-C raises KeyboardInterrupt, so that an output being written is removed as it is then
    (``files.atomic_path``) and `transformer` says so in one line and exits 143 (128 + SIGTERM). SIGTERM's default
    ended the process at once, silently, leaving the temporary file of that output behind. A BaseException, as
    KeyboardInterrupt is: no ``except Exception`` takes it for an error of the work it stops."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:  # or SIGHUP, the terminal closed under a command
        super().__init__(signum)
        self.signum = signum

    # The stop signal (SIGTERM, or SIGINT's KeyboardInterrupt) raised last in ``cli.sigterm_raises``'s block: raised
    # from a signal handler, the exception can be lost where the handler ran in Python code called back by C code
    # that clears any error (as during `import torch`), and the command then went on, a rank of `train --nproc`
    # training on with its launcher waiting for it; training's ``StopSignals`` takes the signal as its own.
    signalled: int | None = None


STOPS = {signal.SIGINT, signal.SIGTERM, *([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])}


@contextlib.contextmanager
def stops_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP taken in the block but acted on after it, each by the handler it had (raised
    again once the block is done): a stop raised inside an extension's callback, as during torch._dynamo's first
    import (which imports triton, whose bindings turn it into a C++ exception), aborted the process ("terminate
    called after throwing an instance of 'nanobind::python_error'", exit 134) or was lost; a stdout write it cut
    left half a line. A thread's signal mask held them from that thread alone: another thread took them, and
    Python ran the handler in the main thread all the same. Only the main thread sets handlers; elsewhere, and
    for a signal ignored, nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    taken: list[int] = []
    previous: dict[int, Any] = {}
    try:  # a stop between two swaps, its handler not yet swapped, raises: the ones swapped are put back below
        for signum in STOPS:
            if (handler := signal.getsignal(signum)) not in (signal.SIG_IGN, None):
                previous[signum] = handler  # first: put back, it is the same handler again
                signal.signal(signum, lambda signum, frame: taken.append(signum))
        yield
    finally:
        raised = _put_back(previous)
        if raised is not None:
            raise raised
        for signum in dict.fromkeys(taken):  # each by its own handler now: KeyboardInterrupt, Terminated, the default
            signal.raise_signal(signum)


def _put_back(handlers: dict[int, Any]) -> BaseException | None:
    """Sets ``handlers`` again, all of them: a stop whose handler is back may raise between two (Ctrl-C's
    KeyboardInterrupt), and that left the others swapped for good, SIGTERM recorded and never acted on. The
    first such exception is returned, to be raised once every handler is back."""
    raised: BaseException | None = None
    while True:
        try:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            return raised
        except BaseException as e:  # a stop's own exception, raised by the caller once all are back
            raised = raised or e


def out_of_memory(error: BaseException) -> str | None:
    """What ``error`` failed to allocate ("4,000,016,000,016 bytes at once", or "" where it does not say) if
    it is an allocation the machine could not make, else None: Python's MemoryError, torch's OutOfMemoryError
    (a GPU's) or the RuntimeError torch's CPU allocator raises, which has no type of its own. Not a bug but a
    size: a 1 MB input line asks attention for terabytes at once."""
    if not (isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError"
            or isinstance(error, RuntimeError) and "can't allocate memory" in str(error)):
        return None
    asked = re.search(r"allocate (\d+) bytes", str(error))  # CPU: "you tried to allocate N bytes"
    return f"{int(asked.group(1)):,} bytes at once" if asked else ""
