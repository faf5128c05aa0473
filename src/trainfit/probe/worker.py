"""The probe's child process: build a configuration, measure it, write a Measurement.

Started by the runner (:func:`trainfit.probe.runner.worker_command`) with ``SPAWNED_AT PARENT_PID
PDEATHSIG EVENTS_FD`` (see :func:`main`); each line on stdin is a job,
``{"request": REQUEST.json, "result": RESULT.json}``. Whatever happens here (an OOM, a segfault
in a kernel, a hang) stays here: the parent reads RESULT.json or, when there is none, classifies
the exit. Progress goes to the event channel, a pipe of its own (:mod:`trainfit.probe.events`);
``result`` ends a job. The process the runner started stays behind as the worker's supervisor
(:mod:`trainfit.probe.supervisor`), which ends whatever the worker leaves running.

Imports at the top are light (no numpy, no torch): :func:`main` forks before any library has
started a thread.

A request with a ``model_key`` may be followed by another with the same key (the same config but
for the batch shape): it runs on the model this process already built, after the previous probe's
memory is returned and the peak counters restart. After any failed probe the process exits, so
the next probe gets a fresh one.

Phases: start (process + imports) -> build (model, knobs, optimizer) -> memory (optimizer steps on
the worst-case batch; AdamW allocates its state at the first step, so >= 2; at most two
micro-batches each, see :func:`memory_micro_batches`) -> burn_in (typical
batches, untimed: compile, cuDNN autotune, allocator warm-up) -> timed (typical batches at a few
shapes spread over the epoch's padded lengths, whose fitted cost gives the epoch's speed, until the
stop rule in :mod:`trainfit.probe.timing` says the estimate is stable).
"""

from __future__ import annotations

import gc
import json
import math
import os
import re
import resource
import signal
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainfit.errors import TrainfitError
from trainfit.files import write_atomically
from trainfit.probe.events import emit, open_channel
from trainfit.probe.supervisor import PARENT_POLL_S, PR_SET_PDEATHSIG, supervise

if TYPE_CHECKING:
    from trainfit.probe.request import ProbeRequest


def is_oom(err: BaseException, capped_cpu: bool = False) -> bool:
    """Out of memory on any device. CPU allocation failures surface as RuntimeError text; under a
    CPU memory cap, oneDNN reports a failed scratchpad allocation as 'could not create a primitive'."""
    if isinstance(err, MemoryError):
        return True
    if capped_cpu and isinstance(err, RuntimeError) and (
            "could not create a primitive" in str(err) or "bad_alloc" in str(err)):
        return True
    if capped_cpu and isinstance(err, (ImportError, OSError)) and "failed to map segment" in str(err):
        return True  # a library's code and data are mapped in whole, and the cap counts them
    try:
        import torch

        if isinstance(err, torch.OutOfMemoryError):
            return True
    except ImportError:
        pass
    text = str(err)
    return isinstance(err, RuntimeError) and (
        "can't allocate memory" in text or "out of memory" in text.lower() or "not enough memory" in text)


_UNITS = {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10, "bytes": 1, "B": 1}


def memory_at_failure(error: str, cuda: bool) -> tuple[int | None, int | None]:
    """What was allocated when an allocation failed (CUDA: tensors; CPU: the process's allocated
    address space, what a CPU cap counts) and what the failed allocation asked for, read from the
    allocator's message; None where unknown. Read before the failed step's tensors are freed."""
    asked = None
    if found := re.search(r"tried to allocate (\d+) bytes", error):  # torch's CPU allocator
        asked = int(found.group(1))
    elif found := re.search(r"Tried to allocate ([\d.]+) (GiB|MiB|KiB|bytes|B)\b", error):  # CUDA's
        asked = int(float(found.group(1)) * _UNITS[found.group(2)])
    if cuda:
        import torch

        return int(torch.cuda.memory_allocated()), asked
    from trainfit.devices import committed_bytes

    return committed_bytes(), asked


def cpu_cap_explained(held: int | None, asked: int | None, cap: int) -> str:
    """Why a CPU probe can fail under its cap below the RSS peak it reports: the cap counts what
    was allocated, touched or not (a buffer written in part is resident in part)."""
    if held is None:
        return ""
    more = f", asking for {asked / 2**20:,.1f} MiB more" if asked is not None else ""
    return (f" ({held / 2**30:.2f} GiB allocated{more}, against a cap of {cap / 2**30:.2f} GiB; the cap "
            "counts allocations whole, as a GPU would, while the peak RSS counts only the pages written)")


def memory_micro_batches(accum: int) -> int:
    """Micro-batches per optimizer step of the memory phase. The second micro-batch of a step is
    the first to run its forward and backward beside the accumulated gradients; every later one
    holds the same tensors (gradients accumulate in place), so two reach the step's peak and the
    rest would only cost time (30 of 32 worst-case passes at batch 1 x accumulation 16)."""
    return min(accum, 2)


def device_memory_gb(device: Any) -> float:
    """What a probe may use when the spec sets no budget: the GPU's memory, or the machine's RAM."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / 1024**3
    import psutil

    return psutil.virtual_memory().total / 1024**3


class BudgetBelowStart(TrainfitError, MemoryError):
    """A CPU budget below what this process holds once started: every probe under it is an OOM."""


class LossNotFinite(TrainfitError):
    """A step's loss was NaN or infinite: the config diverges, so the speed of its steps is not a
    speed of training, and a search must not rank it (``Measurement.diverged``)."""


def check_loss(loss: float, phase: str, step: int) -> None:
    """Raise :class:`LossNotFinite` unless ``loss``, of the ``step``-th step of ``phase``, is a
    finite number. Every probe step is checked: a NaN spreads to the weights, and every later
    step computes on NaNs, at a speed that says nothing about training."""
    if not math.isfinite(loss):
        raise LossNotFinite(f"the loss is not finite ({loss}) at step {step} of the {phase} phase: this config "
                            "diverges, so its speed was not kept",
                            "check the model's loss with this config: fp16 overflows where bf16 does not, and "
                            "a loss that divides by a count of zero tokens is NaN")


def cap_cpu_memory(cap: int, out: dict[str, Any]) -> None:
    """Cap this process's data at ``cap`` bytes (``RLIMIT_DATA``). The cap covers the whole process,
    interpreter and libraries included, so an allocation beyond it fails for real
    ("DefaultCPUAllocator: can't allocate memory"). Set once torch is imported: a cap below what
    that takes made the import fail with a traceback; now the OOM names what starting takes."""
    from trainfit.devices import committed_bytes

    held = committed_bytes()
    if held is not None and held >= cap:
        out["oom_needed_bytes"] = held
        raise BudgetBelowStart(f"budget.memory_gb {cap / 2**30:g} GiB is below what the probe process needs just "
                               f"to start: {held / 2**30:.2f} GiB (Python and torch, before any model)",
                               f"raise budget.memory_gb well above {held / 2**30:.2f} GiB")
    resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))


def cap_memory(cap: int, device: Any, out: dict[str, Any], *, cpu: bool = True) -> None:
    """Cap what this process may use on ``device`` at ``cap`` bytes: a CUDA device's memory
    fraction, or (``cpu``: once, in a fresh process) its data on a CPU (:func:`cap_cpu_memory`).
    A need beyond it then fails for real, as out of memory."""
    if device.type == "cuda":
        import torch

        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
    elif cpu:
        cap_cpu_memory(cap, out)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class Built:
    """A model with its knobs and optimizer applied, kept for the next probe with the same key."""

    key: str | None
    workload: Any
    step: Any
    notes: list[str]
    peak_bytes: int
    """CPU: the process's peak RSS right after building (a fresh probe counts it too)."""


def _tensor_bytes(values: Sequence[Any]) -> int:
    """Bytes held by the tensors among ``values`` (each storage once: tied weights count once)."""
    import torch

    seen: set[int] = set()
    total = 0
    for v in values:
        if isinstance(v, torch.Tensor) and v.device.type != "meta":
            storage = v.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total


class MemoryMeter:
    """Peak memory of one probe.

    CUDA: the caching allocator's max reserved bytes since the memory phase began (what decides
    an OOM), allocated bytes and allocator retries. CPU: the process's peak RSS; on a reused model
    the peak restarts once the previous probe's memory is returned, never below the peak of
    building the model, which a fresh process would count too. Both split the peak into parts
    (``Measurement.memory_parts_bytes``): the model's and optimizer's tensors counted exactly,
    what else stays held between steps, and what the worst-case step adds.
    """

    def __init__(self, device_type: str) -> None:
        self.cuda = device_type.startswith("cuda")
        self.floor = 0
        self.retries_before = 0
        self.built: Built | None = None

    def start(self, built: Built, reused: bool) -> None:
        """The steps' peak counts from here. On CPU the build's peak stays the floor, as a fresh
        process would count it (CUDA builds on the host: ``from_pretrained`` loads, then moves)."""
        gc.collect()
        self.built = built
        if self.cuda:
            import torch

            if reused:
                torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            self.retries_before = int(torch.cuda.memory_stats().get("num_alloc_retries", 0))
        else:
            from trainfit.devices import reset_peak_rss

            reset_peak_rss()
            self.floor = built.peak_bytes

    def fields(self) -> dict[str, Any]:
        if self.built is not None:
            self.built.step.optimizer.zero_grad(set_to_none=True)  # a failed step leaves gradients behind
        gc.collect()
        if self.cuda:
            import torch

            retries = int(torch.cuda.memory_stats().get("num_alloc_retries", 0)) - self.retries_before
            reserved, allocated = int(torch.cuda.max_memory_reserved()), int(torch.cuda.max_memory_allocated())
            parts = self.parts(allocated, int(torch.cuda.memory_allocated()))
            if parts:
                parts["allocator_cache"] = max(0, reserved - allocated)
            return {"peak_memory_bytes": reserved, "peak_allocated_bytes": allocated, "alloc_retries": retries,
                    "memory_parts_bytes": parts}
        from trainfit.devices import peak_rss_bytes, rss_bytes

        steps_peak = peak_rss_bytes()
        held = rss_bytes()
        parts = self.parts(steps_peak, held) if held is not None else {}
        if parts and self.floor > steps_peak:
            parts["build"] = self.floor - steps_peak
        return {"peak_memory_bytes": max(self.floor, steps_peak), "memory_parts_bytes": parts}

    def parts(self, steps_peak: int, held: int) -> dict[str, int]:
        """Where the steps' peak went (see ``Measurement.memory_parts_bytes``); ``held`` is what
        the process holds between steps, read after the probe (its batches and gradients freed)."""
        if self.built is None:
            return {}
        model, optimizer = self.built.workload.model, self.built.step.optimizer
        try:
            weights = _tensor_bytes([*model.parameters(), *model.buffers()])
            state = _tensor_bytes([v for per_param in optimizer.state.values() for v in per_param.values()])
        except Exception:  # a model left unusable by its failure: the peak is still reported
            return {}
        return {"model": weights, "optimizer": state, "runtime": max(0, held - weights - state),
                "step": max(0, steps_peak - held)}


class ModelCache:
    """The one model a worker keeps between probes."""

    built: Built | None = None

    def take(self, key: str | None) -> Built | None:
        """The kept model if ``key`` matches it; otherwise the kept model is dropped first."""
        if key is not None and self.built is not None and self.built.key == key:
            return self.built
        if self.built is not None:
            self.built = None
            gc.collect()
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        return None


def run(req: ProbeRequest, out: dict[str, Any], cache: ModelCache, meter: MemoryMeter,
        spawned_at: float | None) -> None:
    """Measure the configuration in ``req`` into ``out`` (Measurement fields); raises on failure,
    leaving in ``out`` what was learned before it. ``spawned_at``: when this process was started
    for this probe (None when the worker was already running: no start time to pay).

    The phases, in order: build (or reuse) the model, the memory phase on the worst-case batch,
    burn-in on typical batches, then timed steps until the estimate is stable."""
    from trainfit.devices import versions
    from trainfit.step import synchronize

    phases: dict[str, float] = {"start": 0.0 if spawned_at is None else time.time() - spawned_at}
    out.update(phases_s=phases, versions=versions())
    device = open_device(req, out, capped_now=spawned_at is not None)
    built, reused, phases["build"] = build(req, device, cache)
    out["model_reused"] = reused
    out["notes"] += built.notes
    max_len = capped_length(req, built.workload.max_positions, out["notes"])

    t = time.perf_counter()
    meter.start(built, reused)
    worst_step = measure_memory(req, built, max_len, out, device)
    synchronize(device)
    phases["memory"] = time.perf_counter() - t

    batches = TypicalBatches(req, built.workload, max_len)
    emit("phase", phase="burn_in")
    t = time.perf_counter()
    # At least one whole cycle, so every batch shape of the pool has been seen before timing.
    for n in range(max(req.probe.burn_in_steps, batches.cycle)):
        check_loss(built.step.run(batches.next_step()[1]), "burn_in", n + 1)
    synchronize(device)
    phases["burn_in"] = time.perf_counter() - t

    t = time.perf_counter()
    timed = time_steps(req, built, batches, device)
    phases["timed"] = time.perf_counter() - t
    out.update(speed_fields(req, timed, out["device_name"], out["notes"]))
    out.update(epoch_fields(req, timed, batches, max_len, worst_step))


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
    if positions is not None and padded > positions:
        notes.append(f"pad_to_multiple_of={req.params.pad_to_multiple_of} pads the longest batches to {padded} "
                     f"positions, past the model's {positions}: pick a multiple that divides {positions}")
    return max_len


def open_device(req: ProbeRequest, out: dict[str, Any], capped_now: bool) -> Any:
    """The torch device of ``req``, made current, under the budget's cap; records what it is.
    ``capped_now``: a fresh process before its first probe, where the CPU cap is set for its life."""
    import torch

    from trainfit.devices import cpu_name

    cap = req.memory_cap_bytes
    device = torch.device(req.device)
    cuda = device.type == "cuda"
    if cuda:
        # Memory counters, caches and bf16 support read the *current* device: on cuda:1 they
        # would read (and open a context on) cuda:0, and every config would seem to use nothing.
        torch.cuda.set_device(device)
    if cap:
        cap_memory(cap, device, out, cpu=capped_now)
    out["device"] = str(device)
    out["device_name"] = torch.cuda.get_device_name(device) if cuda else cpu_name()
    out["cpu_threads"] = torch.get_num_threads()
    if req.budget_memory_gb is None:
        out["budget_memory_gb"] = own = device_memory_gb(device)
        out["notes"].append(f"no budget.memory_gb: this {'GPU' if cuda else 'machine'}'s {own:.1f} GiB is the budget "
                            f"(headroom {req.budget_headroom_gb:g} GiB)")
    return device


def build(req: ProbeRequest, device: Any, cache: ModelCache) -> tuple[Built, bool, float]:
    """The model with its knobs and optimizer applied, whether it was reused, and the seconds
    building took: the worker's
    kept model when only the batch shape differs (``req.model_key``), else a new one (kept for the
    next probe when it may be reused)."""
    from trainfit.devices import peak_rss_bytes
    from trainfit.spec import Spec, TuneSettings
    from trainfit.step import TrainStep, check_support
    from trainfit.workloads import build_workload

    built = cache.take(req.model_key)
    if built is not None:
        built.step.params = req.params  # only batch-shape knobs differ (the key says so)
        return built, True, 0.0
    emit("phase", phase="build")
    t = time.perf_counter()
    notes = check_support(req.params, device)
    spec = Spec(model=req.model, data=None, params=req.params, probe=req.probe,
                tune=TuneSettings(command_template=req.command_template))
    workload = build_workload(spec, req.params, device)
    step = TrainStep(workload, req.params, device)
    built = Built(req.model_key, workload, step, notes + workload.notes,
                  0 if device.type == "cuda" else peak_rss_bytes())
    if built.key is not None:
        cache.built = built
    return built, False, time.perf_counter() - t


def measure_memory(req: ProbeRequest, built: Built, max_len: int, out: dict[str, Any],
                   device: Any) -> tuple[int, float]:
    """``probe.memory_steps`` optimizer steps on the worst-case batch (the longest samples), each
    with as many micro-batches as reach the peak of the real accumulation. Returns the worst-case
    shape's padded length and its last step's seconds: the tail point of the step-cost fit, for
    free, where the parent says it is a whole step of the real accumulation after a first one
    (``TypicalMix.times_longest`` false, see probe/estimate.py)."""
    from trainfit.step import synchronize

    emit("phase", phase="memory")
    worst = [min(n, max_len) for n in req.worst_lengths]
    out["worst_case_lengths"] = worst
    worst_batch = built.workload.make_batch(worst, req.params.padded_length(max(worst), max_len))
    out["full_logits_bytes"] = built.workload.logits_bytes(worst_batch)
    micro = memory_micro_batches(req.params.gradient_accumulation_steps)
    seconds = 0.0
    for n in range(req.probe.memory_steps):
        synchronize(device)
        t = time.perf_counter()
        loss = built.step.run([worst_batch] * micro)
        synchronize(device)
        seconds = time.perf_counter() - t
        check_loss(loss, "memory", n + 1)
    return worst_batch.padded_len, seconds


class TypicalBatches:
    """The typical micro-batches to time, one per shape the parent picked across the epoch's padded
    lengths (``req.typical.timing_batches``, see probe/estimate.py), cycled: each optimizer step runs
    ``gradient_accumulation_steps`` copies of one of them, the next step the next one."""

    def __init__(self, req: ProbeRequest, workload: Any, max_len: int) -> None:
        self.accum = req.params.gradient_accumulation_steps
        self.pool = []
        for lengths in req.typical.timing_batches:
            lens = [min(n, max_len) for n in lengths]
            self.pool.append(workload.make_batch(lens, req.params.padded_length(max(lens), max_len)))
        self.cycle = len(self.pool)
        self.cursor = 0

    def next_step(self) -> tuple[int, list[Any]]:
        """Which shape the next optimizer step is, and its micro-batches."""
        shape = self.cursor % self.cycle
        self.cursor += 1
        return shape, [self.pool[shape]] * self.accum


@dataclass
class TimedSteps:
    """What the timed phase measured: each step's seconds and shape, and what the steps held."""

    times: list[float]
    stable: bool
    cycle: int
    shapes: list[int] = field(default_factory=list)
    """The index of each timed step's shape in the pool."""
    model_flops: float = 0.0
    hardware_flops: float = 0.0
    flops_known: bool = True


def time_steps(req: ProbeRequest, built: Built, batches: TypicalBatches, device: Any) -> TimedSteps:
    """Typical steps, each timed alone (synchronized before and after), until the stop rule says
    the estimate is stable or a cap is reached."""
    from trainfit.probe.timing import StopRule
    from trainfit.step import synchronize

    settings = req.probe
    emit("phase", phase="timed")
    rule = StopRule(settings.min_steps, settings.max_steps, settings.max_seconds, settings.target_rel_ci,
                    batches.cycle)
    timed = TimedSteps(times=[], stable=False, cycle=batches.cycle)
    while True:
        shape, micro = batches.next_step()
        timed.shapes.append(shape)
        synchronize(device)
        t0 = time.perf_counter()
        loss = built.step.run(micro)
        synchronize(device)
        timed.times.append(time.perf_counter() - t0)
        check_loss(loss, "timed", len(timed.times))
        for b in micro:
            f = built.workload.flops(b.seq_lens, req.params.gradient_checkpointing)
            if f is None:
                timed.flops_known = False
            else:
                timed.model_flops += f.model
                timed.hardware_flops += f.hardware
        stop, timed.stable = rule.done(timed.times)
        emit("step", n=len(timed.times), seconds=timed.times[-1])
        if stop:
            return timed


def speed_fields(req: ProbeRequest, timed: TimedSteps, device_name: str, notes: list[str]) -> dict[str, Any]:
    """The Measurement fields of the timed steps: step-time statistics, FLOPs and MFU (where the
    device's peak is on record; a note says why not otherwise). The speeds are the epoch's
    (:func:`epoch_fields`)."""
    from trainfit.devices import peak_flops
    from trainfit.flops import utilization
    from trainfit.probe.timing import StepTimes

    params = req.params
    cuda = req.device.startswith("cuda")
    st = StepTimes.of(timed.times, timed.cycle)
    fields: dict[str, Any] = dict(
        status="ok",
        step_time_median_s=st.median, step_time_mean_s=st.mean, step_time_std_s=st.std,
        step_time_ci95_rel=st.ci95_rel if st.n > 1 else None,
        steps_measured=st.n, stable=timed.stable, step_times_s=[round(x, 6) for x in timed.times],
        samples_per_step=params.effective_batch_size,
    )
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
                 worst_step: tuple[int, float]) -> dict[str, Any]:
    """The speed of an epoch of the data's own batches (``req.typical``): the step cost fitted on
    the median time of each timed shape (and the memory phase's worst-case step, the tail, when
    the parent left the longest batch out of the timed ones), summed over the epoch's
    micro-batches (probe/estimate.py)."""
    import statistics

    from trainfit.probe.estimate import epoch_speed, fit_error, fit_step_cost

    mix = req.typical
    lengths, seconds, shape_times = [], [], []
    for k, batch in enumerate(batches.pool):
        mine = [t for t, s in zip(timed.times, timed.shapes, strict=True) if s == k]
        if not mine:
            continue
        lengths.append(batch.padded_len)
        seconds.append(statistics.median(mine))
        shape_times.append({"rows": batch.samples, "padded_length": batch.padded_len,
                            "real_tokens": batch.real_tokens, "seconds": round(seconds[-1], 6), "steps": len(mine)})
    if not mix.times_longest and worst_step[0] > max(lengths, default=0):
        lengths.append(worst_step[0])
        seconds.append(worst_step[1])
        shape_times.append({"rows": len(req.worst_lengths), "padded_length": worst_step[0],
                            "real_tokens": sum(min(n, max_len) for n in req.worst_lengths),
                            "seconds": round(worst_step[1], 6), "steps": 1, "phase": "memory"})
    cost = fit_step_cost(lengths, seconds)
    # The mix's padded lengths capped as the batches were: at the cap's own padded length.
    speed = epoch_speed(cost, mix, req.params.gradient_accumulation_steps, req.params.padded_length(max_len, max_len))
    per_sample = req.params.effective_batch_size / mix.samples
    return {"samples_per_second": speed.samples_per_second, "tokens_per_second": speed.tokens_per_second,
            "real_tokens_per_step": mix.real_tokens * per_sample,
            "padded_tokens_per_step": mix.padded_tokens * per_sample,
            "expected_step_time_s": speed.step_seconds, "speed_basis": mix.batching,
            "padding_share": mix.padding_share, "shape_times": shape_times,
            "fit_error_rel": fit_error(cost, lengths, seconds)}


def probe(req: ProbeRequest, cache: ModelCache, spawned_at: float | None) -> dict[str, Any]:
    """One job: the Measurement fields of ``req``, whatever happens."""
    started = _now()
    out: dict[str, Any] = {"device": req.device, "notes": list(req.notes)}
    meter = MemoryMeter(req.device)
    capped_cpu = bool(req.memory_cap_bytes) and req.device == "cpu"
    try:
        run(req, out, cache, meter, spawned_at)
    except BaseException as err:  # every failure becomes a status, never a crash of the tuner
        if isinstance(err, KeyboardInterrupt):
            raise
        from trainfit.errors import TrainfitError, Unsupported

        status = "oom" if is_oom(err, capped_cpu=capped_cpu) else "error"
        if isinstance(err, Unsupported) and err.knob is not None:
            out["unsupported"] = {err.knob: err.value}
        out["diverged"] = isinstance(err, LossNotFinite)
        if isinstance(err, TrainfitError):
            message = str(err)
        elif status == "oom":
            message = f"out of memory: {(str(err).splitlines() or [type(err).__name__])[0][:300]}"
            held, asked = memory_at_failure(str(err), req.device.startswith("cuda"))
            if held is not None and asked is not None:
                out["oom_needed_bytes"] = held + asked
            if capped_cpu:
                assert req.memory_cap_bytes is not None  # capped_cpu
                message += cpu_cap_explained(held, asked, req.memory_cap_bytes)
        else:
            message = "".join(traceback.format_exception(err)[-6:]).strip()
        out.update(status=status, message=message)
    out.update(meter.fields())
    out.update(started_at=started, finished_at=_now(), config=req.params.to_dict(),
               memory_cap_bytes=req.memory_cap_bytes,
               budget_memory_gb=req.budget_memory_gb or out.get("budget_memory_gb"),
               budget_headroom_gb=req.budget_headroom_gb, truncated_samples=req.truncated_samples)
    return out


def serve(spawned_at: float, jobs: Any) -> int:
    """Run the jobs on ``jobs`` (lines of JSON) until it closes or a probe fails."""
    from trainfit.devices import reset_peak_rss
    from trainfit.probe.request import ProbeRequest

    cache = ModelCache()
    first = True
    reusable = True
    for line in jobs:
        if not line.strip():
            continue
        job = json.loads(line)
        with open(job["request"]) as f:
            req = ProbeRequest.from_json(f.read())
        if first:
            # A CPU peak can only be measured per probe where it can be restarted.
            reusable = req.device.startswith("cuda") or reset_peak_rss()
        out = probe(req, cache, spawned_at if first else None)
        first = False
        write_atomically(Path(job["result"]), json.dumps(out))
        emit("result", path=job["result"])
        if out.get("status") != "ok" or not reusable or req.model_key is None:
            return 0
    return 0


def die_with_parent(parent_pid: int, pdeathsig: bool) -> None:
    """End this process when ``parent_pid``, the process that started it, dies (the probe worker's
    supervisor, which dies with the runner; a comparison's runner), even in a phase that prints
    nothing (it would notice only at its next write), so a killed tuner leaves no worker holding memory.

    Two ways, as each misses a case. Linux's ``PR_SET_PDEATHSIG`` kills it at once, even while a
    C call holds the GIL, but fires when the parent *thread* ends, so the runner asks for it
    (``pdeathsig``) only from its main thread. A watchdog thread, portable, polls the parent pid
    and kills this process's whole group (compile workers, a factory's helpers) with it.
    """
    if pdeathsig and sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="parent-watchdog", daemon=True).start()


def _watch_parent(parent_pid: int) -> None:
    """Kill this process (and the group it leads) once its parent is no longer ``parent_pid``
    (checked first at once: the parent may have died before this thread started)."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    if os.getpgid(0) == os.getpid():  # its own group, as the runner starts it: not a shell's
        os.killpg(0, signal.SIGKILL)
    os._exit(1)


def main(argv: list[str]) -> int:
    """``SPAWNED_AT PARENT_PID PDEATHSIG EVENTS_FD``: when the runner started this process
    (time.time()), the runner's pid, 1 when the runner's thread that started it lives as long as
    the runner, and the write end of the event channel (:func:`~trainfit.probe.events.open_channel`).

    Forks first (:func:`~trainfit.probe.supervisor.supervise`): what goes on here is the worker,
    which dies with its supervisor; the supervisor dies with the runner."""
    parent, pdeathsig = supervise(int(argv[1]), argv[2] == "1")
    die_with_parent(parent, pdeathsig)
    open_channel(int(argv[3]))
    return serve(float(argv[0]), sys.stdin)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
