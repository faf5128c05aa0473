"""The one folder lock every run folder uses (tune's study, train, compare): held by a live
process, named in the refusal, and released by the kernel when its holder dies, even by kill -9."""

from __future__ import annotations

import errno
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from trainfit.files import FolderBusy, folder_holder, held_folder, lock_folder, naming

HOLD = "import sys, time; from pathlib import Path; from trainfit.files import lock_folder; " \
       "f = lock_folder(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)"


def _holder(folder: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_folder_held_by_another_process_is_refused_with_its_holder(tmp_path: Path) -> None:
    proc = _holder(tmp_path)
    try:
        assert (folder_holder(tmp_path) or "").startswith(f"pid {proc.pid} on ")
        with pytest.raises(FolderBusy) as busy:
            lock_folder(tmp_path)
        assert busy.value.holder.startswith(f"pid {proc.pid} on ")
    finally:
        proc.kill()
        proc.wait()


def test_the_lock_of_a_killed_holder_is_free_at_once(tmp_path: Path) -> None:
    proc = _holder(tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert folder_holder(tmp_path) is None
    held = lock_folder(tmp_path)  # taken, not refused
    try:
        assert (tmp_path / ".lock").read_text().startswith("pid ")
        assert folder_holder(tmp_path) == f"pid {os.getpid()} on {socket.gethostname()}"  # ours, seen like any
    finally:
        held.close()


def test_looking_at_a_free_folder_leaves_it_free(tmp_path: Path) -> None:
    assert folder_holder(tmp_path) is None
    assert folder_holder(tmp_path / "missing") is None
    proc = _holder(tmp_path)  # another process can still take it after we looked
    proc.kill()
    proc.wait()


INJECTED = """import errno, os, sys
from pathlib import Path
from trainfit.errors import TrainfitError
from trainfit.files import folder_holder, lock_folder
folder = Path(sys.argv[1])
def lock_files():
    return [fd for fd in os.listdir('/proc/self/fd') if os.path.realpath(f'/proc/self/fd/{fd}').endswith('.lock')]
try:
    lock_folder(folder)
except TrainfitError as err:
    print('refused:', str(err).replace(chr(10), ' | '))
except OSError as err:
    print('os error:', errno.errorcode[err.errno], 'open:', len(lock_files()))
    held = lock_folder(folder)  # its file was closed: this process takes the lock again (flock is per open file)
    print('taken again')
else:
    print('taken')
print('open:', len(lock_files()))
print('holder:', folder_holder(folder))
from trainfit.files import held_folder
try:
    with held_folder(folder / 'new', RuntimeError):
        pass
except TrainfitError:
    print('new folder left:', (folder / 'new').exists())
"""


def _with_fault(fault: str, folder: Path) -> list[str]:
    """INJECTED's lines, run with ``fault`` injected by strace (``flock:error=ENOLCK``: the kernel
    answers the real call with that error, as a file system without locks does)."""
    if shutil.which("strace") is None:
        pytest.skip("no strace to inject the fault")
    done = subprocess.run(["strace", "-f", "-o", os.devnull, "-e", f"trace={fault.split(':')[0]}",
                           "-e", f"inject={fault}", sys.executable, "-c", INJECTED, str(folder)],
                          capture_output=True, text=True, timeout=60)
    if "PTRACE" in done.stderr or "ptrace" in done.stderr:
        pytest.skip(f"strace cannot trace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


@pytest.mark.integration
@pytest.mark.parametrize("error", ["ENOLCK", "EOPNOTSUPP"])
def test_a_file_system_without_locks_is_refused_naming_the_lock_not_taken_for_a_busy_folder(
        tmp_path: Path, error: str) -> None:
    """flock's ENOLCK or EOPNOTSUPP (an NFS without its lock service) read as "held by another
    process": compare said the folder was in use by a running trainfit, plan that a tune still ran."""
    said = _with_fault(f"flock:error={error}", tmp_path)
    assert said[0] == (f"refused: {tmp_path / '.lock'} cannot be locked ({os.strerror(getattr(errno, error))}): "
                       f"its file system keeps no locks, so a second run into {tmp_path} could not be refused | "
                       "  fix: use an --output on a file system with locks (a local disk)"), said
    assert said[1:] == ["open: 0", "holder: None", "new folder left: False"], said


@pytest.mark.integration
def test_a_lock_whose_holder_line_cannot_be_written_is_let_go(tmp_path: Path) -> None:
    """The lock is taken, then writing who holds it fails (a full disk): the file was left open,
    and with it the lock, until the error was gone."""
    said = _with_fault("ftruncate:error=EIO:when=1", tmp_path)
    assert said[:3] == ["os error: EIO open: 0", "taken again", "open: 1"], said
    assert said[3].startswith("holder: pid "), said  # the second taking holds it, as any holder does


def test_held_folder_refuses_with_the_holder_and_removes_a_folder_it_made_that_stayed_empty(tmp_path: Path) -> None:
    proc = _holder(tmp_path)
    try:
        with pytest.raises(RuntimeError, match=f"^pid {proc.pid} on "), held_folder(tmp_path, RuntimeError):
            pass
    finally:
        proc.kill()
        proc.wait()
    with held_folder(tmp_path / "empty", RuntimeError) as lock:
        assert not lock.closed and (tmp_path / "empty" / ".lock").is_file()
    assert lock.closed and not (tmp_path / "empty").exists()
    with held_folder(tmp_path / "kept", RuntimeError):
        (tmp_path / "kept" / "x").write_text("x")
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == [".lock", "x"]


def test_a_disk_error_naming_no_file_is_pinned_on_the_path_and_nothing_else_is(tmp_path: Path) -> None:
    """ENOSPC comes from the write, with no file name: :func:`naming` gives it the path. EMFILE
    (os.pipe) or an OSError of no errno (shutil's) is no fault of the path's, and kept as it was:
    tune's probes read "Too many open files: 'out/probes/trial-0003'" and "[Errno None] None"."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    with pytest.raises(OSError) as full, naming(tmp_path / "out"), open("/dev/full", "wb") as f:
        f.write(b"x")
        f.flush()
    assert (full.value.errno, full.value.filename) == (errno.ENOSPC, str(tmp_path / "out"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (0, hard))  # no new file: the next pipe is refused
    try:
        with pytest.raises(OSError) as many, naming(tmp_path / "out"):
            os.pipe()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert (many.value.errno, many.value.filename) == (errno.EMFILE, None)
    (tmp_path / "d").mkdir()
    with pytest.raises(shutil.Error) as moved, naming(tmp_path / "out"):
        shutil.move(str(tmp_path / "d"), str(tmp_path / "d" / "inside"))
    assert (moved.value.errno, moved.value.filename) == (None, None) and "into itself" in str(moved.value)


# -- nothing a user points trainfit at is written through a link (issue 45) -------------------------

def test_a_lock_that_is_a_link_or_no_regular_file_is_refused_and_what_it_points_at_kept(tmp_path: Path) -> None:
    """``.lock`` was opened with ``a+``, which follows a link: the target was truncated and given a pid line
    (`ln -sf victim runs/a/.lock; trainfit tune ... --output runs/a --resume`). A FIFO hung the open."""
    from trainfit.errors import TrainfitError

    victim = tmp_path / "victim.txt"
    victim.write_text("a user's file\n")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / ".lock").symlink_to(victim)
    with pytest.raises(TrainfitError, match="symbolic link") as refused:
        lock_folder(linked)
    assert "rm " in (refused.value.hint or "")
    assert victim.read_text() == "a user's file\n"
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / ".lock")
    with pytest.raises(TrainfitError, match=r"is a pipe \(FIFO\), not a regular file"):
        lock_folder(fifo)  # at once: a FIFO no process reads would block the open for good
    assert folder_holder(linked) is None  # asking who holds it writes nothing either


def test_an_atomic_write_replaces_a_link_planted_at_its_temporary_name_not_its_target(tmp_path: Path) -> None:
    from trainfit.files import write_atomically

    victim = tmp_path / "victim.txt"
    victim.write_text("a user's file\n")
    target = tmp_path / "summary.json"
    (tmp_path / f"summary.json.{os.getpid()}.tmp").symlink_to(victim)
    write_atomically(target, "{}\n")
    assert target.read_text() == "{}\n" and not target.is_symlink()
    assert victim.read_text() == "a user's file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json", "victim.txt"]


def test_a_run_log_is_not_appended_through_a_link(tmp_path: Path) -> None:
    from trainfit.errors import TrainfitError
    from trainfit.train.callbacks import RunLog

    victim = tmp_path / "victim.txt"
    victim.write_text("kept\n")
    (tmp_path / "train_log.jsonl").symlink_to(victim)
    with pytest.raises(TrainfitError, match="symbolic link"):
        RunLog(tmp_path / "train_log.jsonl").write("start")
    assert victim.read_text() == "kept\n"
