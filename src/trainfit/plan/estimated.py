"""A plan before the hardware: a run priced at a speed no probe measured on the device it is for,
and marked so in all the plan writes.

Two sources. The user's own figure (``--throughput`` tokens/s or ``--samples-per-second``), taken as
given, over the spec's data as ``analyze`` counts it (:func:`from_throughput`). Or a measured tune
folder scaled to another device by the two devices' peak FLOP/s at the measured MFU
(:func:`scaled_to`). Each becomes the :class:`~trainfit.plan.inputs.Candidate` (or candidates) that
the ETA, the window and the options already price; only the interval and the words differ."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from trainfit.data.stats import LengthStats
from trainfit.devices import known_devices, peak_flops
from trainfit.errors import TrainfitError
from trainfit.json_record import Record
from trainfit.params import Params
from trainfit.plan.given_lengths import GIVEN
from trainfit.plan.inputs import Candidate, TuneRun

ESTIMATED = "estimated, not measured"
"""What every output of an estimated plan says of its ETA."""

MFU_SPREAD = 0.30
"""The relative half-width a plan scaled to another device adds to the training time (combined with
the probe's own spread): the MFU on the target may differ from the one measured. +-30% of the time is
the target's MFU between 0.77x and 1.43x the source's. A stated assumption, not a measurement: no two
devices have run one config here yet (docs/plan.md)."""

LOW_MFU = 0.10
"""Below this MFU a step is bound by launching kernels, not by arithmetic (an H100 ran a 1.1B LoRA
model at 5.6-9.2% MFU at batch 1-2, and a ~0.5B model at 1.1-3.6%: docs/benchmarks.md): a faster
device may not shorten it at all, and the plan says so."""

MAX_FIGURE = 1e12
"""The most tokens (or samples) a second a plan from the user's figure takes: a million times what the
largest training runs reach (a 405B model on 16,384 H100s trains ~3e6 tokens/s). Past it a figure is
a typo, and 1e308 made a step of 1e-308 s, whose checkpoint interval in steps overflowed."""


@dataclass(frozen=True, kw_only=True)
class Estimated(Record):
    """Where an estimated plan's speed comes from and the interval it can claim."""

    label: str = ESTIMATED
    basis: str
    """``throughput``: the user's figure, taken as given; ``like``: a measured run scaled to ``device``."""
    speed: str
    """The speed and what it comes from, in words."""
    interval: str
    """What the ETA's interval covers, and why, in words."""
    spread_rel: float
    """The relative half-width the estimate gives the training time (the probe's spread included for
    ``like``; for ``throughput`` the data side's alone)."""
    device: str | None = None
    """``like``: the device the run is planned for, as given."""
    peak_ratio: float | None = None
    """``like``: the measured device's peak FLOP/s over the target's: the factor on each step time."""


def from_throughput(params: Params, stats: LengthStats, *, tokens_per_second: float | None = None,
                    samples_per_second: float | None = None) -> tuple[Candidate, Estimated]:
    """The spec's config (``params``) at the user's speed over the data (``stats``): one of
    ``tokens_per_second`` (real tokens, not padding, of samples cut at ``max_length``) or
    ``samples_per_second``. The figure is taken as given; the interval is the data side's: the mean
    length of a cut sample is estimated from the analysis's uniform sample of lengths where the data
    is larger than it and ``max_length`` cuts some (else it is exact)."""
    if (tokens_per_second is None) == (samples_per_second is None):
        raise TrainfitError("a plan from a throughput takes one figure", "give --throughput or --samples-per-second")
    figure = tokens_per_second if tokens_per_second is not None else samples_per_second
    if not (figure is not None and math.isfinite(figure) and figure > 0):
        raise TrainfitError(f"a throughput must be a positive number, got {figure}", "e.g. --throughput 800")
    if figure > MAX_FIGURE:
        unit = "tokens/s" if tokens_per_second is not None else "samples/s"
        raise TrainfitError(f"{figure:g} {unit} is past any machine: at most {MAX_FIGURE:g} is taken",
                            "give the figure your run measured, e.g. --throughput 800")
    cut = stats.truncation_length(params.max_length)
    lengths = np.minimum(np.asarray(stats.length_sample or [stats.max]), cut)
    mean = stats.mean if cut >= stats.max else float(lengths.mean())
    spread, words = 0.0, "the data's sample count and lengths are counted exactly: no interval"
    if tokens_per_second is None:
        sps = float(figure)
        speed = f"your figure, {figure:,g} samples/s, taken as given (no probe measured it)"
    else:
        sps = tokens_per_second / mean
        speed = (f"your figure, {tokens_per_second:,g} tokens/s (real tokens, not padding), taken as given (no probe "
                 f"measured it): {sps:.4g} samples/s at the data's {mean:,.1f} tokens a sample, cut at {cut:,}")
        if stats.source == GIVEN:
            words = ("the lengths are your figures (no data was counted): the interval leaves out how far they are "
                     "from your data's")
        elif cut < stats.max and len(lengths) < stats.samples:
            spread = _mean_spread(lengths, stats.samples)
            words = (f"the mean tokens a sample cut at {cut:,} comes from {len(lengths):,} of the {stats.samples:,} "
                     f"samples' lengths, drawn uniformly: +-{spread:.2%} (95%)")
    per_step = params.effective_batch_size  # a batch on each process of each machine
    candidate = Candidate(trial=None, searched={}, config=params.to_dict(), samples_per_second=sps,
                          step_time_s=per_step / sps, samples_per_step=float(per_step), spread_rel=spread,
                          peak_gb=0.0, optimizer_gb=0.0, model_gb=0.0, shape_times=[])
    return candidate, Estimated(basis="throughput", speed=speed, spread_rel=spread,
                                interval=f"the data side only, as your figure is taken as given: {words}")


def _mean_spread(lengths: np.ndarray, population: int) -> float:
    """The 95% relative half-width of the mean of ``lengths``, a uniform sample without replacement
    of ``population`` values (with the finite-population correction)."""
    n = len(lengths)
    if n < 2 or not lengths.mean() > 0:
        return 0.0
    error = float(lengths.std(ddof=1)) / math.sqrt(n) * math.sqrt((population - n) / (population - 1))
    return 1.96 * error / float(lengths.mean())


def scaled_to(run: TuneRun, device: str) -> TuneRun:
    """``run`` with each config's speed (its step time, its timed shapes) scaled to ``device`` by
    the two devices' peak FLOP/s at the config's precision, at the MFU measured (its first sights of
    new lengths, shared out in the step, alike), and its spread
    widened by :data:`MFU_SPREAD`. The step's wait for its data (``Measurement.data_wait_s``: the
    host's loader, not the device's arithmetic) stays as measured; the timed shapes are the model's
    alone. A clear error where the run has no MFU or ``device`` no peak."""
    scaled = []
    for c in run.candidates:
        ratio = _peaks(c, device, run)[2]
        wait = min(c.measurement.data_wait_s or 0.0, c.step_time_s) if c.measurement is not None else 0.0
        step = (c.step_time_s - wait) * ratio + wait
        scaled.append(dataclasses.replace(
            c, samples_per_second=c.samples_per_second * c.step_time_s / step, step_time_s=step,
            first_sight_s=c.first_sight_s * ratio, first_sights_s=c.first_sights_s * ratio,
            spread_rel=math.hypot(c.spread_rel, MFU_SPREAD),
            shape_times=[{**s, "seconds": s["seconds"] * ratio} for s in c.shape_times]))
    return dataclasses.replace(run, candidates=scaled)


def like_estimated(chosen: Candidate, device: str, run: TuneRun) -> Estimated:
    """What a plan from ``run`` scaled to ``device`` says of its speed, for the config it chose (a
    candidate of :func:`scaled_to`)."""
    source, target, ratio = _peaks(chosen, device, run)
    m = chosen.measurement
    assert m is not None and m.mfu is not None  # _peaks refuses a config without them
    precision = _precision(chosen)
    speed = (f"trial {chosen.trial}'s probe on {m.device_name} (MFU {m.mfu:.1%}), scaled to {device} at that MFU by "
             f"their peak FLOP/s ({precision}): {source / 1e12:,.4g} against {target / 1e12:,.4g} TFLOP/s, so each "
             f"step x{ratio:.3g}")
    interval = (f"+-{MFU_SPREAD:.0%} on the training time, for the MFU on {device}, which may differ (0.77x-1.43x the "
                f"measured one), combined with the probe's own spread: +-{chosen.spread_rel:.1%} in all")
    return Estimated(basis="like", speed=speed, interval=interval, spread_rel=chosen.spread_rel, device=device,
                     peak_ratio=ratio)


def like_lines(chosen: Candidate, estimated: Estimated) -> list[str]:
    """What else a plan scaled to another device rests on: memory unchecked, and a step too small to
    scale (:data:`LOW_MFU`)."""
    m = chosen.measurement
    where = m.device_name if m else "its device"
    lines = [(f"memory: trial {chosen.trial} peaked at {chosen.peak_gb:.2f} GiB on {where}; whether it fits "
              f"{estimated.device}'s memory is not checked (the peak table holds no memory sizes)")]
    ratio = estimated.peak_ratio or 1.0
    if m is not None and m.mfu is not None and m.mfu < LOW_MFU and ratio != 1.0:
        faster = ratio < 1.0  # the target's peak is the higher
        lines.append(f"its MFU, {m.mfu:.1%}, is low: such a step is bound by launching kernels, not by arithmetic, "
                     f"and may run little {'faster' if faster else 'slower'} on {estimated.device} for its "
                     f"{'higher' if faster else 'lower'} peak: the ETA may be "
                     + ("short, past its high end" if faster else "long, below its low end"))
    return lines


def throughput_lines(stats: LengthStats) -> list[str]:
    """What a plan from the user's figure rests on beside it (``Estimated.speed``), and all it leaves out."""
    lines = [f"data: {stats.samples:,} samples, {stats.description}"]
    if stats.approximate:
        lines.append("the lengths were counted without a tokenizer (regex word pieces), not as the model's tokenizer "
                     "counts them: a figure in tokens/s may be off by as much, beyond the interval; give the spec a "
                     "tokenizer")
    return [*lines,
            ("the trainer's own cost: whatever your figure holds (a figure timed over a trainer's whole steps holds "
             "it; a model's step alone does not: a trainer took 1.4-2.1x the model's step on an H100 and an H200 "
             "with short steps, docs/benchmarks.md)"),
            "memory: not checked (whether the spec's config fits the device is what `trainfit tune` measures there)",
            ("not included: checkpoint saves (their size comes from the memory a probe measures, and none ran), "
             "start-up (model load, tokenization) and the trained model's save, evaluation passes")]


def _precision(c: Candidate) -> str:
    precision = str(c.config.get("precision") or "fp32")
    return "tf32" if precision == "fp32" and c.config.get("tf32") else precision


def _peaks(c: Candidate, device: str, run: TuneRun) -> tuple[float, float, float]:
    """The peak FLOP/s of ``c``'s measured device and of ``device`` at its precision, and the factor
    on its step time (the first over the second)."""
    m = c.measurement
    precision, tf32 = str(c.config.get("precision") or "fp32"), bool(c.config.get("tf32"))
    source = peak_flops(m.device_name, precision, tf32) if m is not None and m.mfu is not None else None
    target = peak_flops(device, precision, tf32)
    problems = []  # both at once: a CPU run planned for a device not on record has two things to fix
    if m is None or source is None:
        where = "a CPU" if m is not None and m.device == "cpu" else (m.device_name or m.device) if m else "its device"
        why = ("peak FLOP/s for CPUs are not on record" if m is not None and m.device == "cpu" else
               "its device has no peak FLOP/s on record, or its workload reports no FLOPs")
        problems.append((f"trial {c.trial} of {run.folder} was measured on {where} with no MFU ({why}): there is "
                         "no measured MFU to scale to another device by peak FLOP/s",
                         "tune on a GPU whose peak is on record (`trainfit env` shows it) and plan --like that "
                         "folder, or plan from a figure you trust: trainfit plan --spec SPEC --throughput "
                         "TOKENS_PER_S --max-hours H"))
    if target is None:
        problems.append((f"no peak FLOP/s on record for --device {device!r}",
                         f"name one of: {', '.join(known_devices())} (src/trainfit/devices.py)"))
    if problems:
        raise TrainfitError("; and ".join(p for p, _ in problems), "; and ".join(f for _, f in problems))
    assert source is not None and target is not None
    return source[0], target[0], source[0] / target[0]
