"""The speed of the real run: the expected step time over the batches an epoch really sees.

A probe cannot time every batch of an epoch, and a handful of random batches does not represent
long-tailed data (one batch holding a long sample costs many short ones). So the parent simulates
the epoch's micro-batches from the data's lengths under the trainer's own batching
(``data/batching.py``: random order padded to the longest, length-grouped, or fixed padding) and
keeps their padded lengths (:class:`TypicalMix`). The worker times steps at a few of those
shapes, spread over the distribution (strata midpoints), takes the longest batch's step from the
memory phase (it runs that shape anyway; timed in the cycle only where the memory phase's step is
not a whole step of the real accumulation, see :func:`times_longest`), and fits a step
cost ``t(L) = a + b*L + c*L**2`` (a fixed cost, a per-position cost at the batch size, attention's
quadratic term; none negative) to their median times (:func:`fit_step_cost`). Summed over the
epoch's micro-batches, that cost gives the expected step time, samples/s and tokens/s
(:func:`epoch_speed`); the fit's largest miss at a timed shape says how far to trust it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainfit.data.batching import simulate_epoch
from trainfit.data.packing import packed_epoch
from trainfit.params import Params
from trainfit.probe.timing import t95

QUANTILES = (0.125, 0.375, 0.625, 0.875)
"""Where the timed shapes sit in the distribution of the epoch's padded lengths: the midpoints of
four equally likely strata. The tail, where the quadratic term shows, is the longest batch."""


@dataclass(frozen=True, kw_only=True)
class TypicalMix:
    """An epoch's micro-batches reduced to what a step costs, and the micro-batches to time."""

    batching: str
    """How the trainer batches, in words (``random order, each batch padded to its longest``...)."""
    padded_lengths: tuple[int, ...]
    """Each distinct padded length of the epoch's micro-batches ..."""
    counts: tuple[int, ...]
    """... and how many micro-batches have it."""
    samples: int
    real_tokens: int
    padded_tokens: int
    """Positions of the epoch's micro-batches, padding included (rows x padded length)."""
    timing_batches: tuple[tuple[int, ...], ...]
    """The sample lengths of each micro-batch the worker times, shortest padded length first."""
    times_longest: bool = False
    """The longest batch is among them (else the memory phase's worst-case step stands for it)."""
    data_samples: int | None = None
    """The dataset's samples where the mix is an epoch of a uniform sample of its lengths (None: the
    mix is the whole epoch): a real epoch has ``data_samples / samples`` times its steps."""

    @property
    def epoch_steps_scale(self) -> float:
        """How many times the mix's micro-batches a real epoch trains."""
        return self.data_samples / self.samples if self.data_samples and self.samples else 1.0

    @property
    def micro_batches(self) -> int:
        return int(sum(self.counts))

    @property
    def padding_share(self) -> float:
        return 1.0 - self.real_tokens / self.padded_tokens if self.padded_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"batching": self.batching, "padded_lengths": list(self.padded_lengths), "counts": list(self.counts),
                "samples": self.samples, "real_tokens": self.real_tokens, "padded_tokens": self.padded_tokens,
                "timing_batches": [list(b) for b in self.timing_batches], "times_longest": self.times_longest,
                "data_samples": self.data_samples}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TypicalMix:
        return cls(**{**d, "padded_lengths": tuple(d["padded_lengths"]), "counts": tuple(d["counts"]),
                      "timing_batches": tuple(tuple(b) for b in d["timing_batches"])})


def timing_picks(padded: np.ndarray, longest: bool = False) -> list[int]:
    """Indices of the micro-batches to time: those at :data:`QUANTILES` of the padded lengths
    ``padded``, and the longest when ``longest`` (one per distinct length; every batch when there
    are few)."""
    order = np.argsort(padded, kind="stable")
    picks: list[int] = []
    seen: set[int] = set()
    for q in (*QUANTILES, 1.0) if longest else QUANTILES:
        i = int(order[min(len(order) - 1, max(0, math.ceil(q * len(order)) - 1))])
        if int(padded[i]) not in seen:
            seen.add(int(padded[i]))
            picks.append(i)
    return sorted(picks, key=lambda i: int(padded[i]))


@dataclass(frozen=True)
class StepCost:
    """Seconds of one optimizer step whose micro-batches are padded to ``L`` positions (warm), and
    what a padded length costs beyond that the first time a process meets it."""

    a: float
    b: float
    c: float
    first_sight: float = 0.0

    def __call__(self, length: np.ndarray | float) -> np.ndarray | float:
        return self.a + self.b * length + self.c * np.square(length)


def fit_step_cost(lengths: Sequence[float], seconds: Sequence[float]) -> StepCost:
    """The cost curve through the timed shapes, by non-negative least squares on relative error
    (a long step must not drown the short ones). With two distinct lengths the quadratic term is
    dropped; with one, the cost is that step's time."""
    x = np.asarray(lengths, dtype=float)
    y = np.asarray(seconds, dtype=float)
    distinct = len(set(x.tolist()))
    if distinct == 1:
        return StepCost(float(np.mean(y)), 0.0, 0.0)
    from scipy.optimize import nnls  # type: ignore[import-untyped]

    columns = [np.ones_like(x), x, np.square(x)][:3 if distinct >= 3 else 2]
    design = np.stack(columns, axis=1) / y[:, None]
    coef, _ = nnls(design, np.ones_like(y))
    a, b, c = (list(coef) + [0.0, 0.0])[:3]
    return StepCost(float(a), float(b), float(c))


def shapes_step_cost(shape_times: Sequence[Mapping[str, Any]], wait_s: float = 0.0,
                     first_sight_s: float = 0.0) -> StepCost | None:
    """The step cost fitted through a probe's timed shapes (``Measurement.shape_times``: each a
    ``padded_length`` and its ``seconds``), the model's alone, or with ``wait_s`` (the probe's wait
    for data a step, ``Measurement.data_wait_s``) in its fixed part and ``first_sight_s``
    (``Measurement.first_sight_s``): a step as a run pays it, which a calibration sets against the
    trainer's timed steps; None where it timed none."""
    if not shape_times:
        return None
    cost = fit_step_cost([s["padded_length"] for s in shape_times], [s["seconds"] for s in shape_times])
    return StepCost(cost.a + wait_s, cost.b, cost.c, first_sight_s)


def fit_error(cost: StepCost, lengths: Sequence[float], seconds: Sequence[float]) -> float:
    """The fit's largest miss at a timed shape, as a share of that shape's measured time."""
    return max(abs(float(cost(x)) - y) / y for x, y in zip(lengths, seconds, strict=True))


def fit_noise_ci95(cost: StepCost, lengths: Sequence[float], seconds: Sequence[float]) -> float | None:
    """95% CI half-width of the fitted cost at the timed lengths, as a share, from the fit's own
    residuals (relative, as it is fitted) where each shape was timed once: their spread on the
    residual degrees of freedom (Student's t), times the root of the mean leverage (parameters over
    points). None with fewer than 2 residual degrees of freedom (5 lengths for the quadratic)."""
    n = len(lengths)
    parameters = 3 if len(set(lengths)) >= 3 else 2
    dof = n - parameters
    if dof < 2:
        return None
    spread = math.sqrt(sum(((float(cost(x)) - y) / y) ** 2 for x, y in zip(lengths, seconds, strict=True)) / dof)
    return t95(dof) * spread * math.sqrt(parameters / n)


@dataclass(frozen=True, kw_only=True)
class EpochSpeed:
    """What the fitted cost says of the epoch: expected seconds per optimizer step and the speeds."""

    step_seconds: float
    samples_per_second: float
    tokens_per_second: float


def epoch_speed(cost: StepCost, mix: TypicalMix, accumulation: int, max_length: int | None = None,
                wait_s: float = 0.0, first_sights_s: float = 0.0) -> EpochSpeed:
    """Expected speed over ``mix``'s micro-batches, ``accumulation`` of them per optimizer step.
    A step of ``accumulation`` micro-batches at mixed lengths costs the mean of ``cost`` at those
    lengths, as the cost is a fixed part plus one per micro-batch. ``max_length``: the padded length
    of the worker's longest batches where it capped them (a model with fewer positions than the
    data's truncation: the cap rounded up to ``pad_to_multiple_of``, see ``Params.padded_length``).
    ``wait_s``: the seconds each optimizer step waits for its data besides (a probe's loader).
    ``first_sights_s``: what a fresh process pays for meeting the epoch's distinct lengths
    (:func:`epoch_first_sights`), shared out over the real epoch's steps
    (:attr:`TypicalMix.epoch_steps_scale`): the speed of a first epoch in a fresh process."""
    lengths = np.asarray(mix.padded_lengths, dtype=float)
    if max_length is not None:
        lengths = np.minimum(lengths, max_length)
    counts = np.asarray(mix.counts, dtype=float)
    steps = counts.sum() / accumulation
    step = (float(np.sum(counts * cost(lengths)) / counts.sum()) + wait_s
            + first_sights_s / (steps * mix.epoch_steps_scale))
    seconds = step * steps
    return EpochSpeed(step_seconds=step, samples_per_second=mix.samples / seconds,
                      tokens_per_second=mix.real_tokens / seconds)


def first_sights(first: Mapping[int, float], warm: Mapping[int, float]) -> tuple[float, float] | None:
    """What the shapes a process meets cost the first time, beyond their warm step: ``first``, each
    new shape's first step in the order met, and ``warm``, the median of its timed steps (both by the
    shape's index). Returns the first new shape's excess (at least 0: under ``torch.compile``
    the graph compiled for one shape recompiles for dynamic shapes at the next, once) and what each
    later new length costs, the mean of the others' excess where it is above its own 95% half-width
    (Student's t over them; a single one's excess as it is), else 0. None where no shape was timed
    both ways. A new shape can make the allocator find blocks (the memory phase has grown its cache
    to the worst case first, so a probe sees little of that) and autotuned kernels (cuDNN benchmark,
    Triton's) search: paid once a process, not each step."""
    extra = [first[k] - warm[k] for k in first if k in warm]
    if not extra:
        return None
    rest = extra[1:]
    if len(rest) <= 1:
        return max(0.0, extra[0]), max(0.0, rest[0]) if rest else 0.0
    mean = sum(rest) / len(rest)
    sd = math.sqrt(sum((x - mean) ** 2 for x in rest) / (len(rest) - 1))
    return max(0.0, extra[0]), mean if mean > t95(len(rest) - 1) * sd / math.sqrt(len(rest)) else 0.0


def epoch_first_sights(sights: tuple[float, float] | None, shapes: int) -> float:
    """What a fresh process's epoch pays for meeting its ``shapes`` distinct padded lengths, by
    :func:`first_sights`' two figures: the first new shape's, then each later one's."""
    if sights is None or shapes <= 0:
        return 0.0
    return sights[0] + (shapes - 1) * sights[1]


def batching_words(padding: str, group_by_length: bool, max_length: int, pad_to_multiple_of: int | None = None, *,
                   packing: bool = False) -> str:
    """How the trainer batches the data, as the output says it."""
    multiple = "" if pad_to_multiple_of is None else f", rounded up to a multiple of {pad_to_multiple_of}"
    if packing:
        fixed = f", rounded up to a multiple of max_length={max_length}" if padding == "max_length" else multiple
        return (f"samples packed into rows of max_length={max_length} (best fit decreasing), each batch's rows "
                f"{'length-grouped, ' if group_by_length else ''}flattened into one padding-free row{fixed}")
    if padding == "max_length":
        return f"every batch padded to max_length={max_length}{multiple}"
    if group_by_length:
        return f"length-grouped batches (group_by_length), each padded to its longest sample{multiple}"
    return f"random order, each batch padded to its longest sample{multiple}"


def times_longest(params: Params, memory_steps: int) -> bool:
    """Whether the longest batch must be timed in the cycle: the memory phase's last step on the
    worst-case batch (the same shape, padded to the longest) is a whole optimizer step of the real
    accumulation only with at most 2 micro-batches (``memory_micro_batches``) and after a first
    step; with fixed padding every batch has that one shape anyway. Under packing always: the
    memory phase's rows hold one ``max_length`` sample each (the worst case for memory), the
    epoch's longest its packed samples, whose attention a varlen kernel computes per sample (far
    less than over the whole row), so the one step cannot stand for the other's time."""
    if params.packing:
        return True
    if params.padding == "max_length":
        return False
    return params.gradient_accumulation_steps > 2 or memory_steps < 2


def typical_mix(lengths: Sequence[int], params: Params, max_length: int, seed: int,
                longest: bool = True, data_samples: int | None = None) -> TypicalMix:
    """An epoch of ``lengths`` (the data's, or a uniform sample of them: then ``data_samples``, the
    data's count) batched as ``params`` says, and the micro-batches to time: whole batches at
    :data:`QUANTILES` of the padded lengths, and the longest when ``longest`` (:func:`times_longest`)."""
    array = np.minimum(np.asarray(lengths, dtype=np.int64), max_length)
    if params.packing:
        epoch = packed_epoch(array, params.batch_size, max_length=max_length, seed=seed,
                             group_by_length=params.group_by_length,
                             gradient_accumulation_steps=params.gradient_accumulation_steps,
                             multiple=params.packed_multiple(max_length))
    else:
        epoch = simulate_epoch(array, params.batch_size, padding=params.padding, max_length=max_length,  # type: ignore[arg-type]
                               group_by_length=params.group_by_length, seed=seed,
                               gradient_accumulation_steps=params.gradient_accumulation_steps,
                               pad_to_multiple_of=params.pad_to_multiple_of)
    values, counts = np.unique(epoch.padded_length, return_counts=True)
    size = epoch.packed_rows if epoch.packed_rows is not None else epoch.rows
    whole = np.flatnonzero(size == size.max())  # a short last batch is not typical
    starts = np.concatenate([[0], np.cumsum(epoch.rows)[:-1]])
    ordered = array[epoch.order]
    timing = tuple(tuple(int(n) for n in ordered[starts[i]:starts[i] + epoch.rows[i]])
                   for i in whole[timing_picks(epoch.padded_length[whole], longest)])
    words = batching_words(params.padding, params.group_by_length, max_length, params.pad_to_multiple_of,
                           packing=params.packing)
    return TypicalMix(batching=f"{words} ({len(array):,} of the data's lengths)",
                      padded_lengths=tuple(int(v) for v in values), counts=tuple(int(c) for c in counts),
                      samples=epoch.samples, real_tokens=epoch.total_real_tokens,
                      padded_tokens=epoch.total_padded_positions, timing_batches=timing, times_longest=longest,
                      data_samples=data_samples if data_samples and data_samples > len(array) else None)


def assumed_mix(params: Params, max_length: int) -> TypicalMix:
    """Without a dataset: every sample ``max_length`` long, one shape (padded to ``max_length``
    rounded up to ``pad_to_multiple_of``)."""
    b = params.batch_size
    padded = params.batch_length([max_length] * b, max_length)  # packed: each row one sample, all b in one
    if params.packing:
        return TypicalMix(batching=f"no dataset: every sample assumed max_length={max_length} long, one a packed row",
                          padded_lengths=(padded,), counts=(1,), samples=b, real_tokens=b * max_length,
                          padded_tokens=padded, timing_batches=((max_length,) * b,))
    return TypicalMix(batching=f"no dataset: every sample assumed max_length={max_length} long",
                      padded_lengths=(padded,), counts=(1,), samples=b, real_tokens=b * max_length,
                      padded_tokens=b * padded, timing_batches=((max_length,) * b,))
