"""``python -m trainfit.ui.supervise JOB_DIR``: the process the UI starts for a job, in a session of
its own. It runs the job's ``trainfit`` command (``job.json``'s ``argv``) with its output into
``JOB_DIR/output.log``, waits for it, and writes its exit status to ``JOB_DIR/exit.json``: so the
status is recorded even when the UI that started it was stopped or restarted meanwhile.

Stop signals reach the whole process group (the command and this process): this one outlives them
to record how the command ended (130 after Ctrl-C, 143 after SIGTERM)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from trainfit.files import write_atomically

EXIT_FILE = "exit.json"
LOG_FILE = "output.log"
JOB_FILE = "job.json"
COMMAND_FILE = "command.json"
"""The command's pid and start time (psutil's ``create_time``), written once it is started: a
supervisor killed outright (SIGKILL) records no exit, and the UI reads here whether the command it
left still runs (see ``Jobs.state``)."""


def _wait_through_signals(signum: int, frame: Any) -> None:
    """A handler, not SIG_IGN: an ignored signal would stay ignored in the command this starts."""


def _ready() -> None:
    """Tell the UI this process now outlives a stop signal (until then, one would end it with no
    record): a line on stdout, a pipe the UI reads, then stdout is let go."""
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _record_command(job_dir: Path, pid: int) -> None:
    """Write :data:`COMMAND_FILE` for the command just started as ``pid`` (nothing where it has ended
    already: there is nothing left to find)."""
    try:
        started = psutil.Process(pid).create_time()
    except psutil.Error:
        return
    write_atomically(job_dir / COMMAND_FILE, json.dumps({"pid": pid, "create_time": started}))


def supervise(job_dir: Path) -> int:
    """Run the job in ``job_dir`` to its end; its exit status."""
    job = json.loads((job_dir / JOB_FILE).read_text())
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _wait_through_signals)
    _ready()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # the log is read while it is written
    with (job_dir / LOG_FILE).open("ab") as log:
        try:
            child = subprocess.Popen(job["argv"], cwd=job["cwd"], stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env)
        except OSError as err:
            log.write(f"trainfit ui: cannot start {job['argv'][0]}: {err}\n".encode())
            returncode = 127
        else:
            _record_command(job_dir, child.pid)
            returncode = child.wait()
            if returncode < 0:  # killed by a signal before the command's own handler: as a shell says it
                returncode = 128 - returncode
    write_atomically(job_dir / EXIT_FILE, json.dumps({"returncode": returncode, "finished_at": time.time()}))
    return 0


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1])))
