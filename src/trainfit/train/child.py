"""Your own trainer (the spec's ``tune.command_template``, filled for the chosen config) run by
``trainfit train`` as a child process, with the run's facts in its environment.

trainfit cannot checkpoint or resume a trainer it does not run in-process; it hands that trainer
what it needs to do so and to be watched (:data:`ENVIRONMENT`), forwards SIGTERM and Ctrl-C to
it, and times the run against the plan. In a Hugging Face ``Trainer``:
``callbacks=[c for c in [trainfit.OnTrackCallback.from_environment()] if c]``.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

from trainfit.errors import TrainfitError

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


def run_child(command: str, *, cwd: Path, env: Mapping[str, str], say: Callable[[str], None]) -> str | None:
    """Run ``command`` (bash) in its own process group, its output on this process's, SIGTERM and
    Ctrl-C passed on to the whole group. Returns the signal that stopped it by our hand (None: it
    ended by itself); raises :class:`TrainfitError` when it fails."""
    proc = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=dict(env), start_new_session=True)
    received: list[str] = []

    def forward(signum: int, frame: object) -> None:
        received.append(signal.Signals(signum).name)
        say(f"trainfit: {received[-1]}: passed on to your training command (pid {proc.pid})")
        try:
            os.killpg(proc.pid, signal.SIGTERM if signum == signal.SIGTERM else signal.SIGINT)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        rc = proc.wait()
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
