"""Jobs: ``trainfit`` commands the UI started, each run by :mod:`trainfit.ui.supervise` in a session
of its own, so a job outlives a page reload and a restart of the UI. Everything about a job is in
its folder ``ROOT/.trainfit-ui/jobs/ID/``: ``job.json`` (:class:`Job`, written once at the start),
``output.log`` (the command's stdout and stderr) and ``exit.json`` (its exit status, written by the
supervisor when it ends). A new UI over the same root lists the same jobs."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
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
from trainfit.ui.paths import Refused, Root
from trainfit.ui.supervise import COMMAND_FILE, EXIT_FILE, JOB_FILE, LOG_FILE

SCHEMA_VERSION = 1
INTERRUPTED = {130, 143, 129}
"""Exit statuses of a command stopped by Ctrl-C, SIGTERM or SIGHUP (what it measured is kept)."""
STOP_GRACE_S = 10.0
"""After SIGINT, how long a job has to stop (a checkpoint, the outputs of what was measured)
before SIGTERM follows."""
LOG_CHUNK = 256 * 1024
"""The most of a log one request returns; the page asks again from where it stopped."""


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
    def from_json(cls, raw: dict[str, Any]) -> Job:
        if raw.get("schema_version") != SCHEMA_VERSION:
            raise TrainfitError(f"job.json has schema {raw.get('schema_version')!r}, not {SCHEMA_VERSION}")
        return cls(**{f.name: raw[f.name] for f in dataclasses.fields(cls) if f.name in raw})


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

    def start(self, command: str, argv: list[str], *, output: Path | None, spec: Path | None = None) -> Job:
        """Start ``trainfit COMMAND ARGV...`` (``argv`` without the program) as a new job."""
        job_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{command}-{secrets.token_hex(3)}"
        folder = self.root.jobs / job_id
        folder.mkdir(parents=True)
        job = Job(id=job_id, command=command, argv=[*run_module("trainfit"), command, *argv],
                  cwd=str(self.root.path), started_at=time.time(),
                  spec=None if spec is None else self.root.relative(spec),
                  output=None if output is None else self.root.relative(output))
        _write(folder, job)
        with (folder / "supervisor.log").open("wb") as errors:  # the supervisor's own troubles, if any
            child = subprocess.Popen([*run_module("trainfit.ui.supervise"), str(folder)], cwd=self.root.path,
                                     start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=errors)
        assert child.stdout is not None
        with child.stdout:  # its "ready": from here a Stop cannot end it before it records the exit
            child.stdout.readline()
        job = dataclasses.replace(job, pid=child.pid)
        _write(folder, job)
        self._children[job_id] = child
        threading.Thread(target=child.wait, daemon=True).start()  # reaped when it ends: no zombie reads as alive
        return job

    def get(self, job_id: str) -> Job:
        """The job ``job_id``, or :class:`Refused` (404) where there is none."""
        if not job_id.replace("-", "").isalnum():
            raise Refused(f"{job_id!r} is not a job id", status=404)
        path = self.root.jobs / job_id / JOB_FILE
        try:
            return Job.from_json(json.loads(path.read_text()))
        except FileNotFoundError:
            raise Refused(f"no job {job_id} under {self.root.path}", "pick one the page lists", status=404) from None
        except (ValueError, TypeError, TrainfitError) as err:
            raise Refused(f"cannot read {path}: {err}", "delete its folder", status=500) from None

    def all(self) -> list[Job]:
        """Every job under the root, newest first (one whose record cannot be read is left out)."""
        if not self.root.jobs.is_dir():
            return []
        found = []
        for folder in sorted(self.root.jobs.iterdir(), reverse=True):
            try:
                found.append(self.get(folder.name))
            except Refused:
                continue
        return found

    def state(self, job: Job) -> State:
        """Where ``job`` stands: its recorded exit, else whether its supervisor still lives."""
        folder = self.root.jobs / job.id
        try:
            ended = json.loads((folder / EXIT_FILE).read_text())
        except (FileNotFoundError, ValueError):
            ended = None
        if ended is not None:
            code = int(ended["returncode"])
            status = "finished" if code == 0 else "interrupted" if code in INTERRUPTED else "failed"
            return State(status=status, returncode=code, finished_at=ended.get("finished_at"))
        if self._alive(job):
            return State(status="running", returncode=None, finished_at=None)
        if (left := self._command_left(job)) is not None:
            return State(status="running", returncode=None, finished_at=None, command_pid=left)
        return State(status="interrupted", returncode=None, finished_at=None)

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
            recorded = json.loads((self.root.jobs / job.id / COMMAND_FILE).read_text())
            process = psutil.Process(int(recorded["pid"]))
            if process.status() != psutil.STATUS_ZOMBIE and abs(process.create_time() - recorded["create_time"]) < 1:
                return process.pid
        except (OSError, ValueError, TypeError, KeyError, psutil.Error):
            pass
        return None

    def log(self, job: Job, offset: int = 0) -> tuple[str, int]:
        """The job's output from byte ``offset`` (at most :data:`LOG_CHUNK`), and the offset after it:
        whole UTF-8 characters only (:func:`whole_characters`), so none is broken at either end."""
        path = self.root.jobs / job.id / LOG_FILE
        offset = max(0, offset)
        try:
            with path.open("rb") as f:
                f.seek(offset)
                data = f.read(LOG_CHUNK)
        except FileNotFoundError:
            return "", offset
        start, end = whole_characters(data, at_start=offset == 0)
        return data[start:end].decode(errors="replace"), offset + end

    def stop(self, job: Job, grace_s: float = STOP_GRACE_S) -> bool:
        """SIGINT to the job's process group (the command stops as after Ctrl-C: a checkpoint, its
        outputs), then SIGTERM after ``grace_s`` if it still runs. False: it was not running."""
        if self.state(job).status != "running":
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
