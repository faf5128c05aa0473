"""The probe's measuring phases on a built model: the memory phase on the worst-case batch, the timed
steps over the epoch's typical shapes until the stop rule says the estimate is stable, and the
speed, FLOPs and epoch fields they give the Measurement. A loss that is not finite stops it.

Imports are light (no torch at the top), as the worker's are."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainfit.devices import peak_flops, synchronize
from trainfit.errors import TrainfitError
from trainfit.flops import utilization
from trainfit.probe.events import emit
from trainfit.probe.loader import LoaderBatches, synthetic_instead, tensors_on_cpu
from trainfit.probe.memory import memory_micro_batches
from trainfit.probe.ranks import agreed, is_distributed
from trainfit.probe.timing import StepTimes, StopRule
from trainfit.workloads.base import Batch

if TYPE_CHECKING:
    from trainfit.probe.request import ProbeRequest


@dataclass
class Built:
    """A model with its knobs and optimizer applied, kept for the next probe with the same key."""

    key: str | None
    workload: Any
    step: Any
    notes: list[str]
    peak_bytes: int
    """CPU: the process's peak RSS right after building (a fresh probe counts it too)."""
    met: set[tuple[int, int, bool]] = field(default_factory=set)
    """The micro-batch shapes (:func:`shape_key`) this model's steps have met, in every probe so far."""
    sights: tuple[float, float] | None = None
    """The first sights its last probe measured (:func:`~trainfit.probe.estimate.first_sights`), for a
    probe that meets no new shape."""


def shape_key(batch: Batch) -> tuple[int, int, bool]:
    """What makes a micro-batch a new shape to the device: its rows, padded length, and packing."""
    return len(batch.seq_lens), batch.padded_len, batch.packed


class LossNotFinite(TrainfitError):
    """A step's loss was NaN or infinite: the config diverges, so the speed of its steps is not a
    speed of training, and a search must not rank it (status ``diverged``)."""


def check_loss(loss: float, phase: str, step: int) -> None:
    """Raise :class:`LossNotFinite` unless ``loss``, of the ``step``-th step of ``phase``, is a
    finite number. Every probe step is checked: a NaN spreads to the weights, and every later
    step computes on NaNs, at a speed that says nothing about training."""
    if not math.isfinite(loss):
        raise LossNotFinite(f"the loss is not finite ({loss}) at step {step} of the {phase} phase: this config "
                            "diverges, so its speed was not kept",
                            "check the model's loss with this config: fp16 overflows where bf16 does not, and "
                            "a loss that divides by a count of zero tokens is NaN")


def capped_length(req: ProbeRequest, positions: int | None, notes: list[str]) -> int:
    """The length batches are truncated at: the request's, capped at the model's ``positions``
    (each cap said in ``notes``). Rounded up to ``pad_to_multiple_of``, a batch may still be padded
    past the model's positions, as the trainer's collator pads it: a model with learned positions
    then fails here as the run would, and a note says why."""
    max_len = req.max_length
    if positions is not None and max_len > positions:
        notes.append(f"max_length {max_len} exceeds the model's {positions} positions: capped")
        max_len = positions
    padded = req.params.padded_length(max_len, max_len)
    if positions is not None and padded > positions and not req.params.packing:  # packed: positions restart a sample
        notes.append(f"pad_to_multiple_of={req.params.pad_to_multiple_of} pads the longest batches to {padded} "
                     f"positions, past the model's {positions}: pick a multiple that divides {positions}")
    return max_len


def measure_memory(req: ProbeRequest, built: Built, max_len: int, out: dict[str, Any],
                   device: Any) -> tuple[int, float]:
    """``probe.memory_steps`` optimizer steps on the worst-case batch (the longest samples), each
    with as many micro-batches as reach the peak of the real accumulation. Returns the worst-case
    shape's padded length and its last step's seconds: the tail point of the step-cost fit, for
    free, where the parent says it is a whole step of the real accumulation after a first one
    (``TypicalMix.times_longest`` false, see probe/estimate.py)."""
    emit("phase", phase="memory")
    worst = [min(n, max_len) for n in req.worst_lengths]
    out["worst_case_lengths"] = worst
    worst_batch = micro_batch(built.workload, req, worst, max_len)
    out["full_logits_bytes"] = built.workload.logits_bytes(worst_batch)
    micro = memory_micro_batches(req.params.gradient_accumulation_steps)
    built.met.add(shape_key(worst_batch))
    seconds = 0.0
    for n in range(req.probe.memory_steps):
        synchronize(device)
        t = time.perf_counter()
        loss = built.step.run([worst_batch] * micro)
        synchronize(device)
        seconds = time.perf_counter() - t
        check_loss(loss, "memory", n + 1)
    return worst_batch.padded_len, seconds


INPUT_BOUND = 0.1
"""The share of a step spent waiting for data from which the loader, not the model, is said to limit samples/s."""


def typical_batches(req: ProbeRequest, workload: Any, max_len: int, out: dict[str, Any]) -> Any:
    """The timed micro-batches: loaded from the dataset's rows (:class:`LoaderBatches`) where the
    parent sent them and the workload can collate them, else made on the device
    (:class:`TypicalBatches`); ``out["data"]`` says which, a note why where ``auto`` fell back."""
    if req.timing_rows is not None:
        pool = [Batch(inputs=None, seq_lens=tuple(lens), padded_len=length, packed=req.params.packing)
                for lens, length in timed_shapes(req, max_len)]
        why, fix = _why_not_loaded(req, workload, pool[0])
        if why is None:
            out["data"] = "real"
            out["notes"] += _uncounted_workers(req, workload)
            return LoaderBatches(req, workload, pool)
        synthetic_instead(req.probe.data, why, fix, out["notes"])
    out["data"] = "synthetic"
    return TypicalBatches(req, workload, max_len)


def _uncounted_workers(req: ProbeRequest, workload: Any) -> list[str]:
    """On a CPU, the peak memory is the probe process's RSS: the loader's worker processes (forks of
    it) hold memory of their own that it leaves out. Said, not summed: a fork's RSS counts the pages
    it shares with its parent again, so a sum would be as wrong the other way."""
    workers = req.params.num_workers
    if workers == 0 or (workload.device is not None and workload.device.type == "cuda"):
        return []  # a GPU's peak is its own memory, which the workers do not use
    return [f"peak memory is the probe process's own: the {workers} DataLoader worker process"
            f"{'es' if workers > 1 else ''}' memory (the rows each collates, the batches it prefetches) is not "
            "counted; leave room for it beside budget.memory_gb"]


def _why_not_loaded(req: ProbeRequest, workload: Any, first: Batch) -> tuple[str | None, str]:
    """Why the dataset's rows cannot go through a loader here, and the fix (None: they can). The
    first shape is collated here once: a collate returning tensors on a GPU would fail in a
    loader's workers (CUDA in a forked process) and in pinning."""
    if not workload.collates_rows:
        return ("the factory returns no collate to make the dataset's rows into inputs",
                "return trainfit.CustomWorkload(..., collate=...)")
    assert req.timing_rows is not None
    if not tensors_on_cpu(workload.collate_rows(req.timing_rows[0], first.padded_len, first.packed)):
        return ("the factory's collate returns tensors on the device, which a DataLoader cannot make in its "
                "workers or pin", "return CPU tensors from collate: trainfit moves them to the device")
    return None, ""


def input_bound_note(fields: dict[str, Any], params: Any) -> str | None:
    """What to do when the timed steps waited for their data a share of :data:`INPUT_BOUND` or more."""
    share = fields.get("input_bound_share") or 0.0
    if share < INPUT_BOUND:
        return None
    return (f"input-bound: each step waited {fields['data_wait_s'] * 1000:.3g} ms for its data ({share:.0%} of the "
            f"step), so the data loader, not the model, limits samples/s: raise num_workers (now {params.num_workers}) "
            "or make the collate cheaper")


def micro_batch(workload: Any, req: ProbeRequest, lengths: list[int], max_len: int) -> Any:
    """A micro-batch of samples this long as the trainer collates it: rows padded to
    ``Params.batch_length``, or under ``packing`` one padding-free row of them all."""
    length = req.params.batch_length(lengths, max_len)
    return workload.make_packed_batch(lengths, length) if req.params.packing else workload.make_batch(lengths, length)


def timed_shapes(req: ProbeRequest, max_len: int) -> list[tuple[list[int], int]]:
    """Each timed micro-batch's sample lengths (truncated at ``max_len``) and padded length, one per
    shape the parent picked across the epoch's padded lengths (``req.typical.timing_batches``, see
    probe/estimate.py)."""
    shapes = []
    for lengths in req.typical.timing_batches:
        lens = [min(n, max_len) for n in lengths]
        shapes.append((lens, req.params.batch_length(lens, max_len)))
    return shapes


class TypicalBatches:
    """The typical micro-batches to time, one per shape (:func:`timed_shapes`), made on the device
    (``probe.data: synthetic``) and cycled: each optimizer step runs ``gradient_accumulation_steps``
    copies of one of them, the next step the next one. Nothing is loaded: no step waits for data."""

    last_wait = 0.0
    start_s = None

    def __init__(self, req: ProbeRequest, workload: Any, max_len: int) -> None:
        self.accum = req.params.gradient_accumulation_steps
        self.pool = [micro_batch(workload, req, lens, max_len) for lens, _ in timed_shapes(req, max_len)]
        self.cycle = len(self.pool)
        self.cursor = 0

    def next_step(self) -> tuple[int, list[Any]]:
        """Which shape the next optimizer step is, and its micro-batches."""
        shape = self.cursor % self.cycle
        self.cursor += 1
        return shape, [self.pool[shape]] * self.accum

    def close(self) -> None:
        """Nothing to stop (see ``LoaderBatches.close``)."""


@dataclass
class TimedSteps:
    """What the timed phase measured: each step's seconds and shape, and what the steps held."""

    times: list[float]
    stable: bool
    cycle: int
    shapes: list[int] = field(default_factory=list)
    """The index of each timed step's shape in the pool."""
    waits: list[float] = field(default_factory=list)
    """The seconds each timed step waited for its micro-batches (0 without a loader)."""
    skipped: int = 0
    """fp16: the timed steps whose update the loss scaler skipped."""
    model_flops: float = 0.0
    hardware_flops: float = 0.0
    flops_known: bool = True
    slower: bool = False
    """It stopped because the config was clearly slower than the request's bar (:func:`clearly_slower`)."""


def burn_in(req: ProbeRequest, built: Built, batches: TypicalBatches, device: Any) -> dict[int, float]:
    """``probe.burn_in_steps`` steps, and at least one whole cycle, so every shape of the pool has
    been seen before timing. Returns the seconds of the first step of each shape the model had not
    met before (its first sight, timed alone), by the shape's index in the pool, in the order met."""
    first: dict[int, float] = {}
    for n in range(max(req.probe.burn_in_steps, batches.cycle)):
        shape, micro = batches.next_step()
        new = shape_key(micro[0]) not in built.met  # the same on every rank: their pools are alike
        if new:
            synchronize(device)
        t0 = time.perf_counter()
        check_loss(built.step.run(micro), "burn_in", n + 1)
        if new:
            synchronize(device)
            first[shape] = agreed(time.perf_counter() - t0)
            built.met.add(shape_key(micro[0]))
    synchronize(device)
    return first


def time_steps(req: ProbeRequest, built: Built, batches: TypicalBatches, device: Any,
               slower: Callable[[TimedSteps], bool] | None = None) -> TimedSteps:
    """Typical steps, each timed alone (synchronized before and after), until the stop rule says
    the estimate is stable or a cap is reached, or ``slower`` says the config is clearly slower than
    the search's bar (:func:`clearly_slower`)."""
    settings = req.probe
    emit("phase", phase="timed")
    rule = StopRule(settings.min_steps, settings.max_steps, settings.max_seconds, settings.target_rel_ci,
                    batches.cycle)
    timed = TimedSteps(times=[], stable=False, cycle=batches.cycle)
    while True:
        shape, micro = batches.next_step()
        timed.shapes.append(shape)
        timed.waits.append(agreed(batches.last_wait))
        synchronize(device)
        t0 = time.perf_counter()
        loss = built.step.run(micro)
        synchronize(device)
        timed.times.append(agreed(time.perf_counter() - t0))
        check_loss(loss, "timed", len(timed.times))
        timed.skipped += built.step.last_skipped
        for b in micro:
            f = built.workload.flops(b.seq_lens, req.params.gradient_checkpointing)
            if f is None:
                timed.flops_known = False
            else:
                timed.model_flops += f.model
                timed.hardware_flops += f.hardware
        stop, timed.stable = rule.done(timed.times, timed.waits)
        emit("step", n=len(timed.times), seconds=timed.times[-1])
        if not stop and slower is not None and slower(timed):
            timed.slower = stop = True
        if stop:
            return timed


def clearly_slower(req: ProbeRequest, batches: TypicalBatches, max_len: int, worst_step: tuple[int, float],
                   built: Built, first: dict[int, float]) -> Callable[[TimedSteps], bool] | None:
    """Where the request holds a bar (:class:`~trainfit.probe.request.Bar`): after each whole cycle
    from the second on (every shape timed twice, so the interval is the cycles' own), is the epoch's
    speed from the steps so far (:func:`epoch_fields`, as the probe will report it), at the fast end
    of its 95% interval, below the bar's slow end? Such a config cannot be the fastest of its
    learning values, and more steps would only narrow an interval that already ranks it. None: no bar."""
    bar = req.slower_than
    if bar is None:
        return None

    def check(timed: TimedSteps) -> bool:
        n = len(timed.times)
        if n < max(3, 2 * timed.cycle) or n % timed.cycle:  # the agreed steps: every rank asks at the same step
            return False
        ci = StepTimes.of(timed.times, timed.cycle).ci95_rel
        sights = built.sights  # the epoch's speed so far, without keeping its first sights from a partial timing
        try:
            speed = epoch_fields(req, timed, batches, max_len, worst_step, built, first)[bar.objective]
        finally:
            built.sights = sights
        # the memory phase's worst step is each rank's own: every rank stops where any says so
        return agreed(1.0 if speed is not None and bar.beats(speed, ci) else 0.0) > 0

    return check


def communication_share(req: ProbeRequest, built: Built, batches: TypicalBatches, timed: TimedSteps,
                        device: Any) -> float | None:
    """Under DDP, the share of a step's time its gradients' all-reduce adds: one cycle of the timed
    shapes again with no micro-batch syncing, each against the median of the timed steps of its
    shape (every rank agrees on the slowest's seconds); clamped at 0 (noise can make the unsynced
    steps the slower). None in one process and under FSDP (its gathers are the step, not an addition)."""
    if req.params.parallel != "ddp" or not is_distributed():
        return None
    by_shape: dict[int, list[float]] = {}
    for shape, seconds in zip(timed.shapes, timed.times):
        by_shape.setdefault(shape, []).append(seconds)
    synced = unsynced = 0.0
    built.step.sync_gradients = False
    try:
        for _ in range(batches.cycle):
            shape, micro = batches.next_step()
            synchronize(device)
            t0 = time.perf_counter()
            built.step.run(micro)
            synchronize(device)
            seconds = agreed(time.perf_counter() - t0)
            if shape in by_shape:  # a timed phase cut short by its time cap may not have met every shape
                unsynced, synced = unsynced + seconds, synced + statistics.median(by_shape[shape])
    finally:
        built.step.sync_gradients = True
    return max(0.0, 1.0 - unsynced / synced) if synced else None


def check_scaler(timed: TimedSteps, skipped: int, notes: list[str]) -> None:
    """fp16: a config whose loss scaler skipped every timed step's update diverges (each step's
    gradients overflowed: it trains nothing, and a skipped step is faster than a real one); where it
    skipped some (``skipped`` in the whole probe), a note says how many."""
    if timed.skipped and timed.skipped == len(timed.times):
        raise LossNotFinite(f"fp16's loss scaler skipped every timed step ({timed.skipped} of {len(timed.times)}): "
                            "the gradients overflowed at each, so the config trains nothing and its speed was not kept",
                            "use precision: bf16 (fp16's range is what overflows), or lower the learning rate")
    if skipped:
        notes.append(f"fp16: the loss scaler skipped {skipped} step(s) of the probe ({timed.skipped} of the "
                     f"{len(timed.times)} timed) whose gradients overflowed; a few at the start, while it lowers "
                     "its scale from 2**16, are normal")


def speed_fields(req: ProbeRequest, timed: TimedSteps, device_name: str, notes: list[str]) -> dict[str, Any]:
    """The Measurement fields of the timed steps: step-time statistics, FLOPs and MFU (where the
    device's peak is on record; a note says why not otherwise). The speeds are the epoch's
    (:func:`epoch_fields`)."""
    params = req.params
    cuda = req.device.startswith("cuda")
    st = StepTimes.of(timed.times, timed.cycle)
    fields: dict[str, Any] = dict(
        status="ok",
        step_time_median_s=st.median, step_time_mean_s=st.mean, step_time_std_s=st.std,
        step_time_ci95_rel=st.ci95_rel if st.n > 1 else None, step_time_ci95_basis=st.basis if st.n > 1 else None,
        steps_measured=st.n, stable=timed.stable, step_times_s=[round(x, 6) for x in timed.times],
        samples_per_step=params.effective_batch_size,
    )
    if params.packing:  # a packed row holds several samples: the epoch's mean per optimizer step
        mix = req.typical
        fields["samples_per_step"] = (mix.samples * params.gradient_accumulation_steps * params.processes
                                      / mix.micro_batches)
    peak = peak_flops(device_name, params.precision, params.tf32) if cuda else None
    if timed.flops_known:
        fields["model_flops_per_step"] = timed.model_flops / st.n
        if peak is not None:
            fields["mfu"] = utilization(timed.model_flops, st.total, peak[0])
            fields["hfu"] = utilization(timed.hardware_flops, st.total, peak[0])
            fields["peak_flops_source"] = peak[1]
    else:
        notes.append("MFU unknown: the workload does not report FLOPs")
    if cuda and peak is None:
        notes.append(f"MFU unknown: no peak FLOP/s on record for {device_name}")
    return fields


def epoch_fields(req: ProbeRequest, timed: TimedSteps, batches: TypicalBatches, max_len: int,
                 worst_step: tuple[int, float], built: Built, first: dict[int, float]) -> dict[str, Any]:
    """The speed of a first epoch of the data's own batches (``req.typical``) in a fresh process: the
    step cost fitted on the median time of each timed shape (and the memory phase's worst-case step,
    the tail, when the parent left the longest batch out of the timed ones), summed over the epoch's
    micro-batches (probe/estimate.py), and the first sight of the epoch's padded lengths, from
    ``first`` (each new shape's first step, :func:`burn_in`), else from ``built``'s last probe where
    every shape was met before (kept in ``built.sights``). Where no shape was timed twice, the fit's
    residuals give the speed's spread (``step_time_ci95_rel``, :func:`~trainfit.probe.estimate.fit_noise_ci95`)."""
    # local: the probe worker imports this module, and binds to its parent before numpy loads
    from trainfit.probe.estimate import (epoch_first_sights, epoch_speed, first_sights, fit_error, fit_noise_ci95,
                                         fit_step_cost)

    mix = req.typical
    lengths, seconds, shape_times = [], [], []
    warm: dict[int, float] = {}
    for k, batch in enumerate(batches.pool):
        mine = [t for t, s in zip(timed.times, timed.shapes, strict=True) if s == k]
        if not mine:
            continue
        lengths.append(batch.padded_len)
        seconds.append(warm.setdefault(k, statistics.median(mine)))
        shape_times.append({"rows": batch.samples, "padded_length": batch.padded_len,
                            "real_tokens": batch.real_tokens, "seconds": round(seconds[-1], 6), "steps": len(mine),
                            "first_seconds": round(first[k], 6) if k in first else None})
    if not mix.times_longest and worst_step[0] > max(lengths, default=0):
        lengths.append(worst_step[0])
        seconds.append(worst_step[1])
        shape_times.append({"rows": len(req.worst_lengths), "padded_length": worst_step[0],
                            "real_tokens": sum(min(n, max_len) for n in req.worst_lengths),
                            "seconds": round(worst_step[1], 6), "steps": 1, "phase": "memory"})
    cost = fit_step_cost(lengths, seconds)
    # The mix's padded lengths capped as the batches were: at the cap's own padded length.
    cap = req.params.batch_length([max_len] * req.params.batch_size, max_len)
    wait = statistics.fmean(timed.waits) if timed.waits else 0.0
    # Each optimizer step takes gradient_accumulation_steps micro-batches on each process of each machine.
    per_step = req.params.gradient_accumulation_steps * req.params.processes
    built.sights = first_sights(first, warm) or built.sights
    shapes = len({min(n, cap) for n in mix.padded_lengths})
    sights = epoch_first_sights(built.sights, shapes)
    speed = epoch_speed(cost, mix, per_step, cap, wait_s=wait, first_sights_s=sights)
    # Per optimizer step: the samples of effective_batch_size rows over the ranks, or under packing those their packed rows hold.
    step_share = (per_step / mix.micro_batches if req.params.packing
                  else req.params.effective_batch_size / mix.samples)
    fields = {"samples_per_second": speed.samples_per_second, "tokens_per_second": speed.tokens_per_second,
            "real_tokens_per_step": mix.real_tokens * step_share,
            "padded_tokens_per_step": mix.padded_tokens * step_share,
            "expected_step_time_s": speed.step_seconds, "speed_basis": mix.batching,
            "padding_share": mix.padding_share, "shape_times": shape_times,
            "fit_error_rel": fit_error(cost, lengths, seconds), "data_wait_s": wait,
            "first_sight_s": built.sights[1] if built.sights else None, "first_sights_s": sights,
            "epoch_shapes": shapes,
            "input_bound_share": sum(timed.waits) / (sum(timed.waits) + sum(timed.times))}
    if all(s["steps"] == 1 for s in shape_times) and (noise := fit_noise_ci95(cost, lengths, seconds)) is not None:
        # No shape timed twice (one cycle, cut by max_seconds): the spread of all steps would call the
        # shapes' own differences noise (probe.timing); their scatter about the cost curve stands for it.
        fields |= {"step_time_ci95_rel": noise, "step_time_ci95_basis": "fit"}
    return fields

