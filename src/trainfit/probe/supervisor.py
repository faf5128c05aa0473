"""The process the runner starts, which outlives the probe worker to end everything it started.

A workload may start helpers that leave the worker's process group (``setsid``, a daemon's double
fork) and do not hold its output: once the worker is gone (``os.abort()``, a segfault, the OOM
killer, or the tuner killed outright), nothing led to them and they ran for ever, holding memory.
So the process the runner starts forks at once, before any thread or heavy import: the child goes
on as the worker, the parent stays as its supervisor, a Linux *child subreaper*, so every process
orphaned below it is re-parented to it instead of to init. It kills them all, and reaps them, when
the worker ends or when the runner does, then ends as the worker ended (the same exit code or
signal), so the runner reads the worker's ending from it as before.

Standard library only: it is imported before the fork, and keeps the supervisor small.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
import time
from typing import NoReturn

PR_SET_PDEATHSIG = 1
"""Linux's prctl option: the signal this process gets when its parent thread ends."""
PR_SET_CHILD_SUBREAPER = 36
"""Linux's prctl option: orphans below this process are re-parented to it, not to init."""
PARENT_POLL_S = 0.5
"""How often a watchdog checks that its parent is alive (PDEATHSIG is not always asked for): the
supervisor's (the runner), the worker's (the supervisor, or the runner where nothing forks)."""
KILL_BOUND_S = 5.0
"""How long the supervisor keeps killing what is left: a process in uninterruptible sleep (a hung
driver call) dies only when that call returns, and the runner must not wait on it for ever."""
_WATCHED = {signal.SIGCHLD, signal.SIGTERM}
"""SIGCHLD: a child ended. SIGTERM: the runner died (PDEATHSIG) or someone stops the probe."""


def supervise(parent_pid: int, pdeathsig: bool) -> tuple[int, bool]:
    """Fork; return in the child, the worker, with the pid it must die with and whether it may
    ask for PDEATHSIG. The parent never returns: it supervises the worker (:func:`_outlive`).

    ``parent_pid``: the runner's pid; ``pdeathsig``: whether the runner's thread that started this
    process lives as long as the runner. Elsewhere than on Linux (no subreaper), nothing forks.
    """
    if sys.platform != "linux":
        return parent_pid, pdeathsig
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1)  # not inherited by the fork: only the supervisor is one
    # Blocked before the fork, so neither signal is lost between the fork and the first wait.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _WATCHED)
    supervisor = os.getpid()
    worker = os.fork()
    if worker == 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        return supervisor, True  # its parent is the supervisor's only thread: PDEATHSIG is sound
    if pdeathsig:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    _let_go_of_the_pipes()
    _outlive(worker, parent_pid)


def _let_go_of_the_pipes() -> None:
    """Leave the runner's pipes to the worker: a job on stdin is the worker's, and the output and
    event pipes end when the worker and its helpers are gone, not when the supervisor is."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))


def _outlive(worker: int, parent_pid: int) -> NoReturn:
    """Wait for the worker to end, or for the runner to go; then end everything below and exit as
    the worker did (the runner gone: just exit)."""
    status = None
    while status is None:
        got = signal.sigtimedwait(_WATCHED, PARENT_POLL_S)
        if (got is not None and got.si_signo == signal.SIGTERM) or os.getppid() != parent_pid:
            break
        status = _reap(worker)
    _kill_all_below()
    if status is None:
        os._exit(1)
    _exit_as(status)


def _reap(worker: int) -> int | None:
    """Reap every child that has ended (orphans re-parented here too, so none stays a zombie);
    the worker's wait status once it has ended, else None."""
    found = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if pid == 0:
            return found
        if pid == worker:
            found = status


def _kill_all_below() -> None:
    """SIGKILL every process below this one, until none is left (or :data:`KILL_BOUND_S` passed):
    one being killed may have just forked, and its child is re-parented here."""
    import psutil

    deadline = time.monotonic() + KILL_BOUND_S
    while time.monotonic() < deadline:
        try:
            left = psutil.Process().children(recursive=True)
        except psutil.Error:
            return
        if not left:
            return
        for process in left:
            try:
                process.kill()
            except psutil.Error:
                pass
        signal.sigtimedwait({signal.SIGCHLD}, 0.05)
        _reap(-1)


def _exit_as(status: int) -> NoReturn:
    """Exit with the worker's code, or die of the signal that killed it (without a core dump of
    this process: the worker's is the one worth having)."""
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        os._exit(code)
    sig = -code
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    if sig != signal.SIGKILL:  # its handling cannot be changed (nor need it be)
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # a signal whose default is to go on (none kills a worker): say which
