"""A database storage that waits out its server: each call Optuna's ``RDBStorage`` makes in one
transaction is retried while the database cannot be reached (a PostgreSQL server restarting, a
failover, the network to it cut), for at most ``PATIENCE_S``, with a message when the wait begins
and when it ends. A run that finishes a probe meanwhile records it once the server is back, so a
restart loses no measurement.

Only whole transactions are retried: every method wrapped here opens one session, which Optuna
rolls back when it fails, so a retry starts from what the database holds. The one write that can
have reached the database although its answer did not, closing a trial, is checked before it is
repeated (:func:`_state_set`)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from trainfit.errors import TrainfitError
from trainfit.format import format_duration
from trainfit.search.events import StorageBack, StorageLost

PATIENCE_S = 600.0
"""How long a run waits for its unreachable ``--storage`` before it stops (s): a server's restart
takes seconds, a managed database's failover a minute or two. A run that stops loses only the
probe it was recording; ``--resume`` (or ``--join``) continues the study."""

RETRY_S = (0.5, 10.0)
"""The first and the longest pause between two tries (s); each pause doubles the one before."""

TRANSACTIONS = (
    "create_new_study", "delete_study", "set_study_user_attr", "set_study_system_attr",
    "get_study_id_from_name", "get_study_name_from_id", "get_study_directions", "get_study_user_attrs",
    "get_study_system_attrs", "get_all_studies", "_create_new_trial", "_set_trial_param", "get_trial_param",
    "set_trial_state_values", "set_trial_intermediate_value", "set_trial_user_attr", "set_trial_system_attr",
    "get_trial_id_from_study_id_trial_number", "get_trial", "_get_trials", "_get_best_trial_id",
    "get_trial_user_attrs", "get_trial_system_attrs", "_get_stale_trial_ids",
)
"""The methods of Optuna's ``RDBStorage`` that each run one transaction (``_create_scoped_session``),
the public ones and the private ones its ``_CachedStorage`` calls: the units a retry repeats. Its
other methods call these (``create_new_trial`` calls ``_create_new_trial``), so nothing is retried
twice over. Optuna 5's names: a rename fails at :func:`reconnecting`, not silently."""


def unreachable(err: BaseException) -> str | None:
    """The driver's first line when ``err`` says the database cannot be reached: SQLAlchemy's
    ``OperationalError`` or ``InterfaceError``, raised bare, or as the cause of Optuna's
    ``StorageInternalError``, or in handling which another error was raised (Optuna's ``_get_trials``
    takes an ``OperationalError`` for a query too long, and asks again on the broken session, which
    SQLAlchemy refuses: ``PendingRollbackError``). None for any other error, raised as it is."""
    import sqlalchemy.exc

    if isinstance(err, TrainfitError):  # said already (a server that refused the URL), whatever it was raised in
        return None
    link: BaseException | None = err
    for _ in range(10):  # the chain of errors, each raised in handling the next
        if link is None:
            break
        if isinstance(link, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)):
            lines = str(link.orig).strip().splitlines()
            return lines[0] if lines else type(link.orig).__name__
        link = link.__cause__ or link.__context__
    return None


def outage_line(event: StorageLost | StorageBack) -> str:
    """What a run prints when its storage stops answering, and when it answers again."""
    if isinstance(event, StorageLost):
        return (f"waiting: --storage {event.storage} cannot be reached ({event.reason}); retrying for up to "
                f"{format_duration(event.patience_s)}, and what is measured meanwhile is recorded once it answers")
    return f"--storage {event.storage} answers again after {format_duration(event.waited_s)}: going on"


def reconnecting(storage: Any, where: str, on_outage: Callable[[Any], None]) -> Any:
    """``storage`` (an ``RDBStorage``), its transactions retried while its database cannot be
    reached; ``on_outage`` gets a :class:`StorageLost` when a wait begins and a :class:`StorageBack`
    when it ends (``where``: the URL to name, its password hidden). Its heartbeat is not retried:
    a beat that cannot be recorded is skipped, and the next one (``HEARTBEAT_S`` later) records it.
    A trial's first beat is (``record_first_heartbeat``, repeated safely: a second try updates the
    beat the first recorded): a trial stamped with its owner and no beat on record, its run then
    dead, would be in flight for ever to the runs on other machines (Optuna calls no trial without
    a beat stale, and they cannot check the owner's process)."""
    for name in TRANSACTIONS:
        setattr(storage, name, retried(getattr(storage, name), where, on_outage))
    storage.set_trial_state_values = _state_set(storage, storage.set_trial_state_values)
    storage.record_first_heartbeat = retried(storage.record_heartbeat, where, on_outage)
    storage.record_heartbeat = _skipped_when_unreachable(storage.record_heartbeat)
    return storage


RESUME_HINT = ("bring the database back, then run the same command with --resume (or --join): every trial "
               "recorded before stays")


def retried(call: Callable[..., Any], where: str, on_outage: Callable[[Any], None], *,
            patience_s: float = PATIENCE_S, hint: str = RESUME_HINT) -> Callable[..., Any]:
    """``call`` tried again while its database cannot be reached, at most ``patience_s``, pausing
    :data:`RETRY_S` (each pause twice the one before); ``on_outage`` gets a :class:`StorageLost` when a
    wait begins and a :class:`StorageBack` when it ends. Any other error is raised at once."""
    @functools.wraps(call)
    def retrying(*args: Any, **kwargs: Any) -> Any:
        lost_at: float | None = None
        pause = RETRY_S[0]
        while True:
            try:
                answer = call(*args, **kwargs)
            except Exception as err:  # anything but an unreachable database is raised at once
                reason = unreachable(err)
                if reason is None:
                    raise
                now = time.monotonic()
                if lost_at is None:
                    lost_at = now
                    on_outage(StorageLost(storage=where, reason=reason, patience_s=patience_s))
                elif now - lost_at > patience_s:
                    raise TrainfitError(
                        f"--storage {where} could not be reached for {format_duration(patience_s)}: {reason}",
                        hint) from None
                time.sleep(min(pause, max(0.0, lost_at + patience_s - now) + 0.01))
                pause = min(2 * pause, RETRY_S[1])
                continue
            if lost_at is not None:
                on_outage(StorageBack(storage=where, waited_s=time.monotonic() - lost_at))
            return answer

    return retrying


def _state_set(storage: Any, retried: Callable[..., Any]) -> Callable[..., Any]:
    """``set_trial_state_values`` once more: a try that failed as the server went down may have
    committed its close all the same, and its retry then finds the trial finished. When the trial
    holds just what was asked, the close happened: no error, and no second trial of the same
    measurement (``TrialStore.tell`` makes one for a trial another run closed)."""
    import optuna

    @functools.wraps(retried)
    def set_state(trial_id: int, state: Any, values: Any = None) -> bool:
        try:
            return bool(retried(trial_id, state, values))
        except optuna.exceptions.UpdateFinishedTrialError:
            stored = storage.get_trial(trial_id)
            if stored.state == state and (values is None or list(stored.values or ()) == list(values)):
                return True
            raise

    return set_state


def _skipped_when_unreachable(beat: Callable[[int], None]) -> Callable[[int], None]:
    @functools.wraps(beat)
    def record(trial_id: int) -> None:
        try:
            beat(trial_id)
        except Exception as err:  # only an unreachable database is skipped
            if unreachable(err) is None:
                raise

    return record
