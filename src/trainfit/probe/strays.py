"""The processes a probe may leave behind: the worker's descendants in any session, and whatever can
still write into its pipes (found through Linux's ``/proc``), and their end (SIGKILL, psutil's pid
check with it)."""

from __future__ import annotations

import os
from typing import Any


def descendants(pid: int) -> list[Any]:
    """``pid``'s children, theirs and so on (psutil processes), including those in other sessions."""
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def pipe_writers(*fds: int) -> list[Any]:
    """The processes that can still write into the pipes whose read ends are ``fds`` (psutil processes).

    The worker's pipes stay open while any process holds a write end, whatever session or group
    it is in, even after the worker is gone. Found on Linux through ``/proc/PID/fd`` (write mode
    only: a fork of this process holds the read end, and is no stray); none elsewhere.
    """
    import psutil

    pipes = {f"pipe:[{os.fstat(fd).st_ino}]" for fd in fds}
    writers = []
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []
    for pid in pids:
        try:
            for n in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{n}") in pipes and opened_for_writing(pid, n):
                    writers.append(psutil.Process(pid))
                    break
        except (OSError, psutil.Error):  # gone meanwhile, or not ours to read
            continue
    return writers


def opened_for_writing(pid: int, fd: str) -> bool:
    """Whether descriptor ``fd`` of ``pid`` was opened for writing (Linux's ``/proc/PID/fdinfo``)."""
    with open(f"/proc/{pid}/fdinfo/{fd}") as f:
        for line in f:
            if line.startswith("flags:"):
                return (int(line.split()[1], 8) & os.O_ACCMODE) in (os.O_WRONLY, os.O_RDWR)
    return False


def kill_all(processes: list[Any]) -> None:
    """SIGKILL each of ``processes`` (psutil's check that the pid was not reused comes with it)."""
    import psutil

    for process in processes:
        try:
            process.kill()
        except psutil.Error:
            pass

