"""The one folder lock every run folder uses (tune's study, train, compare): held by a live
process, named in the refusal, and released by the kernel when its holder dies, even by kill -9."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from trainfit.files import FolderBusy, folder_holder, lock_folder

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
