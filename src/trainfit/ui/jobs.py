"""Jobs: ``trainfit`` commands the UI started, each run by :mod:`trainfit.ui.supervise` in a session
of its own, so a job outlives a page reload and a restart of the UI. Everything about a job is in
its folder ``ROOT/.trainfit-ui/jobs/ID/``: ``job.json`` (:class:`Job`, written once at the start),
``output.log`` (the command's stdout and stderr) and ``exit.json`` (its exit status, written by the
supervisor when it ends). A new UI over the same root lists the same jobs."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from trainfit.errors import TrainfitError
from trainfit.files import write_atomically
from trainfit.ui.paths import Refused, Root, open_regular, prune_empty, read_regular
from trainfit.ui.supervise import COMMAND_FILE, EXIT_FILE, JOB_FILE, LOG_FILE

SCHEMA_VERSION = 1
INTERRUPTED = {130, 143, 129}
"""Exit statuses of a command stopped by Ctrl-C, SIGTERM or SIGHUP (what it measured is kept)."""
STOP_GRACE_S = 10.0
"""After SIGINT, how long a job has to stop (a checkpoint, the outputs of what was measured)
before SIGTERM follows."""
LOG_CHUNK = 256 * 1024
"""The most of a log one request returns: a page opened on a job shows the log's last ``LOG_CHUNK``
bytes (a 150 MB log took minutes to load), then asks for what was written since."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Job:
    """``job.json``: one command the UI started."""

    schema_version: int = SCHEMA_VERSION
    id: str
    """The job's folder name: start time, command, a random suffix."""
    command: str
    """The ``trainfit`` sub-command (``tune``, ``train``...)."""
    argv: list[str]
    """The whole command line, run without a shell."""
    cwd: str
    """The folder it runs in: the UI's root."""
    started_at: float
    """Unix time of the start."""
    output: str | None
    """The run folder it writes, root-relative (None: its files are in the job's folder)."""
    spec: str | None = None
    """The spec it ran, root-relative (for the page's links)."""
    pid: int = 0
    """The supervisor's pid, which leads the job's process group."""

    @property
    def args(self) -> list[str]:
        """The command's own arguments: the words after ``trainfit COMMAND``."""
        return self.argv[self.argv.index(self.command, len(run_module("trainfit"))) + 1:]

    @classmethod
    def from_json(cls, raw: Any) -> Job:
        """The job ``raw`` (``job.json`` read) describes, or :class:`TrainfitError` saying each field
        that is missing or not of its kind (a record cut short, edited by hand, or of another version)."""
        if not isinstance(raw, dict):
            raise TrainfitError(f"it holds a {type(raw).__name__}, not a job's fields")
        if raw.get("schema_version") != SCHEMA_VERSION:
            raise TrainfitError(f"its schema is {raw.get('schema_version')!r}, not {SCHEMA_VERSION}")
        if problems := _field_problems(raw):
            raise TrainfitError("; ".join(problems))
        return cls(**{f.name: raw[f.name] for f in dataclasses.fields(cls) if f.name in raw})


def _root_relative(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not Path(value).is_absolute() and ".." not in Path(value).parts)


_FIELD_CHECKS: dict[str, tuple[str, Any]] = {
    "id": ("a word", lambda v: isinstance(v, str) and v.replace("-", "").isalnum()),
    "command": ("a word", lambda v: isinstance(v, str) and v.isalpha()),
    "argv": ("a list of words", lambda v: isinstance(v, list) and all(isinstance(w, str) for w in v)),
    "cwd": ("a path", lambda v: isinstance(v, str)),
    "started_at": ("a time", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)),
    "output": ("a root-relative path or null", _root_relative),
    "spec": ("a root-relative path or null", _root_relative),
    "pid": ("a process id", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
}
"""What each field of ``job.json`` must be, in words and as a test (``spec`` and ``pid`` may be absent)."""


def _field_problems(raw: dict[str, Any]) -> list[str]:
    problems = [f"{name} is {raw[name]!r}, not {kind}" if name in raw else f"{name} is missing"
                for name, (kind, fits) in _FIELD_CHECKS.items()
                if (name in raw and not fits(raw[name])) or (name not in raw and name not in ("spec", "pid"))]
    if not problems and raw["command"] not in raw["argv"][len(run_module("trainfit")):]:
        problems.append(f"argv does not hold the command {raw['command']!r}")
    return problems


class Damaged(Refused):
    """A job's record (``job.json``, ``exit.json``) cannot be read as one: cut short, edited, not a
    regular file. The page says so and goes on; nothing is started or stopped on it."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"damaged record: {path}: {why}",
                         f"delete the job's folder {path.parent} (its run folder is kept)", status=422)
        self.job_id = path.parent.name


@dataclasses.dataclass(frozen=True, kw_only=True)
class State:
    """Where a job stands now."""

    status: str
    """``running``, ``finished`` (exit 0), ``failed`` (another exit status), ``interrupted`` (stopped by a
    signal, or its supervisor and command gone without a word: then ``returncode`` is None)."""
    returncode: int | None
    finished_at: float | None
    command_pid: int | None = None
    """Set where the command still runs though its supervisor was killed outright (SIGKILL): the
    command's pid. The job is ``running`` (a Resume would start a second run over its folder, and
    Stop still reaches it through its process group), but its exit will not be recorded."""
    problem: str | None = None
    """Why the status is ``damaged``: its ``exit.json`` cannot be read (whether it still runs is not known)."""


RUN_MODULE = "import runpy, sys; del sys.path[0]; runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)"
"""``python -m MODULE`` without the working folder first on ``sys.path``: a job runs in the root,
where a project's own ``json.py`` or ``datasets.py`` would otherwise shadow the library's."""


def run_module(module: str) -> list[str]:
    """The command line that runs ``module`` as ``python -m`` would, the root kept off ``sys.path``."""
    return [sys.executable, "-c", RUN_MODULE, module]


class Jobs:
    """The jobs under one root: started, listed, read, stopped."""

    def __init__(self, root: Root) -> None:
        self.root = root
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._starting = threading.Lock()
        """Held from the check for a live job on the folder to the new job's record naming its supervisor:
        two starts on one folder (a double click on Resume) are one after the other, and the second sees the first."""

    def start(self, command: str, argv: list[str], *, output: Path | None, spec: Path | None = None) -> Job:
        """Start ``trainfit COMMAND ARGV...`` (``argv`` without the program) as a new job; :class:`Refused`
        (409) where a live job writes ``output`` already. A start that fails (a full disk) leaves no folder."""
        with self._starting:
            if output is not None and (live := self.live_on(self.root.relative(output))) is not None:
                raise Refused(f"job {live.id} runs on {live.output} already: a second job there would be refused "
                              "by its lock, or write over it", "wait for it to end, or stop it first", status=409)
            job = Job(id=f"{time.strftime('%Y%m%d-%H%M%S')}-{command}-{secrets.token_hex(3)}", command=command,
                      argv=[*run_module("trainfit"), command, *argv], cwd=str(self.root.path), started_at=time.time(),
                      spec=None if spec is None else self.root.relative(spec),
                      output=None if output is None else self.root.relative(output))
            folder = self.root.jobs / job.id
            try:
                folder.mkdir(parents=True)
                return self._launch(folder, job)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                prune_empty(folder.parent, up_to=self.root.path)
                raise

    def _launch(self, folder: Path, job: Job) -> Job:
        """Write ``job``'s record in ``folder`` and start its supervisor; the record with its pid."""
        _write(folder, job)
        with (folder / "supervisor.log").open("wb") as errors:  # the supervisor's own troubles, if any
            child = subprocess.Popen([*run_module("trainfit.ui.supervise"), str(folder)], cwd=self.root.path,
                                     start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=errors)
        assert child.stdout is not None
        with child.stdout:  # its "ready": from here a Stop cannot end it before it records the exit
            child.stdout.readline()
        job = dataclasses.replace(job, pid=child.pid)
        try:
            _write(folder, job)
        except BaseException:  # no record names it: it would run on unseen, and unstoppable from the page
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            raise
        self._children[job.id] = child
        threading.Thread(target=child.wait, daemon=True).start()  # reaped when it ends: no zombie reads as alive
        return job

    def live_on(self, output: str) -> Job | None:
        """The running job that writes the root-relative folder ``output``, if one does."""
        return next((job for job in self.all() if job.output == output and self.state(job).status == "running"), None)

    def get(self, job_id: str) -> Job:
        """The job ``job_id``, or :class:`Refused` (404) where there is none, :class:`Damaged` where its
        record cannot be read."""
        if not job_id.replace("-", "").isalnum():
            raise Refused(f"{job_id!r} is not a job id", status=404)
        path = self.root.jobs / job_id / JOB_FILE
        try:
            job = Job.from_json(json.loads(read_regular(path)))
        except FileNotFoundError:
            raise Refused(f"no job {job_id} under {self.root.path}", "pick one the page lists", status=404) from None
        except OSError as err:
            raise Damaged(path, err.strerror or str(err)) from None
        except (ValueError, TrainfitError) as err:
            raise Damaged(path, str(err)) from None
        if job.id != job_id:
            raise Damaged(path, f"it names job {job.id}")
        return job

    def scan(self) -> tuple[list[Job], list[Damaged]]:
        """Every job under the root, the last started first, and each one whose record cannot be read."""
        if not self.root.jobs.is_dir():
            return [], []
        found, damaged = [], []
        for folder in self.root.jobs.iterdir():
            try:
                found.append(self.get(folder.name))
            except Damaged as err:
                damaged.append(err)
            except Refused:
                continue  # not a job's folder (no record): a stray file, a start cut short
        # by start time: two jobs of one second and one command differ only by their names' random suffixes
        return sorted(found, key=lambda job: (job.started_at, job.id), reverse=True), damaged

    def all(self) -> list[Job]:
        """Every job under the root whose record can be read, the last started first."""
        return self.scan()[0]

    def state(self, job: Job) -> State:
        """Where ``job`` stands: its recorded exit, else whether its supervisor still lives."""
        try:
            code, finished_at = self._ended(job)
        except Damaged as err:
            return State(status="damaged", returncode=None, finished_at=None, problem=err.message)
        if code is not None:
            status = "finished" if code == 0 else "interrupted" if code in INTERRUPTED else "failed"
            return State(status=status, returncode=code, finished_at=finished_at)
        if self._alive(job):
            return State(status="running", returncode=None, finished_at=None)
        if (left := self._command_left(job)) is not None:
            return State(status="running", returncode=None, finished_at=None, command_pid=left)
        return State(status="interrupted", returncode=None, finished_at=None)

    def _ended(self, job: Job) -> tuple[int | None, float | None]:
        """The exit status and end time ``exit.json`` records ((None, None): none yet), or :class:`Damaged`."""
        path = self.root.jobs / job.id / EXIT_FILE
        try:
            ended = json.loads(read_regular(path))
        except FileNotFoundError:
            return None, None
        except OSError as err:
            raise Damaged(path, err.strerror or str(err)) from None
        except ValueError as err:  # written whole (write_atomically): a text that is no JSON was damaged since
            raise Damaged(path, f"not JSON ({err})") from None
        code = ended.get("returncode") if isinstance(ended, dict) else None
        finished_at = ended.get("finished_at") if isinstance(ended, dict) else None
        if not isinstance(code, int) or isinstance(code, bool):
            raise Damaged(path, f"its returncode is {code!r}, not an exit status" if isinstance(ended, dict)
                          else f"it holds {ended!r}, not an exit status")
        if not isinstance(finished_at, (int, float)) or isinstance(finished_at, bool) or not math.isfinite(finished_at):
            finished_at = None  # a status without its time is still the status
        return code, finished_at

    def _alive(self, job: Job) -> bool:
        """The job's supervisor still runs (the pid is checked to be it: a pid is reused)."""
        try:
            process = psutil.Process(job.pid)
            return process.status() != psutil.STATUS_ZOMBIE and str(self.root.jobs / job.id) in process.cmdline()
        except (psutil.Error, ValueError):
            return False

    def _command_left(self, job: Job) -> int | None:
        """The pid of the job's command where it runs on with its supervisor gone, from the
        supervisor's :data:`COMMAND_FILE`; checked to be that process by its start time (a pid is
        reused), within a second (psutil's boot time moves with the clock)."""
        try:
            recorded = json.loads(read_regular(self.root.jobs / job.id / COMMAND_FILE))
            process = psutil.Process(int(recorded["pid"]))
            if process.status() != psutil.STATUS_ZOMBIE and abs(process.create_time() - recorded["create_time"]) < 1:
                return process.pid
        except (OSError, ValueError, TypeError, KeyError, psutil.Error):
            pass
        return None

    def log(self, job: Job, offset: int = 0) -> tuple[str, int]:
        """The job's output from byte ``offset`` (at most :data:`LOG_CHUNK`; an offset past its end reads
        nothing), and the offset after it: whole UTF-8 characters only (:func:`whole_characters`), so none
        is broken at either end."""
        data, begins = self._read(job, offset)
        return data.decode(errors="replace"), begins + len(data)

    def tail(self, job: Job) -> tuple[str, int, int]:
        """The end of the job's output, at most :data:`LOG_CHUNK` bytes from the start of a line: its
        text, the offset after it, and how many bytes before it were left out."""
        try:
            size = os.stat(self.root.jobs / job.id / LOG_FILE).st_size
        except OSError:
            size = 0
        if size <= LOG_CHUNK:
            return (*self.log(job), 0)
        data, begins = self._read(job, size - LOG_CHUNK)
        line = data.find(b"\n") + 1  # the first line, cut, is left out whole
        return data[line:].decode(errors="replace"), begins + len(data), begins + line

    def _read(self, job: Job, offset: int) -> tuple[bytes, int]:
        """The whole characters of at most :data:`LOG_CHUNK` bytes of the log from about ``offset``
        (held between 0 and the log's size), and the offset they begin at."""
        try:
            with open_regular(self.root.jobs / job.id / LOG_FILE) as f:
                offset = min(max(0, offset), os.fstat(f.fileno()).st_size)
                f.seek(offset)
                data = f.read(LOG_CHUNK)
        except OSError:  # none yet, or no regular file (a FIFO would hang the page): nothing to show
            return b"", 0
        start, end = whole_characters(data, at_start=offset == 0)
        return data[start:end], offset + start

    def stop(self, job: Job, grace_s: float = STOP_GRACE_S) -> bool:
        """SIGINT to the job's process group (the command stops as after Ctrl-C: a checkpoint, its
        outputs), then SIGTERM after ``grace_s`` if it still runs. False: it was not running."""
        if self.state(job).status != "running" or job.pid <= 0:  # killpg(0) would stop the UI's own group
            return False
        try:
            os.killpg(job.pid, signal.SIGINT)
        except ProcessLookupError:
            return False

        def then_terminate() -> None:
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline:
                if self.state(job).status != "running":
                    return
                time.sleep(0.2)
            try:
                os.killpg(job.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

        threading.Thread(target=then_terminate, daemon=True).start()
        return True


def whole_characters(data: bytes, *, at_start: bool) -> tuple[int, int]:
    """Where the whole UTF-8 characters of ``data`` (bytes read from a byte offset) begin and end. A
    read stops at :data:`LOG_CHUNK` bytes or where the writer is, which may be inside a character: its
    first bytes, decoded alone, were U+FFFD, and so were its last ones at the start of the next read.
    The end is put before a character begun but not complete (the next read starts with it); a start
    inside a character (not ``at_start``: the file's first byte) moves past its last bytes. Bytes that
    are no UTF-8 at all are left to the decoder's replacement character."""
    start = 0
    if not at_start:
        while start < min(3, len(data)) and data[start] & 0xC0 == 0x80:  # 10xxxxxx: inside a character
            start += 1
    for back in range(1, min(4, len(data) - start) + 1):  # a character is at most 4 bytes
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # not a continuation: ASCII, or the first byte of the last character
            length = 1 if byte < 0x80 else 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return start, len(data) - back if length > back else len(data)
    return start, len(data)


def _write(folder: Path, job: Job) -> None:
    write_atomically(folder / JOB_FILE, json.dumps(dataclasses.asdict(job), indent=1))
