"""Which study a spec is and where it lives: its name and data fingerprint, the output folder's
lock, the storage opened (a journal file or a database URL, its password masked in messages, a
database waited for while it cannot be reached), and
the refusals when a folder or storage holds another study."""

from __future__ import annotations

import functools
import hashlib
import json
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from trainfit.data.readers import fingerprint
from trainfit.errors import TrainfitError
from trainfit.files import FolderBusy, lock_folder
from trainfit.params import KNOBS, Params
from trainfit.search import claims
from trainfit.search.journal import journal_storage
from trainfit.search.reconnect import PATIENCE_S, reconnecting, retried, unreachable
from trainfit.spec import RUN_LIMITS, Spec


def study_name(spec: Spec) -> str:
    """Same model, data, budget, probe settings, base params and space -> same study (settings
    and knobs at their defaults left out: see :meth:`Spec.digest`)."""
    space = spec.search
    defaults = Params().to_dict()
    params = {k: v for k, v in spec.params.to_dict().items() if k not in defaults or defaults[k] != v}
    key = json.dumps([spec.digest(), params, [c.text for c in space.constraints] if space else [],
                      space.target_effective_batch if space else None], sort_keys=True, default=list)
    return "trainfit-" + hashlib.sha256(key.encode()).hexdigest()[:12]


def differing_keys(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted keys where two JSON documents differ (``budget.memory_gb``)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [k for key in sorted(set(a) | set(b))
                for k in differing_keys(a.get(key), b.get(key), f"{prefix}{key}.")]
    return [] if a == b else [prefix.rstrip(".")]


def data_fingerprint(spec: Spec) -> str | None:
    """The identity of the spec's dataset content (its size and bytes sampled through each file;
    not its modification time, so a copy or a ``touch`` is the same data), or None for a spec
    without data. Stored with a study, so ``--resume`` on changed data at the same path does not
    mix old and new measurements."""
    if spec.data is None:
        return None

    return fingerprint(spec.data.path, times=False)


def lock_study_folder(output: Path) -> IO[str]:
    """Hold ``output/.lock`` for this run, or say which run holds it."""
    try:
        return lock_folder(output)
    except FolderBusy as busy:
        raise TrainfitError(f"{output} is in use by a running trainfit tune ({busy.holder})",
                            "wait for it to finish (or stop it), or use --output NEW_FOLDER") from None


JOURNAL_SUFFIX = ".journal"
"""``--storage PATH`` ending in this (no ``scheme://``) is a journal file that several runs on one
machine share (Optuna's ``JournalFileBackend``, its appends under a file lock)."""


def is_journal(url: str) -> bool:
    """Does ``--storage url`` name a journal file, not a database?"""
    return "://" not in url and url.endswith(JOURNAL_SUFFIX)


def masked(url: str) -> str:
    """A database URL fit to print: its password hidden (a journal file's path as it is)."""
    if is_journal(url):
        return url
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def open_storage(url: str, on_stale: Callable[[Any, Any], None] | None = None,
                 on_outage: Callable[[Any], None] | None = None, patience_s: float = PATIENCE_S) -> Any:
    """The Optuna storage behind ``--storage URL``: a clear error for a bad URL, a missing driver
    or an unreachable server, and a retry while several runs create a new database's tables at
    the same moment (the loser's insert fails).

    Its heartbeat is on (every ``HEARTBEAT_S`` seconds, stale after three missed): runs on other
    machines tell a trial that a live run is probing from one whose machine died by the heartbeats
    recorded in the database, on the database's clock. ``on_stale(study, trial)`` is called for each
    stale trial this process closes; it does not queue the trial again (see :meth:`~trainfit.search.study.TrialStore.ask`).
    A server that cannot be reached at the start is waited for, as one mid-search is: at most
    ``patience_s``, with ``on_outage`` told when the wait begins and ends.
    Once open, a database that stops answering is waited for (:func:`~trainfit.search.reconnect.reconnecting`;
    ``on_outage`` gets its ``StorageLost`` and ``StorageBack``).

    A journal file (``*.journal``) has no heartbeat: the runs sharing it are told alive by their
    process, so they must run on one machine (see :func:`~trainfit.search.claims.abandoned`)."""
    import sqlalchemy.exc

    if is_journal(url):
        if not Path(url).parent.is_dir():
            raise TrainfitError(f"--storage {url}: the folder {Path(url).parent} does not exist",
                                "create it, or give a journal file in a folder that exists")
        return journal_storage(Path(url))
    try:
        shown = masked(url)
    except sqlalchemy.exc.ArgumentError:
        raise TrainfitError(f"--storage {url!r} is not a database URL or a journal file",
                            "e.g. postgresql://user:password@host/db across machines, or PATH.journal (or "
                            "sqlite:///study.db) on one machine") from None
    outage = on_outage or (lambda event: None)
    opening = retried(functools.partial(_rdb_storage, url, on_stale), shown, outage, patience_s=patience_s,
                      hint="check that the database server is up and the URL is right")
    try:
        return reconnecting(opening(), shown, outage)
    except ImportError as err:
        raise TrainfitError(f"no database driver installed for --storage {shown} ({_missing(err)})",
                            _driver_hint(url)) from None


def _rdb_storage(url: str, on_stale: Callable[[Any, Any], None] | None) -> Any:
    """:func:`_new_rdb_storage`, tried again (5 times in all) where several runs created a new database's
    tables at the same moment and this one lost the race. A database that cannot be opened for a cause
    no wait changes (a wrong password, a database, host name or SQLite folder that does not exist) is an
    error at once; only a server that is away (:func:`_away`) is left to the caller's wait."""
    for attempt in range(1, 6):
        try:
            return _new_rdb_storage(url, on_stale)
        except Exception as err:
            if _lost_race(err) and attempt < 5:
                time.sleep(0.2 * attempt)
                continue
            reason = unreachable(err)
            if reason is not None and not _away(url, reason):
                raise TrainfitError(f"cannot open --storage {masked(url)}: {reason}",
                                    "check the URL: its host, user, password and database (which must exist: "
                                    "CREATE DATABASE NAME), or a SQLite file's folder") from None
            raise
    raise AssertionError("unreachable")


AWAY = ("connection refused", "no such file or directory", "is the server running", "starting up", "shutting down",
        "timeout expired", "timed out", "server closed the connection", "can't connect to", "lost connection",
        "connection reset", "network is unreachable", "no route to host", "in recovery mode")
"""How drivers word a server that is not answering now (libpq, psycopg, the MySQL clients): a restart, a
failover, a network cut. Anything else a server or driver says at the opening (a refused password, a
missing database, a host name no resolver knows) is said at once."""


def _away(url: str, reason: str) -> bool:
    """Is the database server of ``url`` away now (a wait may see it back), going by the driver's words?
    Never for SQLite (a file on this machine is not restarting), nor for a Unix socket in a folder that
    does not exist."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return False
    socket = parsed.query.get("host") or parsed.host or ""
    if isinstance(socket, str) and socket.startswith("/") and not Path(socket).is_dir():
        return False  # a Unix socket's folder that does not exist: no server is coming there
    text = reason.lower()
    return any(words in text for words in AWAY)


def _new_rdb_storage(url: str, on_stale: Callable[[Any, Any], None] | None) -> Any:
    """Optuna's ``RDBStorage`` of ``url``, its heartbeat on. A server database's connections are
    checked before each use (``pool_pre_ping``: one closed by a server's restart or an idle timeout
    is replaced, not failed on), and PostgreSQL's connecting gives up after ``CONNECT_TIMEOUT_S``
    (libpq waits for ever on a host that drops its packets) unless the URL says otherwise."""
    import optuna
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    engine: dict[str, Any] = {}
    if parsed.get_backend_name() != "sqlite":
        engine["pool_pre_ping"] = True
    if parsed.get_backend_name() == "postgresql" and "connect_timeout" not in parsed.query:
        engine["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
    with warnings.catch_warnings():  # the heartbeat is "experimental" since optuna 2.9
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RDBStorage(url, engine_kwargs=engine, heartbeat_interval=claims.HEARTBEAT_S,
                                          grace_period=3 * claims.HEARTBEAT_S, heartbeat_stale_trial_callback=on_stale)


CONNECT_TIMEOUT_S = 10
"""Seconds PostgreSQL's driver tries to connect before it gives up (and the call is retried)."""


DUPLICATE = ("42P07", "42710")
"""PostgreSQL's codes of a table (``duplicate_table``) or a type (``duplicate_object``) that exists
already: what a run that creates a new database's tables meets when another run created them first."""


def _lost_race(err: Exception) -> bool:
    """Did creating a new database's tables fail because another run created them at the same
    moment? (A unique key of the catalogue, PostgreSQL's table or type that exists already, SQLite's
    table that exists already or its file locked by the other run's writing.)"""
    import sqlalchemy.exc

    if isinstance(err, sqlalchemy.exc.IntegrityError):
        return True
    orig = getattr(err, "orig", None)
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)  # psycopg 3, psycopg2
    if isinstance(err, sqlalchemy.exc.OperationalError) and type(orig).__module__.startswith("sqlite3"):
        return any(words in str(orig) for words in SQLITE_RACE)
    return isinstance(err, sqlalchemy.exc.ProgrammingError) and code in DUPLICATE


SQLITE_RACE = ("already exists", "database is locked")
"""How SQLite words what a run meets when another creates the same file's tables at the same moment."""


def _missing(err: ImportError) -> str:
    """The module a failed import of a database driver lacked (Optuna wraps the driver's ImportError)."""
    cause = err.__cause__ if isinstance(err.__cause__, ImportError) else err
    return f"no module {cause.name!r}" if cause.name else str(cause)


def _driver_hint(url: str) -> str:
    """How to install the driver ``url`` names."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgresql+psycopg"):  # psycopg 3: SQLAlchemy 2.1's for postgresql://
        return "pip install 'trainfit[postgres]'"
    if parsed.get_backend_name() == "postgresql":
        return (f"install the driver {parsed.get_driver_name()}, or use a postgresql:// URL with "
                "pip install 'trainfit[postgres]'")
    return "install the URL's database driver, e.g. pip install pymysql (MySQL)"


def other_studies(summaries: Sequence[Any], name: str, doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every other study that recorded its spec, with the keys where it differs from this one (a
    knob added since that study began, at its default here, is no difference; nor is a run limit,
    ``tune.max_trials`` say, which is not part of what a study measures) and its search."""
    limits = {f"tune.{name}" for name in RUN_LIMITS}
    return [{"name": o.study_name, "spec_file": o.user_attrs.get("spec_file"),
             "differs": [k for k in differing_keys(o.user_attrs["spec"], doc)
                         if k not in limits and not _new_default(k, o.user_attrs["spec"], doc)],
             "search": _ran(o.user_attrs["spec"])}
            for o in summaries if o.study_name != name and "spec" in o.user_attrs]


def _ran(doc: Any) -> str | None:
    """The search a study's spec ``doc`` ran and its target effective batch, as spec lines (None: none)."""
    if not isinstance(doc, dict) or not doc.get("search"):
        return None
    target = (doc.get("tune") or {}).get("target_effective_batch")
    return f"search: {json.dumps(doc['search'])}" + (f" and tune: {{target_effective_batch: {target}}}" if target else "")


def _new_default(key: str, before: Any, now: Any) -> bool:
    """``params.KNOB`` absent from ``before`` (recorded before the knob existed) and at its default in ``now``."""
    section, _, knob = key.partition(".")
    if section != "params" or knob not in KNOBS or not isinstance(before, dict) or not isinstance(now, dict):
        return False
    had = before.get("params") or {}
    return knob not in had and (now.get("params") or {}).get(knob) == Params().to_dict()[knob]


def refuse_to_open(name: str, *, output: Path, storage: str | None, existing: list[str],
                    others: list[dict[str, Any]], resume: bool, join: bool, emptied: bool = False) -> None:
    """Raise when this run may not start or continue study ``name`` there: it exists and neither
    ``--resume`` nor ``--join`` was given, there is nothing to resume, or the output folder holds
    another spec's study or an earlier run's results without their study.

    ``emptied``: the output folder's journal is there but empty (0 bytes): its study lost every
    trial. ``--resume`` begins it again there (the run names the trials it lost, see
    :meth:`~trainfit.search.study.TrialStore.lost`); without, the refusal says so, not "nothing to resume"."""
    where = masked(storage) if storage else str(output)
    if join and storage is None:
        raise TrainfitError("--join is for runs sharing a --storage", "add --storage URL, or use --resume")
    # --join starts the study or continues it: every machine of a job array runs one command.
    if name in existing and not (resume or join):
        raise TrainfitError(f"{where} already holds this tuning study",
                            "pass --resume to continue it, or --output NEW_FOLDER to start afresh")
    if resume and name not in existing and not emptied:
        if existing and storage is None:
            changed = sorted({k for o in others for k in o["differs"]})
            what = (f"changed: {', '.join(changed)}" if changed else
                    "model, data, budget, probe settings, params or search space differ")
            searches = [o["search"] for o in others if o["search"]]
            pin = (f"; if your spec has no search: section, trainfit's default search changed since (it may now "
                   f"add knobs the data calls for): give the one that study ran, {searches[0]}"
                   if changed and all(k.startswith("search.") for k in changed) and len(searches) == 1 else "")
            raise TrainfitError(f"the spec changed since this study started ({what}), so its trials "
                                "do not apply", f"restore the spec, or use --output NEW_FOLDER{pin}")
        raise TrainfitError(f"nothing to resume in {where}",
                            "drop --resume to start a new study (or --join, to start or join one)")
    if existing and storage is None and name not in existing:
        raise TrainfitError(f"{output} holds a study of a different spec; its outputs would be overwritten",
                            "use --output NEW_FOLDER")
    results = [f for f in ("summary.json", "trials.csv") if (output / f).exists()]
    if results and name not in existing and not (resume or join):  # a --storage run's, or a lost journal
        if emptied:
            raise TrainfitError(f"{output / 'study.journal'} is empty: the study of the results in {output} "
                                f"({', '.join(results)}) lost every trial it held",
                                "pass --resume to begin it again there (the trials trials.csv shows are probed "
                                "again), or use --output NEW_FOLDER to start afresh")
        raise TrainfitError(f"{output} holds the results of an earlier run ({', '.join(results)}) but not its "
                            "study, so this run would overwrite them",
                            "use --output NEW_FOLDER (if that run used --storage URL, continue it with the same "
                            "--storage and --resume)")


def same_data(spec: Spec, began_on: str | None, shared: bool) -> str | None:
    """The fingerprint of the spec's data (None without data); an error when the study began on
    other data (``began_on``: its fingerprint, None for a new study or one begun before them)."""
    data = data_fingerprint(spec)
    if data is not None and began_on is not None and data != began_on:
        assert spec.data is not None
        raise TrainfitError(
            f"the data at {spec.data.path} changed since this study began (its size or content differ), so "
            "new measurements would mix with old ones",
            "every machine must read the same data (a shared filesystem, or identical copies); to start afresh "
            "on this data, put it at another path" if shared else
            "resume with the data the study began with, or start afresh with --output NEW_FOLDER")
    return data

