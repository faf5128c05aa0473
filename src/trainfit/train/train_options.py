"""How one ``trainfit train`` runs, besides the tune folder it trains and the folder it trains
into: ``TrainOptions``."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True, kw_only=True)
class TrainOptions:
    """A run of ``trainfit.train.train`` (``trainfit train``'s flags).

    Example::

        train("runs/a", "runs/a/train", TrainOptions(max_steps=100, checkpoint_minutes=10))
    """

    resume: bool = False
    """Continue from the output folder's last complete checkpoint."""
    checkpoint_minutes: float | None = None
    """Between checkpoints (default: the plan's interval, else 30)."""
    keep: int = 2
    """Complete checkpoints kept (the last complete one is never dropped)."""
    deadline_hours: float | None = None
    """Since the first start: stop with a checkpoint when the next step and save would pass it."""
    use_plan_deadline: bool = False
    """The plan's window is the deadline (``--deadline`` with no hours)."""
    extra_args: Sequence[str] = ()
    """More ``trl sft`` arguments, after the written ones (a later flag wins)."""
    max_steps: int | None = None
    """A cap on the optimizer steps."""
    loop: bool = False
    """A factory model trains in trainfit's loop even when the spec has a ``tune.command_template``."""
    monitor_every_s: float = 60.0
    """How often the on-track monitor projects the finish against the plan."""
    from_compare: str | Path | None = None
    """A ``trainfit compare`` output folder: train its winner (``compare_config``, else its best) the
    fastest way the tune measured, with its training values (a plan, where there is one, must carry it)."""
    compare_config: str | None = None
    final: bool = False
    """With ``from_compare``: one of ``--top N``'s finals (:mod:`trainfit.train.finals`): the plan, made
    for one run, does not decide it."""
    resume_with: str | None = None
    """The command that continues the run, where another than its own does (the finals' one)."""
    record_batches: str | Path | None = None
    """A file to append each training micro-batch's padded length to, one a line, in the order they
    train (``trl sft`` runs only; what ``plan --calibrate`` prices its timed steps by)."""
    say: Callable[[str], None] = _to_stderr
    """Receives the run's progress lines (default: stderr)."""
