"""What a comparison's loss curves end at and how far apart two of them are: the readings the
suggestions (:mod:`trainfit.compare.suggest`) and the next moves (:mod:`trainfit.compare.moves`)
weigh, pure functions of a run's logged losses."""

from __future__ import annotations

import math
import statistics

from trainfit.compare.runs import ConfigRun

SAME_LOSS = 0.1
"""Two final losses apart by at most a tenth of the larger of the two runs' own drop (their first
tenth's loss to their final one) are the same result: a window relative to what the runs learned,
not to the loss's absolute value (2% of a loss of 7.6 was wider than a whole run's drop of 0.055)."""
MIN_TAIL = 4
"""The fewest train losses in a final loss's last tenth whose scatter :func:`loss_noise` measures."""


def train_losses(run: ConfigRun) -> list[float]:
    """A run's logged train losses, in order (the steps that logged none left out)."""
    return [x[2] for x in run.losses if x[2] is not None]


def last_tenth(run: ConfigRun) -> list[float]:
    """The last tenth of a run's train losses (at least the last one; none where it logged none)."""
    losses = train_losses(run)
    return losses[-max(1, len(losses) // 10):] if losses else []


def final_loss(run: ConfigRun) -> float | None:
    """What a run ends at: its last eval loss, else the mean of its last tenth of train losses."""
    if run.evals:
        return run.evals[-1][2]
    tail = last_tenth(run)
    return statistics.fmean(tail) if tail else None


def loss_drop(run: ConfigRun) -> float:
    """What a run learned: the mean of its first tenth of train losses less its final loss (0 where
    it learned nothing, or logged too little to tell)."""
    losses, final = train_losses(run), final_loss(run)
    if not losses or final is None:
        return 0.0
    return max(0.0, statistics.fmean(losses[:max(1, len(losses) // 10)]) - final)


def same_result(a: ConfigRun, b: ConfigRun) -> bool:
    """Whether two runs' final losses are the same result (:data:`SAME_LOSS`); an eval loss and a
    train loss never are (they are not measured on the same samples)."""
    loss_a, loss_b = final_loss(a), final_loss(b)
    if loss_a is None or loss_b is None or bool(a.evals) != bool(b.evals):
        return False
    drop = max(loss_drop(a), loss_drop(b))
    return abs(loss_a - loss_b) <= SAME_LOSS * drop if drop > 0 else loss_a == loss_b


def loss_noise(run: ConfigRun) -> float | None:
    """The standard error of :func:`final_loss` where it is the mean of the last tenth of train
    losses: their scatter about their own straight-line trend (a falling loss's slope is not
    noise) over the root of their count. None where the final loss is an eval loss (see
    :func:`eval_gap_noise`) or the last tenth holds fewer than :data:`MIN_TAIL` losses."""
    if run.evals:
        return None
    tail = last_tenth(run)
    scatter = _scatter(tail)
    return None if scatter is None else scatter / len(tail) ** 0.5


def eval_gap_noise(a: ConfigRun, b: ConfigRun) -> tuple[float | None, int]:
    """The noise of the gap between two runs' final eval losses, and the passes it rests on: the
    scatter, about its own trend, of the two curves' difference over their last common passes
    (half of them, at least :data:`MIN_TAIL`; None with fewer). Paired, so the shape both curves
    share (their bend) is not noise; what is left is what differs from pass to pass: a random eval
    loss's draws (a diffusion model's), the weights' wobble between passes."""
    mine = {int(e[0]): e[2] for e in a.evals if e[2] is not None and math.isfinite(e[2])}
    gaps = [e[2] - mine[int(e[0])] for e in b.evals if int(e[0]) in mine and e[2] is not None and math.isfinite(e[2])]
    tail = gaps[-max(MIN_TAIL, len(gaps) // 2):]
    return _scatter(tail), len(tail)


def _scatter(losses: list[float]) -> float | None:
    """The standard deviation of ``losses`` about their straight-line trend (None: fewer than
    :data:`MIN_TAIL`)."""
    n = len(losses)
    if n < MIN_TAIL:
        return None
    mean_x, mean_y = (n - 1) / 2, statistics.fmean(losses)
    slope = sum((i - mean_x) * (y - mean_y) for i, y in enumerate(losses)) / sum((i - mean_x) ** 2 for i in range(n))
    residual = sum((y - mean_y - slope * (i - mean_x)) ** 2 for i, y in enumerate(losses))
    return float((residual / (n - 2)) ** 0.5)
