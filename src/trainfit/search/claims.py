"""The runs sharing one ``--storage`` (or one journal): who owns a trial, whether that run is still
alive, its heartbeat while it probes, and the bounded wait for another run's trial still being
asked for. What ``TrialStore`` and compare's shared runs (``compare/shared.py``) both follow."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

HEARTBEAT_S = 30
"""Seconds between the heartbeats Optuna records for a trial a run of a shared ``--storage`` is
probing (the RDBStorage's ``heartbeat_interval``, a whole number). A trial with none for three
intervals (its ``grace_period``) is stale: its run is gone, and its config is open again."""


def owner_id() -> str:
    """``host:pid`` of this run, stamped on the trials it asks for."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def abandoned(trial: Any) -> bool:
    """Is a RUNNING trial of a shared storage one that no live run will finish, as Optuna's
    heartbeat does not (yet) tell?

    - Its owner ran on this host and that process is gone: known at once, where the heartbeat
      waits out its grace period (three beats). A run stopped by Ctrl-C and resumed on the same
      machine would otherwise find its own cut-off trial in flight, and wait for it, for 90 s.
    - It has no owner three beats after its start: its run died while asking for it, before its
      first heartbeat, and Optuna never calls a trial without a heartbeat stale (the sampler's
      work in ``ask`` comes first, a moment a Ctrl-C can land in)."""
    owner = trial.user_attrs.get("owner")
    if owner is None:
        start = trial.datetime_start
        return start is None or time.time() - start.timestamp() > 3 * HEARTBEAT_S
    host, _, pid = str(owner).partition(":")
    return host == socket.gethostname() and pid.isdigit() and not _alive(int(pid))


def beat(storage: Any, trial: Any, *, first: bool = False) -> None:
    """Record ``trial``'s heartbeat where ``storage`` keeps them: a database does (Optuna's
    ``RDBStorage``); a journal file does not, and its runs, all on one machine, are told alive by
    their process (:func:`abandoned`). A ``first`` beat, the one before a trial gets its owner,
    waits out an unreachable database as a transaction does; a later one is skipped (see
    :func:`~trainfit.search.reconnect.reconnecting`)."""
    record = (first and getattr(storage, "record_first_heartbeat", None)) or getattr(storage, "record_heartbeat", None)
    if record is not None:
        record(trial._trial_id)  # the storage API takes its id, not its number


R = TypeVar("R")


def wait_beside(storage: Any, trial: Any, look: Callable[[], R | None], *, gone: R) -> R:
    """``look()`` again every 0.1 s until it answers (not None), beating for ``trial`` meanwhile so
    that the runs sharing ``storage`` see it alive: how a run waits for the earlier trials of others
    still being asked for (their values or config not stored yet). ``gone``: the answer once another
    run has closed ``trial``, or after the grace period (three heartbeats), by which an earlier trial
    whose run died while it was asked for is closed, and past which (a start misread on another
    clock) the wait would not end."""
    give_up = time.monotonic() + 3 * HEARTBEAT_S
    while (answer := look()) is None:
        if closed_elsewhere(storage, trial) or time.monotonic() > give_up:
            return gone
        beat(storage, trial)
        time.sleep(0.1)
    return answer


def closed_elsewhere(storage: Any, trial: Any) -> bool:
    """Has another run closed ``trial`` (this run's, still in its hands)? A run that looked
    abandoned, its machine paused past the heartbeat's grace period or its start misread on
    another clock, is closed as FAIL by the runs that share its storage (see :func:`abandoned`)."""
    return bool(storage.get_trial(trial._trial_id).state.is_finished())


@contextlib.contextmanager
def heartbeat(storage: Any, trial: Any) -> Iterator[None]:
    """Record ``trial``'s heartbeat in ``storage`` (an :func:`~trainfit.search.storage.open_storage`) at once and then every
    ``HEARTBEAT_S`` seconds while the block runs, as ``Study.optimize`` does around its objective
    (Optuna's heartbeat thread is private): other runs tell a live trial (however long its work)
    from one whose machine died (stale after three missed beats)."""
    stop = threading.Event()

    def beats() -> None:
        while True:
            with contextlib.suppress(Exception):  # the storage is unreachable: the work goes on; next beat
                beat(storage, trial)
            if stop.wait(HEARTBEAT_S):
                return

    thread = threading.Thread(target=beats, name="trainfit-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()

