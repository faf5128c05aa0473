"""Your own trainer (the spec's ``tune.command_template``, filled for the chosen config) run by
``trainfit train`` as a child process, in the folder ``trainfit train`` was started from (where
the template's relative paths were written for), with the run's facts in its environment.

trainfit cannot checkpoint or resume a trainer it does not run in-process; it hands that trainer
what it needs to do so and to be watched (:data:`ENVIRONMENT`), forwards SIGTERM and Ctrl-C to
it, and times the run against the plan. In a Hugging Face ``Trainer``:
``callbacks=[c for c in [trainfit.OnTrackCallback.from_environment()] if c]``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from trainfit.errors import TrainfitError
from trainfit.trainer.launch import signal_group

ENVIRONMENT = {
    "TRAINFIT_PLAN": "the plan.json the run follows (unset without a plan)",
    "TRAINFIT_OUTPUT": "the output folder `trainfit train` was given",
    "TRAINFIT_RESUME": "1 when run with --resume (continue from your trainer's last checkpoint), else 0",
    "TRAINFIT_CHECKPOINT_SECONDS": "how often to save a checkpoint",
    "TRAINFIT_DEADLINE": "epoch seconds to stop by, with a checkpoint (unset without --deadline)",
    "TRAINFIT_STARTED_AT": "epoch seconds of the run's first start",
}
"""What the child's environment carries, besides this process's own."""


def child_environment(*, plan: Path | None, output: Path, resume: bool, checkpoint_every_s: float,
                      deadline: float | None, started_at: float) -> dict[str, str]:
    """This process's environment plus :data:`ENVIRONMENT`'s values."""
    env = {k: v for k, v in os.environ.items() if k not in ENVIRONMENT}
    env.update({"TRAINFIT_OUTPUT": str(output.resolve()), "TRAINFIT_RESUME": "1" if resume else "0",
                "TRAINFIT_CHECKPOINT_SECONDS": f"{checkpoint_every_s:g}", "TRAINFIT_STARTED_AT": f"{started_at:.3f}"})
    if plan is not None:
        env["TRAINFIT_PLAN"] = str(plan.resolve())
    if deadline is not None:
        env["TRAINFIT_DEADLINE"] = f"{deadline:.3f}"
    return env


def run_child(command: str, *, env: Mapping[str, str], say: Callable[[str], None]) -> str | None:
    """Run ``command`` (bash, in this process's folder) in its own process group, its output on
    this process's. SIGTERM, SIGHUP and Ctrl-C are passed on to the whole group (as SIGTERM, or
    SIGINT for Ctrl-C); a second one kills the group. If this process leaves early for any other
    reason, the group is killed too: no trainer is left running unwatched. Returns the signal
    passed on (None: the command ended by itself); raises :class:`TrainfitError` when it fails."""
    proc = subprocess.Popen(["bash", "-c", command], env=dict(env), start_new_session=True)
    received: list[str] = []

    def forward(signum: int, frame: object) -> None:
        received.append(signal.Signals(signum).name)
        again = len(received) > 1
        say(f"trainfit: {received[-1]}: " + ("killing your training command" if again else
                                             f"passed on to your training command (pid {proc.pid})"))
        signal_group(proc, signal.SIGKILL if again else signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)

    main_thread = threading.current_thread() is threading.main_thread()
    caught = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {s: signal.signal(s, forward) for s in caught} if main_thread else {}
    try:
        rc = proc.wait()
    except BaseException:
        signal_group(proc, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if received:
        return received[0]
    if rc != 0:
        raise TrainfitError(f"your training command exited with {rc}: {command[:120]}",
                            "its output is above; fix what it says and run again (with --resume when your trainer "
                            "saved checkpoints: it is told so by TRAINFIT_RESUME=1)")
    return None

