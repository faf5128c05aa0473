"""A trainer run in a process group of its own: its output logged as it comes (each progress-bar
update stamped), and the whole group signalled or killed, so no process outlives an interrupt."""

from __future__ import annotations

import codecs
import os
import re
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from trainfit.trainer_output import bar_step


def run_logged(argv: list[str], log_path: Path, *, cwd: Path, env: Mapping[str, str], bar_total: int,
               say: Callable[[str], None]) -> tuple[int, str, dict[int, float]]:
    """Run ``argv`` in its own process group, its output (stdout and stderr) written to ``log_path``
    as it comes. Returns the exit status, the output, and when each step of the trainer's progress
    bar for ``bar_total`` steps first arrived (``time.perf_counter()``). Ctrl-C, or any exception
    here (``say`` raising, say), kills the whole group (the shell, ``accelerate launch`` and the
    training process it starts) before it propagates; so does the run's end (a straggler it left)."""
    arrivals: dict[int, float] = {}
    started = time.perf_counter()
    received = bytearray()
    tail = ""  # the output after its last line break: the progress bar tqdm is drawing now
    decoder = codecs.getincrementaldecoder("utf-8")("replace")  # a bar's blocks may be split between reads
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=cwd, env=dict(env), start_new_session=True)
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(fd, selectors.EVENT_READ)
                while True:
                    if not selector.select(0.5):
                        if proc.poll() is not None:  # ended, but a process it left holds the pipe open
                            break
                        continue
                    chunk = os.read(fd, 1 << 16)
                    now = time.perf_counter()
                    if not chunk:
                        break
                    log.write(chunk)
                    log.flush()
                    received += chunk
                    # tqdm draws each update as "\r" + the bar: the newest one is complete on arrival.
                    *done, tail = re.split(r"[\r\n]", tail + decoder.decode(chunk))
                    for segment in (*done, tail):
                        n = bar_step(segment, bar_total)
                        if n is not None and n > 0 and n not in arrivals:
                            if not arrivals:
                                say(f"step {n} of {bar_total} after {now - started:.0f} s of start-up")
                            arrivals[n] = now
            rc = proc.wait()
        finally:
            _kill_group(proc)
            proc.stdout.close()
    return rc, received.decode("utf-8", "replace"), arrivals


def signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    """Send ``signum`` to the process group ``proc`` leads (it was started in a session of its own)."""
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):  # nothing left in the group
        pass


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group ``proc`` leads, and reap it."""
    signal_group(proc, signal.SIGKILL)
    proc.wait()

