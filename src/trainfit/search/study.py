"""Trials persisted in an Optuna study: every probe is stored as it ends, and a study can be
resumed after Ctrl-C or a crash (a trial cut off mid-probe is retried).

OOM and over-budget configs are COMPLETE trials with a violated ``memory`` constraint
(``trial.set_constraint``), never FAIL trials, which Optuna's samplers ignore and so propose
again. Every trial carries the same constraint key, as GPSampler requires, and a param of every
searched knob in the knob's one distribution, as Optuna's samplers require to model it (a value
off the grid is told with a stand-in choice, the real one kept in the trial's ``values``).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import math
import os
import shutil
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from trainfit.errors import TrainfitError
from trainfit.files import FolderBusy, lock_folder, naming, write_atomically
from trainfit.params import Params
from trainfit.probe.measurement import Measurement, read_measurement
from trainfit.search.strategies import Trial, config_key, jsonable
from trainfit.space import SearchSpace
from trainfit.spec import Spec
from trainfit.summary import Malformed, check_bounds, check_finite, typed

CONSTRAINT = "memory"
HEARTBEAT_S = 30
"""Seconds between the heartbeats Optuna records for a trial a run of a shared ``--storage`` is
probing (the RDBStorage's ``heartbeat_interval``, a whole number). A trial with none for three
intervals (its ``grace_period``) is stale: its run is gone, and its config is open again."""


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


def constraint_value(m: Measurement) -> float:
    """<= 0 when the config fits; the relative overshoot otherwise (1.0 for OOM and failures)."""
    if m.status != "ok":
        return 1.0
    if m.budget_memory_gb is None or m.peak_memory_gb is None:
        return -1.0
    return (m.peak_memory_gb + (m.budget_headroom_gb or 0.0) - m.budget_memory_gb) / m.budget_memory_gb


def data_fingerprint(spec: Spec) -> str | None:
    """The identity of the spec's dataset content (its size and bytes sampled through each file;
    not its modification time, so a copy or a ``touch`` is the same data), or None for a spec
    without data. Stored with a study, so ``--resume`` on changed data at the same path does not
    mix old and new measurements."""
    if spec.data is None:
        return None
    from trainfit.data.readers import fingerprint

    return fingerprint(spec.data.path, times=False)


@dataclass(frozen=True, kw_only=True)
class JournalDamage:
    """The first line of a study journal that is not a complete entry."""

    line: int
    """Its number, from 1."""
    lines: int
    """Lines in the file, a last one without its newline included."""
    reason: str
    """What is wrong with it, in words."""
    good_bytes: int
    """Length of the lines before it: what dropping it (and all after it) keeps."""
    tail: bool
    """No complete entry follows it: dropping it and the rest loses no entry."""


def _entry_problem(line: bytes) -> str | None:
    """Why ``line`` (with its newline) is not an entry Optuna's journal can replay, or None."""
    if not line.endswith(b"\n"):
        return "no line end: a write cut off"
    try:
        entry = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as err:
        return f"not UTF-8 text: byte {err.start + 1}"
    except json.JSONDecodeError as err:
        return f"not JSON: {err.msg} at column {err.colno}"
    return None if isinstance(entry, dict) and "op_code" in entry else "not a journal entry"


def journal_damage(journal: Path) -> JournalDamage | None:
    """The first bad line of ``journal``, or None. Read whole before Optuna reads or writes a byte:
    its reader raises a bare JSONDecodeError or UnicodeDecodeError on a bad line that has others
    after it, and appends after a bad last line, which makes it a bad line with others after it."""
    data = journal.read_bytes()
    lines = [line + b"\n" for line in data.split(b"\n")]
    lines[-1] = lines[-1][:-1]  # what follows the last newline: nothing, or a line cut off
    if not lines[-1]:
        lines.pop()
    good_bytes = 0
    for number, line in enumerate(lines, start=1):
        reason = _entry_problem(line)
        if reason is not None:
            tail = all(_entry_problem(rest) is not None for rest in lines[number:])
            return JournalDamage(line=number, lines=len(lines), reason=reason, good_bytes=good_bytes, tail=tail)
        good_bytes += len(line)
    return None


def _backup_path(journal: Path) -> Path:
    """``study.journal.bak-YYYYmmdd-HHMMSS`` beside it, numbered on if that one exists."""
    base = journal.with_name(f"{journal.name}.bak-{time.strftime('%Y%m%d-%H%M%S')}")
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def mend_journal(journal: Path, resume: bool) -> dict[str, Any] | None:
    """Make the output folder's journal safe to load and append to, or refuse, leaving it as it is.

    On ``--resume``, a damaged tail (a write cut off by a crash, junk appended after the last
    entry) is dropped after a byte-for-byte backup: it holds no complete entry, and a trial whose
    last entry it was is retried. A bad line with entries after it is refused with the command that
    keeps the lines before it (what follows them is lost, so the user decides). Without
    ``--resume`` the folder holds a study and is refused as such. Returns the repair made (for the
    run to report) or None."""
    damage = journal_damage(journal)
    if damage is None:
        return None
    where = f"{journal} is damaged at line {damage.line} of {damage.lines} ({damage.reason})"
    if not resume:
        raise TrainfitError(f"{journal.parent} already holds a tuning study, and {where}",
                            "pass --resume to continue it (a damaged tail is dropped, with a backup), or "
                            "--output NEW_FOLDER to start afresh")
    backup = _backup_path(journal)
    if not damage.tail:
        import shlex

        keep, src, bak = damage.line - 1, shlex.quote(str(journal)), shlex.quote(str(backup))
        raise TrainfitError(f"{where}, with good entries after it, so the study cannot be loaded; the file is left "
                            "as it is", f"keep the {keep} lines before it and --resume (trials recorded after it are "
                            f"lost): cp {src} {bak} && head -n {keep} {bak} > {src}; "
                            "or use --output NEW_FOLDER to start afresh")
    shutil.copy2(journal, backup)
    # all at once: a crash leaves the old file or the repaired one
    write_atomically(journal, journal.read_bytes()[:damage.good_bytes])
    return {"journal": str(journal), "line": damage.line, "lines": damage.lines, "reason": damage.reason,
            "backup": str(backup)}


def journal_storage(journal: Path) -> Any:
    """The Optuna storage of the output folder's journal, replayed once: an entry it cannot replay
    (well-formed but inconsistent) is a clear error before anything is appended."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    class NamedJournalFile(JournalFileBackend):
        """Optuna's journal file, whose refused appends name it: the OSError of a full disk
        (raised by the write, not the open) names no file, and the user is told which one."""

        def append_logs(self, logs: list[dict[str, Any]]) -> None:
            with naming(journal):
                super().append_logs(logs)

    try:
        return JournalStorage(NamedJournalFile(str(journal)))
    except Exception as err:  # noqa: BLE001 - any replay failure: the file is left as it is
        raise TrainfitError(f"{journal} cannot be replayed ({type(err).__name__}: {err}); the file is left as it is",
                            "use --output NEW_FOLDER to start afresh") from None


def record_problem(trial: Any, names: Sequence[str]) -> str | None:
    """Why a measured trial's record (what :meth:`TrialStore.tell` stores: its measurement, values
    and objective) cannot be read back, or None. A journal edited by hand or by a tool can hold valid
    JSON of any type there, which would fail far from here (a traceback in the ranking), or a speed
    of NaN or below 0, which would rank first. Tune and plan both leave out a trial this flags."""
    attrs = trial.user_attrs
    try:
        read_measurement(attrs.get("measurement"))
        values = typed(dict[str, Any | None], attrs.get("values", trial.params), "values", nullable=False)
        if missing := sorted(set(names) - set(values)):
            raise Malformed("values", f"no {', '.join(missing)}")
        for name in names:
            if isinstance(values[name], (dict, list)):
                raise Malformed(f"values.{name}", f"a JSON {'object' if isinstance(values[name], dict) else 'list'}"
                                                  " where a searched value belongs")
        objective = typed(float | None, attrs.get("objective"), "objective")
        check_finite({"objective": objective})
        check_bounds("objective", objective, {"at_least": 0})
    except Malformed as err:
        return str(err)
    return None


def recorded_key(trial: Any, names: Sequence[str]) -> str | None:
    """The config key of a trial whose record may be damaged (see :func:`record_problem`): of its
    stored values where they hold every searched name, as the history keys them, else of Optuna's
    own params; None where neither does."""
    values = trial.user_attrs.get("values", trial.params)
    if not (isinstance(values, dict) and set(names) <= set(values)):
        values = {k: trial.params[k] for k in names if k in trial.params}
    return config_key(values) if set(names) <= set(values) else None


def recorded_trials(table: Path) -> list[int]:
    """The trial numbers in a tune's trials.csv (written after every trial, from the study), or
    none where it is missing or unreadable: it only cross-checks the journal."""
    try:
        with table.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error):
        return []
    return sorted({int(r["trial"]) for r in rows if r.get("measurement") == "1" and str(r.get("trial")).isdigit()})


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


def trial_values(trial: Any, names: Sequence[str]) -> dict[str, Any] | None:
    """A trial's searched values: those stored with it (``values``, set when it is asked for with
    them and when it is told), else its params; None while they are not all stored (being asked for)."""
    stored = trial.user_attrs.get("values")
    values = dict(stored) if isinstance(stored, dict) else {k: trial.params[k] for k in names if k in trial.params}
    return {k: values[k] for k in names} if set(names) <= set(values) else None


def holds(distribution: Any, value: Any) -> bool:
    """Can an Optuna ``distribution`` hold ``value`` as a param (a choice of it, or in its range)?"""
    import optuna

    if isinstance(distribution, optuna.distributions.CategoricalDistribution):
        return any(c == value and type(c) is type(value) for c in distribution.choices)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return bool(distribution._contains(distribution.to_internal_repr(value)))  # its range and its step


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def constraint_problem(trial: Any) -> str | None:
    """Why a sampler cannot read a measured trial's constraints, or None: :meth:`TrialStore.tell`
    gives every trial one, ``memory``, a number (GPSampler requires one same set on every trial).
    A journal edited by hand can hold another type there, or none, and GPSampler then raises a bare
    TypeError or ValueError from inside ``ask``. Read from the system attrs Optuna keeps them in
    (``constraints:KEY``): a wrong-typed one of its older form (``constraints``) breaks even
    ``trial.constraints``."""
    stored = {k: v for k, v in trial.system_attrs.items() if k == "constraints" or k.startswith("constraints:")}
    key = f"constraints:{CONSTRAINT}"
    if set(stored) != {key}:
        return f"the constraints {sorted(stored)}, not [{key!r}]"
    value = stored[key]
    if not _number(value) or math.isnan(value):
        return f"a {CONSTRAINT} constraint of {value!r}, not a number"
    return None


def stand_in(distribution: Any, value: Any, fits: bool) -> Any | None:
    """The choice of a categorical ``distribution`` that a trial holds as its param in place of
    ``value``, a number it cannot hold (``auto``'s integer batch between two of the grid's), or
    None where no choice is a number. Optuna's samplers model a knob only where every measured trial
    holds it in one same distribution (its intersection search space): a trial without it would
    drop the knob from the model for every trial. The real value stays in the trial's ``values``
    (:func:`trial_values`), which every record of trainfit reads.

    A categorical knob has no place between two choices, so the stand-in is one on the side of the
    grid the trial's outcome holds for, memory growing with the batch: the largest choice below
    ``value`` for a config that ``fits``, the smallest above for one that does not (the nearest on
    the other side where that side has none). The sampler's model then learns no grid point to fit
    that does not, or to fail that fits; the choice below a fitting batch was measured on the way up,
    so the sampler proposing it again costs no probe."""
    import optuna

    if not isinstance(distribution, optuna.distributions.CategoricalDistribution) or not _number(value):
        return None
    numbers: list[Any] = [c for c in distribution.choices if _number(c)]  # ints or floats: comparable
    below, above = [c for c in numbers if c < value], [c for c in numbers if c > value]
    if fits:
        return max(below) if below else min(above, default=None)
    return min(above) if above else max(below, default=None)


def ask_trial(study: Any, distributions: Mapping[str, Any], values: Mapping[str, Any] | None,
              heartbeat_in: Any = None) -> Any:
    """A new trial of ``study`` stamped with its ``owner``: with ``values`` fixed, or else the next
    queued trial or the sampler's choice.

    Fixed values go through ``PartialFixedSampler``, not the study's queue: a queued trial is
    popped by whichever run of a shared storage asks first, and over SQLite two runs can pop the
    same one. A new trial is each run's own (one insert), though it has no params for a moment.

    In a shared storage (``heartbeat_in``) the trial's first heartbeat is recorded before its
    ``owner``: a trial with an owner has a heartbeat for Optuna to judge (see :func:`abandoned`).
    Another run can close a trial while it is asked for (it judges the trial's start by its own
    clock: a machine in another time zone sees it hours old): then a new one is asked for."""
    import optuna

    for attempt in range(5):
        try:
            trial = _ask(study, distributions, values)
            if heartbeat_in is not None:
                heartbeat_in.record_heartbeat(trial._trial_id)
            trial.set_user_attr("owner", owner_id())
            return trial
        except optuna.exceptions.UpdateFinishedTrialError:
            if attempt == 4:
                raise
    raise AssertionError("unreachable")


def _ask(study: Any, distributions: Mapping[str, Any], values: Mapping[str, Any] | None) -> Any:
    import optuna

    sampler = study.sampler
    if values is not None:
        with warnings.catch_warnings():  # "experimental" since optuna 2.4
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.sampler = optuna.samplers.PartialFixedSampler(dict(values), sampler)
    try:
        with warnings.catch_warnings():
            # A heartbeat storage warns on every ask that its heartbeat "is supposed to be used with
            # Study.optimize": ask and tell alone neither record heartbeats nor close stale trials.
            # The callers do both, as optimize does (heartbeat, abandoned).
            warnings.filterwarnings("ignore", "Heartbeat of storage is supposed to be used", UserWarning)
            return study.ask(dict(distributions))
    finally:
        study.sampler = sampler


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
        storage.record_heartbeat(trial._trial_id)
        time.sleep(0.1)
    return answer


def closed_elsewhere(storage: Any, trial: Any) -> bool:
    """Has another run closed ``trial`` (this run's, still in its hands)? A run that looked
    abandoned, its machine paused past the heartbeat's grace period or its start misread on
    another clock, is closed as FAIL by the runs that share its storage (see :func:`abandoned`)."""
    return bool(storage.get_trial(trial._trial_id).state.is_finished())


@contextlib.contextmanager
def heartbeat(storage: Any, trial: Any) -> Iterator[None]:
    """Record ``trial``'s heartbeat in ``storage`` (an :func:`open_storage`) at once and then every
    ``HEARTBEAT_S`` seconds while the block runs, as ``Study.optimize`` does around its objective
    (Optuna's heartbeat thread is private): other runs tell a live trial (however long its work)
    from one whose machine died (stale after three missed beats)."""
    stop = threading.Event()

    def beat() -> None:
        while True:
            with contextlib.suppress(Exception):  # the storage is unreachable: the work goes on; next beat
                storage.record_heartbeat(trial._trial_id)  # the storage API takes its id, not its number
            if stop.wait(HEARTBEAT_S):
                return

    thread = threading.Thread(target=beat, name="trainfit-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _lock_folder(output: Path) -> IO[str]:
    """Hold ``output/.lock`` for this run, or say which run holds it."""
    try:
        return lock_folder(output)
    except FolderBusy as busy:
        raise TrainfitError(f"{output} is in use by a running trainfit tune ({busy.holder})",
                            "wait for it to finish (or stop it), or use --output NEW_FOLDER") from None


def masked(url: str) -> str:
    """A database URL fit to print: its password hidden."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def open_storage(url: str, on_stale: Callable[[Any, Any], None] | None = None) -> Any:
    """The Optuna storage behind ``--storage URL``: a clear error for a bad URL, a missing driver
    or an unreachable server, and a retry while several runs create a new database's tables at
    the same moment (the loser's insert fails).

    Its heartbeat is on (every ``HEARTBEAT_S`` seconds, stale after three missed): runs on other
    machines tell a trial that a live run is probing from one whose machine died by the heartbeats
    recorded in the database, on the database's clock. ``on_stale(study, trial)`` is called for each
    stale trial this process closes; it does not queue the trial again (see :meth:`TrialStore.ask`)."""
    import optuna
    import sqlalchemy.exc

    try:
        shown = masked(url)
    except sqlalchemy.exc.ArgumentError:
        raise TrainfitError(f"--storage {url!r} is not a database URL",
                            "e.g. postgresql://user:password@host/db, or sqlite:///study.db on one machine") from None
    for attempt in range(5):
        try:
            with warnings.catch_warnings():  # the heartbeat is "experimental" since optuna 2.9
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(url, heartbeat_interval=HEARTBEAT_S, grace_period=3 * HEARTBEAT_S,
                                                  heartbeat_stale_trial_callback=on_stale)
        except ImportError:
            raise TrainfitError(f"no database driver installed for --storage {shown}",
                                "install one, e.g. pip install psycopg2-binary (PostgreSQL) or pymysql (MySQL)"
                                ) from None
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError) as err:
            if attempt == 4:
                raise TrainfitError(f"cannot open --storage {shown}: {str(err.orig).splitlines()[0]}",
                                    "check that the database server is up and the URL is right") from None
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def _other_studies(summaries: Sequence[Any], name: str, doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every other study that recorded its spec, with the keys where it differs from this one."""
    return [{"name": o.study_name, "spec_file": o.user_attrs.get("spec_file"),
             "differs": differing_keys(o.user_attrs["spec"], doc)}
            for o in summaries if o.study_name != name and "spec" in o.user_attrs]


def _refuse_to_open(name: str, *, output: Path, storage: str | None, existing: list[str],
                    others: list[dict[str, Any]], resume: bool, join: bool, emptied: bool = False) -> None:
    """Raise when this run may not start or continue study ``name`` there: it exists and neither
    ``--resume`` nor ``--join`` was given, there is nothing to resume, or the output folder holds
    another spec's study or an earlier run's results without their study.

    ``emptied``: the output folder's journal is there but empty (0 bytes): its study lost every
    trial. ``--resume`` begins it again there (the run names the trials it lost, see
    :meth:`TrialStore.lost`); without, the refusal says so, not "nothing to resume"."""
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
            raise TrainfitError(f"the spec changed since this study started ({what}), so its trials "
                                "do not apply", "restore the spec, or use --output NEW_FOLDER")
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


def _same_data(spec: Spec, began_on: str | None, shared: bool) -> str | None:
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


class TrialStore:
    def __init__(self, *, output: Path, spec: Spec, space: SearchSpace, objective: str, resume: bool,
                 storage: str | None, seed: int, sampler: Any = None, join: bool = False) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.space, self.objective = space, objective
        self.distributions = space.distributions()
        try:
            output.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise TrainfitError(f"cannot create the output folder {output}: {err.strerror}",
                                "choose another --output") from None
        self._lock: IO[str] | None = _lock_folder(output)
        try:
            self._open(output, spec, resume, storage, seed, sampler, join)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Release the output folder (another run may use it from now on)."""
        if self._lock is not None:
            self._lock.close()  # closing the file releases its flock
            self._lock = None

    def _open(self, output: Path, spec: Spec, resume: bool, storage: str | None, seed: int, sampler: Any,
              join: bool) -> None:
        import optuna

        self.shared = storage is not None
        journal = output / "study.journal"
        self.journal = None if self.shared else journal
        """The output folder's journal, the study's storage without --storage."""
        self.repaired = mend_journal(journal, resume) if not self.shared and journal.exists() else None
        """The damaged tail dropped from the journal (line, reason, backup), for the run to report."""
        self.emptied = emptied = not self.shared and journal.exists() and journal.stat().st_size == 0
        """The journal was there but empty (0 bytes): its study, if it had one, lost every trial."""
        self.unreadable: dict[int, str] = {}
        """Measured trials whose record cannot be read back, by number, with why (:func:`record_problem`)."""
        self._unreadable_keys: dict[int, str] = {}
        """Their config keys, where readable (:func:`recorded_key`): a config measured again since is
        no longer lost (see :meth:`lost`)."""
        self._stale: list[int] = []
        """Trials this run closed because Optuna's heartbeat found them stale (their numbers)."""
        self.storage = (open_storage(storage, lambda study, trial: self._stale.append(trial.number)) if storage
                        else journal_storage(journal))
        self.where = masked(storage) if storage else str(journal)  # a URL open_storage has checked
        """The study's storage, in words: the journal, or the --storage URL with its password hidden."""
        self.name = study_name(spec)
        summaries = optuna.get_all_study_summaries(self.storage) if storage or journal.exists() else []
        existing = [s.study_name for s in summaries]
        doc = {k: v for k, v in spec.to_dict().items() if k != "source"}
        others = _other_studies(summaries, self.name, doc)
        _refuse_to_open(self.name, output=output, storage=storage, existing=existing, others=others,
                        resume=resume, join=join, emptied=emptied)
        began_on = next((s.user_attrs.get("data_fingerprint") for s in summaries if s.study_name == self.name), None)
        data = _same_data(spec, began_on, self.shared)
        self._start_study(spec, doc, others, new=self.name not in existing, data=data, began_on=began_on,
                          seed=seed, sampler=sampler)

    def _start_study(self, spec: Spec, doc: dict[str, Any], others: list[dict[str, Any]], *, new: bool,
                     data: str | None, began_on: str | None, seed: int, sampler: Any) -> None:
        """Create or load the study, record what later runs compare with, and retry the trials a
        crash left running."""
        import optuna

        spec_file = Path(spec.source).name if spec.source else None
        # The sampler only chooses for the bayes strategy; the others fix every trial's values.
        sampler = sampler or optuna.samplers.GPSampler(seed=seed, n_startup_trials=5)
        self.study = optuna.create_study(study_name=self.name, storage=self.storage, direction="maximize",
                                         sampler=sampler, load_if_exists=True)
        self.others: list[dict[str, Any]] = []
        """Other studies of the same spec file in a shared storage, with the keys that differ
        (machines of one job array given different options search apart)."""
        if new:  # what a later run compares its spec with
            self.study.set_user_attr("spec_file", spec_file)
            self.study.set_user_attr("spec", doc)
        if data is not None and began_on is None:  # a new study, or one begun before fingerprints: from now on
            self.study.set_user_attr("data_fingerprint", data)
        if self.shared:
            self.others = [{"name": o["name"], "differs": o["differs"]} for o in others
                           if spec_file is not None and o["spec_file"] == spec_file]
        self.retried = self._retry_interrupted()

    def _retry_interrupted(self) -> int:
        """A trial left RUNNING by a crash or Ctrl-C is closed as FAIL and retried; how many.

        With the output folder's journal, holding the folder's lock means no other run is live,
        so every RUNNING trial is stale, and it is queued again. A shared ``--storage`` may hold
        trials that another machine is probing right now: only abandoned ones are closed (see
        :meth:`_live_trials`), and not queued (two runs could pop one queued trial): its config,
        unmeasured, is simply open to be proposed again."""
        from optuna.trial import TrialState

        if self.shared:
            return self._live_trials()[1]
        stale = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        for t in stale:
            self.study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
            stored = t.user_attrs.get("values")  # an integer batch past the grid is not among its params
            self.study.enqueue_trial(t.params, user_attrs={"values": stored} if stored else None, skip_if_exists=False)
        return len(stale)

    def _live_trials(self) -> tuple[list[Any], int]:
        """The RUNNING trials of a shared storage that live runs are probing, and how many abandoned
        ones this call closed as FAIL first: those Optuna's heartbeat finds stale (the storage's
        ``fail_stale_trials``, as ``Study.optimize`` does before each trial), and those
        :func:`abandoned` knows sooner or which the heartbeat cannot judge."""
        import optuna
        from optuna.trial import TrialState

        closed = len(self._stale)
        with warnings.catch_warnings():  # "experimental" since optuna 2.9
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)  # each trial it closes goes in self._stale
        closed = len(self._stale) - closed
        live = []
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if not abandoned(t):
                live.append(t)
                continue
            # another run may close it at the same moment (as fail_stale_trials allows for)
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                self.study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
                closed += 1
        return live, closed

    def in_flight(self) -> set[str]:
        """Config keys that other live runs of a shared ``--storage`` are probing right now (so
        this run probes something else). Empty for the output folder's own journal: the folder
        lock means no other run is live."""
        if not self.shared:
            return set()
        return {self._key(t) for t in self._others_running()}

    def claimed_elsewhere(self, trial: Any) -> bool:
        """Did another run measure the config of ``trial`` since this run last looked, or ask for
        it before ``trial`` (two runs proposed it at the same moment)? The earlier trial keeps
        it; see :meth:`drop`."""
        from optuna.trial import TrialState

        if not self.shared:
            return False
        key = self._key(trial)

        def look() -> bool | None:
            # running ones first: an earlier trial that ends between the two reads is still seen, as measured
            earlier = [t for t in self._others_running() if t.number < trial.number]
            measured = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if any(self._key(t) == key for t in (*earlier, *measured)):
                return True
            # An earlier trial still being asked for (a Bayesian sampler's fit can take seconds) has
            # not stored its values: it may be of this config. Past the wait it is left to that trial:
            # proposed again if that trial never probes it.
            return False if all(trial_values(t, self.space.names) is not None for t in earlier) else None

        return wait_beside(self.storage, trial, look, gone=True)

    def drop(self, trial: Any, reason: str = "claimed by another run") -> None:
        """Give up ``trial`` unprobed (its config is another run's, or the trial budget is spent): a
        FAIL trial, which holds no measurement, is left out of the history and which samplers ignore."""
        import optuna
        from optuna.trial import TrialState

        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):  # closed by another run: given up
            trial.set_user_attr("dropped", reason)
            self.study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)

    def over_budget(self, trial: Any, max_trials: int) -> bool:
        """Had ``max_trials`` trials claimed the trial budget before ``trial`` was asked for: the
        measured ones, plus those other live runs of a shared storage are probing (unmeasured
        configs) with a smaller number? The storage numbers trials in the order they are asked
        for, so of two runs that both saw one trial left, only the first to ask probes. Never with
        the output folder's journal: the folder lock means no other run is live."""
        if not self.shared:
            return False
        measured, running = self._claims()
        return self._claimed_before(trial.number, measured, running) >= max_trials

    def last_trials(self, max_trials: int) -> set[str]:
        """Configs that other live runs of a shared storage are probing within ``max_trials`` (not
        a --refine beyond it, nor a confirmation): the rest of this search, whose results belong in
        this run's summary."""
        if not self.shared:
            return set()
        measured, running = self._claims()
        return {self._key(t) for t in running if self._claimed_before(t.number, measured, running) < max_trials}

    def _claims(self) -> tuple[int, list[Any]]:
        """What counts against the trial budget: how many trials are measured, and the trials other
        live runs are probing whose configs are not (a repeat of a measured one is a confirmation),
        as the search loop's own count (measured plus busy) has it. The running ones are read first:
        one that ends between the two reads is counted once, as measured."""
        running = self._others_running()
        history = self.history()
        measured = {config_key(t.values) for t in history}
        return len(history), [t for t in running if self._key(t) not in measured]

    def _claimed_before(self, number: int, measured: int, running: Sequence[Any]) -> int:
        """Trials counted against the budget ahead of trial ``number``: the measured ones, and one
        per config in flight in a trial asked for before it."""
        return measured + len({self._key(t) for t in running if t.number < number})

    def _others_running(self) -> list[Any]:
        mine = owner_id()
        return [t for t in self._live_trials()[0] if t.user_attrs.get("owner") != mine]

    def _key(self, trial: Any) -> str:
        """The config key of ``trial``; one of its own for a trial whose values are not all stored
        yet (being asked for), so that two such trials count as two configs in flight."""
        values = trial_values(trial, self.space.names)
        if values is None:
            return config_key({"(being asked for)": trial._trial_id})
        return config_key(values)

    def _measured(self) -> list[Any]:
        """The COMPLETE trials holding a measurement whose record reads back. A measured trial's
        that does not (:func:`record_problem`) is left out, its config counted as never measured
        (probed again), and kept in ``unreadable`` for the run to report."""
        from optuna.trial import TrialState

        out = []
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t.user_attrs.get("measurement") is None:
                continue
            problem = record_problem(t, self.space.names)
            if problem is None:
                out.append(t)
            elif not t.user_attrs.get("reused"):  # a reused trial repeats a measured answer: nothing is lost
                self.unreadable.setdefault(t.number, problem)
                if (key := recorded_key(t, self.space.names)) is not None:
                    self._unreadable_keys[t.number] = key
        return out

    def history(self) -> list[Trial]:
        return [Trial(number=t.number, values=dict(t.user_attrs.get("values", t.params)),
                      measurement=Measurement.from_dict(t.user_attrs["measurement"]),
                      objective=t.user_attrs.get("objective"))
                for t in self._measured() if not (t.user_attrs.get("reused") or t.user_attrs.get("repeat"))]

    def repeats(self) -> dict[str, list[Measurement]]:
        """Confirmation measurements (``tell(..., repeat=True)``) by config key, in order."""
        out: dict[str, list[Measurement]] = {}
        for t in self._measured():
            if t.user_attrs.get("repeat"):
                out.setdefault(config_key(t.user_attrs.get("values", t.params)), []).append(
                    Measurement.from_dict(t.user_attrs["measurement"]))
        return out

    def lost(self, history: Sequence[Trial]) -> dict[int, str]:
        """Trials an earlier run measured that the study no longer holds readably, by number, with
        what is wrong, in order: a record of the wrong type (:func:`record_problem`), and, with the
        output folder's journal, a trial its trials.csv shows that the journal lacks (``history``:
        the study's trials): a line of it lost, or the whole file emptied. Their configs count as
        never measured, so the search probes them again. A damaged record stays in the journal (a
        finished trial cannot change): once its config is measured again (in ``history``), it is
        no longer lost, and a later resume does not name it again. trials.csv is written from the
        history, so a trial it lacks the journal lacked is named once."""
        measured = {config_key(t.values) for t in history}
        lost = {n: why for n, why in self.unreadable.items() if self._unreadable_keys.get(n) not in measured}
        if self.journal is not None:
            have = {t.number for t in history}
            for number in recorded_trials(self.journal.parent / "trials.csv"):
                if number not in have:
                    lost.setdefault(number, "in trials.csv, not in the journal: "
                                    + ("the journal was emptied" if self.emptied else "a line of it was lost"))
        return dict(sorted(lost.items()))

    @contextlib.contextmanager
    def beating(self, trial: Any) -> Iterator[None]:
        """While a probe of ``trial`` runs, its :func:`heartbeat` in a shared storage (nothing to
        do with the output folder's journal)."""
        if not self.shared:
            yield
            return
        with heartbeat(self.storage, trial):
            yield

    def ask(self, values: Mapping[str, Any] | None) -> Any:
        """A new trial: with ``values`` fixed, or else the next queued retry or the sampler's choice
        (see :func:`ask_trial`). Values are stored with the trial (:func:`trial_values`): a value
        its knob's distribution cannot hold (``auto``'s integer batch past the grid) is not one
        of its params while it is probed, so the sampler never draws one in its place; it is told
        with a :func:`stand_in` there. With the sampler's choice, a study whose measured trials it
        cannot read is refused first (:meth:`_check_constraints`)."""
        if values is None:
            values = self._queued_values()
        if values is None and not self.pending_queue():
            self._check_constraints()  # the sampler chooses: it reads every measured trial's constraint
        distributions = self.distributions if values is None else {
            k: d for k, d in self.distributions.items() if k not in values or holds(d, values[k])}
        trial = ask_trial(self.study, distributions, values, heartbeat_in=self.storage if self.shared else None)
        if values is not None:
            trial.set_user_attr("values", jsonable(values))
        return trial

    def _check_constraints(self) -> None:
        """Refuse, before the sampler is asked, a study holding a measured trial whose constraint it
        cannot read (:func:`constraint_problem`): a finished trial cannot change, and the sampler
        reads every one, so it cannot be left out as a damaged record is (:func:`record_problem`).
        The strategies that fix every value ask the sampler nothing."""
        from optuna.trial import TrialState

        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if (problem := constraint_problem(t)) is not None:
                raise TrainfitError(f"trial {t.number} of {self.where} holds {problem}, which Optuna's sampler (the "
                                    "bayes strategy) cannot read; the study is left as it is",
                                    "resume with --strategy auto, grid or random (they do not ask the sampler), "
                                    "or use --output NEW_FOLDER to start afresh")

    def _queued_values(self) -> dict[str, Any] | None:
        """The values stored with the retry that the next ask takes from the queue, if any."""
        from optuna.trial import TrialState

        waiting = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        stored = waiting[0].user_attrs.get("values") if waiting else None
        return dict(stored) if isinstance(stored, dict) else None

    def pending_queue(self) -> bool:
        from optuna.trial import TrialState

        return bool(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))

    def tell(self, trial: Any, values: Mapping[str, Any], m: Measurement, history: Sequence[Trial],
             reused: bool = False, repeat: bool = False) -> Trial:
        """Record a finished trial. ``reused``: the sampler re-proposed a measured (or excluded)
        config; the sampler is told again, but the trial is not a new measurement. ``repeat``: a
        confirmation measurement of a config already in the history (see :meth:`repeats`).
        A trial that another run closed while this one probed it (:func:`closed_elsewhere`) gives
        its measurement to a new trial of the same values: nothing measured is lost."""
        import optuna

        try:
            return self._tell(trial, values, m, history, reused, repeat)
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError):
            if not (self.shared and closed_elsewhere(self.storage, trial)):
                raise
        return self._tell(self.ask(values), values, m, history, reused, repeat)

    def _tell(self, trial: Any, values: Mapping[str, Any], m: Measurement, history: Sequence[Trial],
              reused: bool, repeat: bool) -> Trial:
        objective = getattr(m, self.objective) if m.status == "ok" else None
        if reused:
            trial.set_user_attr("reused", True)
        if repeat:
            trial.set_user_attr("repeat", True)
        constraint = constraint_value(m)
        trial.set_constraint(CONSTRAINT, constraint)
        trial.set_user_attr("measurement", m.to_dict())
        trial.set_user_attr("values", jsonable(values))
        trial.set_user_attr("objective", objective)
        self._stand_ins(trial, values, fits=constraint <= 0)
        self.study.tell(trial, objective if objective is not None and m.fits else self._impute(values, history))
        return Trial(number=trial.number, values=dict(values), measurement=m, objective=objective)

    def _stand_ins(self, trial: Any, values: Mapping[str, Any], fits: bool) -> None:
        """Give ``trial``, before it is told, a :func:`stand_in` param for each of its ``values`` that
        its knob's distribution cannot hold (asked for without it, see :meth:`ask`), so that the
        sampler's search space keeps the knob (a finished trial's params cannot change)."""
        for name, distribution in self.distributions.items():
            if name not in values or name in trial.params or holds(distribution, values[name]):
                continue
            choice = stand_in(distribution, values[name], fits)
            if choice is not None:  # Optuna's storage API: a Trial has no setter of a param it was not asked for
                trial.storage.set_trial_param(trial._trial_id, name, distribution.to_internal_repr(choice),
                                              distribution)

    def _impute(self, values: Mapping[str, Any], history: Sequence[Trial]) -> float:
        """For an infeasible trial: the best feasible objective of the same family at a smaller
        batch (a smooth surface for the GP instead of a cliff at 0)."""
        bs = values.get("batch_size")
        family = {k: v for k, v in values.items() if k != "batch_size"}
        same = [t.objective for t in history if t.feasible and t.objective is not None
                and all(t.values.get(k) == v for k, v in family.items())
                and (bs is None or t.values.get("batch_size", 0) < bs)]
        return max(same, default=0.0)

    def find(self, values: Mapping[str, Any], history: Sequence[Trial]) -> Trial | None:
        key = config_key(values)
        return next((t for t in history if config_key(t.values) == key), None)
