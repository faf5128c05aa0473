"""A trainer run in a process group of its own: its output logged as it comes (each progress-bar
update stamped), and the whole group signalled or killed, so no process outlives an interrupt."""

from __future__ import annotations

import codecs
import os
import re
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from trainfit.errors import TrainfitError
from trainfit.files import open_own
from trainfit.trainer.trainer_output import bar_position, bar_step, parse_train_runtime

LOG_TAIL_LINES = 30
"""Lines of a failed run's output quoted in the error (the whole log stays in the work folder)."""


@dataclass(frozen=True)
class TimedRun:
    """One run of a trainer for a step count: its ``train_runtime`` (s; None where it printed none) and
    the arrival time of each step the progress bar showed (``{step: perf_counter seconds}``)."""

    train_runtime_s: float | None
    step_arrivals: dict[int, float]
    wall_s: float
    """Launch to exit, as a user's run of the command takes."""


def run_timed(name: str, argv: list[str], max_steps: int, folder: Path, env: Mapping[str, str],
              say: Callable[[str], None], *, fallback: str, cwd: Path | None = None,
              needs_runtime: bool = True) -> TimedRun:
    """Run ``argv`` (``name``: what it is, for the errors), a trainer for ``max_steps`` steps writing to
    ``folder/trainer-{max_steps}-steps``, in ``cwd`` (None: ``folder``); its output goes to
    ``folder/calibrate-{max_steps}-steps.log`` as it comes, each update of the trainer's progress
    bar stamped on arrival. Raises :class:`TrainfitError` (with the output's last lines, and
    ``fallback`` as the way on) when it fails, or prints no ``train_runtime`` where ``needs_runtime``."""
    log_path = folder / f"calibrate-{max_steps}-steps.log"
    started = time.perf_counter()
    rc, text, arrivals = run_logged(argv, log_path, cwd=cwd or folder, env=env, bar_total=max_steps, say=say)
    wall = time.perf_counter() - started
    shutil.rmtree(folder / f"trainer-{max_steps}-steps", ignore_errors=True)  # the model the run saved as it ended
    runtime = parse_train_runtime(text)
    if rc != 0 or (runtime is None and needs_runtime):
        tail = "\n".join("  | " + line for line in re.split(r"[\r\n]+", text.strip())[-LOG_TAIL_LINES:])
        why = f"exited with {rc}" if rc != 0 else "printed no train_runtime"
        raise TrainfitError(f"the calibration's {max_steps}-step run of {name} {why}; its last lines:\n{tail}",
                            f"the whole output is in {log_path}; fix what it says, or {fallback}")
    say(f"done: train_runtime {runtime:g} s" if runtime is not None else f"done: {wall:.1f} s from launch to exit")
    return TimedRun(train_runtime_s=runtime, step_arrivals=arrivals, wall_s=wall)


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
    with open_own(log_path, "wb") as log:
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
                        _check_stops(segment, bar_total, arrivals)
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


def _check_stops(segment: str, bar_total: int, arrivals: Mapping[int, float]) -> None:
    """Refuse (the run is then killed) a trainer whose progress bar, before any of the ``bar_total``
    steps asked for showed, counts past them towards a larger total: it does not stop where it was
    told to (a ``command_template`` whose trainer ignores its ``{max_steps}``), and would train on."""
    shown = bar_position(segment)
    if shown is not None and not arrivals and shown[1] > bar_total and shown[0] > bar_total:
        raise TrainfitError(f"the training command's progress bar counts {shown[0]} of {shown[1]} steps, past the "
                            f"{bar_total} it was asked to stop at: it does not stop at its step limit",
                            "check that your tune.command_template passes {max_steps} to the flag your trainer stops "
                            "by (e.g. --max_steps {max_steps})")


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

