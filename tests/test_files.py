"""Atomic writes: whole files or none, readable by others as the umask allows; JSON records read whole or refused."""

import errno
import os
import stat
from pathlib import Path

import pytest

from transformer.checkpoint import list_checkpoints
from transformer.config import load_config
from transformer.errors import UserError
from transformer.cli import main
from transformer.files import atomic_path, read_record, umask, write_bytes, write_text
from transformer.train import train


@pytest.fixture
def mask():
    def set_mask(value: int) -> None:
        os.umask(value)
    old = os.umask(0o022)
    yield set_mask
    os.umask(old)


@pytest.mark.parametrize("value, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_files_get_the_mode_the_umask_allows(tmp_path, mask, value, mode):
    mask(value)
    assert umask() == value
    write_text(tmp_path / "a.txt", "x")
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == mode


def test_a_file_written_over_keeps_its_mode(tmp_path, mask):
    """`translate --output private.de` over a 0600 file left it 0644, readable by every account: the new file
    took the umask's mode, where `>` keeps the file's. A read-only one (0444) is written over still, as before:
    its mode is given to the new file once it is written (before, root alone could)."""
    mask(0o022)
    for mode in (0o600, 0o444, 0o640):
        (tmp_path / "a.txt").write_text("old")
        os.chmod(tmp_path / "a.txt", mode)
        write_text(tmp_path / "a.txt", "new")
        assert (tmp_path / "a.txt").read_text() == "new" and stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == mode


def test_an_error_inside_the_block_leaves_the_old_file_and_no_temp(tmp_path):
    write_text(tmp_path / "a.txt", "old")
    with pytest.raises(RuntimeError), atomic_path(tmp_path / "a.txt") as tmp:
        tmp.write_text("half of the new")
        raise RuntimeError("cut")
    assert (tmp_path / "a.txt").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def failing_writes(monkeypatch, code: int, prefix: str = ".") -> None:
    """Path.write_bytes of a temporary file (its name starts with ``prefix``) fails as the system would, ``code``."""
    real = Path.write_bytes

    def write(self, data):
        if self.name.startswith(prefix) and self.name.endswith(".tmp"):
            raise OSError(code, os.strerror(code))
        return real(self, data)
    monkeypatch.setattr(Path, "write_bytes", write)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EFBIG, errno.EPERM])
def test_a_write_the_disk_refuses_is_a_one_line_error_naming_the_file(tmp_path, monkeypatch, code):
    """A full disk writing spm.model ended in "internal error: OSError: [Errno 28] No space left on device"."""
    write_text(tmp_path / "a.txt", "old")
    failing_writes(monkeypatch, code)
    with pytest.raises(UserError) as err:
        write_bytes(tmp_path / "a.txt", b"new")
    assert isinstance(err.value, OSError)  # as any failed write: training's checkpoint error adds to it
    assert str(err.value) == f"cannot write {tmp_path / 'a.txt'}: {os.strerror(code)}"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"] and (tmp_path / "a.txt").read_text() == "old"


def test_a_full_disk_writing_the_vocabulary_stops_training_in_one_line(tmp_path, monkeypatch, capsys, tiny_overrides):
    failing_writes(monkeypatch, errno.ENOSPC, ".spm.model.")
    run = tmp_path / "run"
    assert main(["train", "tiny", "--out", str(run), *(a for o in tiny_overrides for a in ("--set", o))]) == 1
    assert capsys.readouterr().err == f"error: cannot write {run / 'spm.model'}: No space left on device\n"


def test_a_full_disk_appending_a_log_line_stops_training_in_one_line(tmp_path, monkeypatch, capsys, tiny_overrides):
    """The disk filled up while training appended its metrics: "internal error: OSError: [Errno 28]"."""
    from transformer import files

    def full(path, mode="r", **kwargs):
        if str(path).endswith("metrics.jsonl") and mode == "a":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return open(path, mode, **kwargs)

    monkeypatch.setattr(files, "open", full, raising=False)  # files' own name for it: the trainer's appends
    run = tmp_path / "run"
    sets = tiny_overrides + ["train.max_steps=4", "train.log_every=2"]
    assert main(["train", "tiny", "--out", str(run), "--quiet", *(a for o in sets for a in ("--set", o))]) == 1
    assert capsys.readouterr().err == f"error: cannot write {run / 'metrics.jsonl'}: No space left on device\n"


def test_a_folder_that_takes_no_new_file_is_refused_before_the_work(tmp_path, monkeypatch, capsys):
    """/proc as root: its mode lets root write, and a file made there fails with ENOENT. `translate --output
    /proc/x` translated everything, then ended in an internal error (FileNotFoundError) and lost it. The folder is
    now tried before the work (a file made and removed), and a file the system will not make in a folder that
    exists is a WriteError naming it, whatever the errno."""
    import tempfile

    from transformer import files
    from transformer.files import WriteError, check_output

    real = tempfile.mkstemp

    def no_new_file(*args, dir=None, **kwargs):
        if Path(dir) == tmp_path / "proc":
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))
        return real(*args, dir=dir, **kwargs)

    (tmp_path / "proc").mkdir()
    monkeypatch.setattr(files.tempfile, "mkstemp", no_new_file)
    with pytest.raises(UserError, match=r"--output .*proc/x: the folder .*proc takes no new file \(No such file"):
        check_output(tmp_path / "proc" / "x", "--output")
    with pytest.raises(WriteError, match=r"cannot write .*proc/x: No such file"):
        write_text(tmp_path / "proc" / "x", "text")
    assert check_output(tmp_path / "x", "--output") == tmp_path / "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proc"]  # the probe left nothing


def test_a_run_folder_is_readable_by_other_accounts(tmp_path, tiny_overrides, mask):
    """Checkpoints and spm.model are 0644 under umask 022, so another account can serve the run."""
    mask(0o022)
    run = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2", "train.save_every=2"]), run, quiet=True)
    files = [run / "spm.model", run / "config.toml", *(run / "checkpoints").iterdir()]
    assert len(list_checkpoints(run)) == 1 and len(files) == 5
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in files} == {p.name: 0o644 for p in files}


@pytest.mark.parametrize("text, problem", [(None, "missing (no record here)"), ('{"format": "x/1"', "unreadable"),
                                           ("[1, 2]", "not a JSON object but list"),
                                           ('{"format": "y/1"}', "not a x/1 record (format: 'y/1')"),
                                           ('{"a": 1}', "not a x/1 record (format: None)"),
                                           (b"\xff\xfe", "unreadable")])
def test_a_record_that_is_not_one_is_refused_naming_the_file(tmp_path, text, problem):
    path = tmp_path / "r.json"
    if text is not None:
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(UserError) as err:
        read_record(path, UserError, "no record here", "x/1")
    assert str(err.value) == f"{path}: {problem}" or (problem == "unreadable" and str(err.value).startswith(
        f"{path}: unreadable ("))
    path.write_text('{"format": "x/1", "a": 1}')
    assert read_record(path, UserError, "", "x/1", label="r") == {"format": "x/1", "a": 1}


def test_a_pipe_is_written_in_place_and_a_link_keeps_pointing_at_its_file(tmp_path):
    """--output naming a pipe (or a terminal, /dev/null, /dev/stdout) replaced it with a regular file: the
    reader never got a line and the command said nothing; a link was replaced by a file of its own."""
    import threading

    from transformer.files import check_output

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)  # a failure must not hang
    reader.start()
    assert check_output(fifo, "--output") == fifo
    write_text(fifo, "ein Hund\n")
    reader.join(timeout=10)
    assert got == ["ein Hund\n"] and stat.S_ISFIFO(os.stat(fifo).st_mode)
    target, link = tmp_path / "target.txt", tmp_path / "link.txt"
    target.write_text("old\n")
    link.symlink_to(target)
    write_text(link, "new\n")
    assert link.is_symlink() and target.read_text() == "new\n"
    dangling = tmp_path / "dangling.txt"
    dangling.symlink_to(tmp_path / "no" / "such.txt")
    write_text(dangling, "mine\n")  # no file to keep pointing at: the link is replaced, as before
    assert not dangling.is_symlink() and dangling.read_text() == "mine\n"


def test_a_staged_folders_failed_write_names_the_output(tmp_path):
    """export and preprocess on a full disk: "internal error: SafetensorError ... os error 28" (a bug report asked
    for), "run/spm.model: No space left on device" (the input shutil copied from), or no file at all."""
    import errno

    from transformer.files import WriteError, staged_write_error

    staged, out = tmp_path / ".hf.x" / "hf", tmp_path / "hf"
    SafetensorError = type("SafetensorError", (Exception,), {})
    for error in (SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
                  OSError(errno.ENOSPC, "No space left on device", "run/spm.model"),
                  OSError(errno.ENOSPC, "No space left on device"),
                  OSError(errno.EACCES, "Permission denied", str(staged / "model.safetensors"))):
        told = staged_write_error(error, staged, out)
        assert isinstance(told, WriteError) and str(told).startswith(f"cannot write {out}: "), error
    for error in (OSError(errno.EACCES, "Permission denied", "run/spm.model"),  # an input it could not read
                  OSError(errno.ENOENT, "No such file or directory"), ValueError("x"),
                  SafetensorError("not an OS error")):
        assert staged_write_error(error, staged, out) is None, error


def test_a_log_whose_folder_is_gone_is_said_so(tmp_path):
    """A run folder renamed or removed while it trains: its next log line was an internal error (FileNotFoundError,
    "please report it"), where the user moved the folder."""
    from transformer.files import WriteError, append_text

    run = tmp_path / "run"
    run.mkdir()
    append_text(run / "metrics.jsonl", "{}\n")
    run.rename(tmp_path / "moved")
    with pytest.raises(WriteError, match=rf"^cannot write {run}/metrics.jsonl: its folder {run} is gone \(moved or "):
        append_text(run / "metrics.jsonl", "{}\n")


def test_dev_stdout_redirected_to_a_file_is_written_where_the_shell_writes(tmp_path):
    """`translate --output /dev/stdout >> job.log` replaced job.log with a file of the translations alone
    (/dev/stdout leads to a regular file, which was renamed over): the log's earlier lines were lost, and
    what the shell wrote after went to the file replaced. It is written at the descriptor's own offset."""
    import subprocess
    import sys

    log = tmp_path / "job.log"
    log.write_text("earlier\n")
    write = ("import sys; from transformer.files import write_text; print('before', flush=True); "
             "[write_text(p, p + '\\n') for p in sys.argv[1:]]; print('after')")
    names = ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"]
    with open(log, "a") as out:
        subprocess.run([sys.executable, "-c", write, *names], stdout=out, check=True)
    assert log.read_text() == "earlier\nbefore\n" + "".join(f"{name}\n" for name in names) + "after\n"
    with open(log, "w") as out:  # `>`, not `>>`: the offset is the descriptor's, not the file's end
        out.write("header\n")
        out.flush()
        subprocess.run([sys.executable, "-c", write, "/dev/stdout"], stdout=out, check=True)
        out.write("footer\n")
    assert log.read_text() == "header\nbefore\n/dev/stdout\nafter\nfooter\n"


def test_translate_into_a_pipe(tmp_path, tiny_run, capsys):
    import threading

    fifo, src = tmp_path / "fifo", tmp_path / "in.txt"
    os.mkfifo(fifo)
    src.write_text("A dog runs.\nA cat sleeps.\n")
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)  # a failure must not hang
    reader.start()
    assert main(["translate", str(tiny_run), "--input", str(src), "--output", str(fifo), "--beam", "1"]) == 0
    reader.join(timeout=30)
    assert len(got) == 1 and len(got[0].splitlines()) == 2 and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_write_is_made_durable_before_its_rename_and_the_rename_after(tmp_path, monkeypatch):
    """After a crash of the machine (power lost), not only of the process, the old file or the new one must be
    there whole: the new content reaches the disk (fsync) before the rename makes it the file, and the folder's
    fsync after the rename makes that last. Killing a process cannot show a missing fsync, so the calls are
    watched: which file each one is about, by inode, in order."""
    path = tmp_path / "record.json"
    path.write_text("old")
    events: list[tuple[str, int]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.fstat(fd).st_ino))
        real_fsync(fd)

    def replace(src, dst) -> None:
        events.append(("replace", os.stat(src).st_ino))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write_text(path, "new")
    new, folder = path.stat().st_ino, tmp_path.stat().st_ino
    assert path.read_text() == "new"
    assert events == [("fsync", new), ("replace", new), ("fsync", folder)]


def test_write_text_writes_utf8(tmp_path):
    """Translations and records are UTF-8 files (the readers decode them so): umlauts, dashes and the unknown
    piece's mark are written as their UTF-8 bytes, never as another encoding's or replaced."""
    path = tmp_path / "out.txt"
    text = "Ein Mädchen – auf der Straße ⁇\n"
    write_text(path, text)
    assert path.read_bytes() == text.encode("utf-8")


KILLED_WRITER = """
import sys, time
from pathlib import Path
from transformer import export, files
kind, out = sys.argv[1], Path(sys.argv[2])
block = files.atomic_path(out) if kind == "file" else export._staged(out, overwrite=False)
with block as tmp:
    (tmp / "model.bin" if kind == "folder" else tmp).write_bytes(b"half of a model")
    print("writing", flush=True)
    time.sleep(600)
"""


def _killed_writer(kind: str, out: Path) -> Path:
    """What a writer of ``out`` SIGKILLed midway left beside it, aged past ``STALE_S``; a folder (an export's) is
    checked to be left alone, however old, while its writer lives."""
    import subprocess
    import sys
    import time

    from transformer import files

    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, kind, str(out)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert child.stdout.readline() == "writing\n"
    (left,) = [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
    assert files.clear_stale(out.parent, out.name) == []  # young: its writer may be at work
    os.utime(left, (time.time() - 2 * files.STALE_S,) * 2)
    if kind == "folder":
        assert files.clear_stale(out.parent, out.name) == []  # its writer alive: held, whatever its age
    child.kill()
    child.wait()
    child.stdout.close()
    assert left.exists()
    return left


def test_a_killed_writers_temporary_file_goes_at_a_later_write_of_its_name(tmp_path):
    """A write SIGKILLed midway (an output, a model file) left its hidden .NAME.XXXXXXXX.tmp for good. A later
    write of the name removes one over an hour old (no write takes so long), nothing else."""
    import time

    from transformer import files

    out = tmp_path / "out.txt"
    left = _killed_writer("file", out)
    young = tmp_path / ".out.txt.abcd1234.tmp"  # one of a writer at work
    young.write_bytes(b"x")
    others = [tmp_path / ".out.txt.backup.tmp", tmp_path / ".other.txt.abcd1234.tmp"]  # not a staging name of out.txt
    for path in others:
        path.write_bytes(b"mine")
    (tmp_path / ".out.txt.link1234.tmp").symlink_to(tmp_path / "elsewhere")
    os.mkfifo(tmp_path / ".out.txt.fifo1234.tmp")  # opened, it would block
    for path in (*others, tmp_path / ".out.txt.link1234.tmp", tmp_path / ".out.txt.fifo1234.tmp"):
        os.utime(path, (time.time() - 2 * files.STALE_S,) * 2, follow_symlinks=False)
    write_text(out, "whole")
    assert out.read_text() == "whole" and not left.exists() and young.exists()
    assert all(p.exists() for p in others) and (tmp_path / ".out.txt.link1234.tmp").is_symlink()
    assert (tmp_path / ".out.txt.fifo1234.tmp").exists()


def test_a_killed_exports_staging_folder_goes_at_the_next_export_to_its_folder(tmp_path):
    from transformer.export import _staged

    out = tmp_path / "hf"
    left = _killed_writer("folder", out)
    assert (left / "hf" / "model.bin").is_file()
    with _staged(out, overwrite=False) as staged:
        (staged / "config.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"] and os.listdir(out) == ["config.json"]


@pytest.mark.parametrize("directory", [False, True])
def test_a_failed_blocks_staging_file_or_folder_is_removed_by_staging_itself(tmp_path, directory):
    """The one staging removes what a failed block left, so its callers (atomic_path, the token store, an
    export, preprocess's vocabulary) need no removal of their own; what the block renamed into place stays."""
    from transformer import files

    with pytest.raises(RuntimeError), files.staging(tmp_path, "out", directory=directory) as tmp:
        (tmp / "part").write_text("half") if directory else tmp.write_text("half")
        raise RuntimeError("killed midway")
    assert os.listdir(tmp_path) == []
    with files.staging(tmp_path, "out", directory=directory) as tmp:
        (tmp / "part").write_text("whole") if directory else tmp.write_text("whole")
        tmp.rename(tmp_path / "out")
    assert os.listdir(tmp_path) == ["out"]


def test_a_stop_between_the_names_of_files_that_belong_together_waits_for_the_last(tmp_path, monkeypatch):
    """SIGTERM after a model's weights took their name and before its record did (`average --out` written over an
    earlier average) left the new weights beside the old record: neither set loadable. The stop now comes once
    both have their names."""
    import signal

    from transformer.errors import Terminated
    from transformer.files import atomic_paths

    weights, record = tmp_path / "w.safetensors", tmp_path / "w.json"
    weights.write_text("old weights")
    record.write_text("old record")
    real, renamed = os.replace, []

    def replace(src, dst) -> None:
        real(src, dst)
        renamed.append(Path(dst).name)
        if len(renamed) == 1:
            signal.raise_signal(signal.SIGTERM)

    def terminated(signum, frame):  # as cli.sigterm_raises's handler
        raise Terminated(signum)

    monkeypatch.setattr(os, "replace", replace)
    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        with pytest.raises(Terminated):
            with atomic_paths(weights, record) as (w, r):
                w.write_text("new weights")
                r.write_text("new record")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert renamed == ["w.safetensors", "w.json"]
    assert (weights.read_text(), record.read_text()) == ("new weights", "new record")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.json", "w.safetensors"]  # no temporary file left
