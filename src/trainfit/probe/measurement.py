"""The record one probe produces: frozen, JSON-serializable, versioned, self-describing."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainfit.files import write_atomically
from trainfit.json_record import Malformed, check_bounds, check_finite, typed

SCHEMA_VERSION = 1
STATUSES = ("ok", "oom", "error", "timeout", "diverged")
EXIT_CODES = {"ok": 0, "oom": 3, "error": 4, "timeout": 5, "diverged": 6}
"""``trainfit probe`` exit status per measurement status (2 is reserved for bad usage)."""
BROKEN = ("error", "timeout", "diverged")
"""Statuses that say a config is broken for another reason than memory: a search spends no more
probes on its family."""
MEMORY_PARTS = ("model", "optimizer", "runtime", "step", "build", "allocator_cache")
"""The keys of ``Measurement.memory_parts_bytes``, in report order."""
RANKED_FIGURES = ("samples_per_second", "tokens_per_second", "expected_step_time_s", "peak_memory_bytes",
                  "first_sight_s", "first_sights_s")
"""The figures a search ranks by (its objective, a trainer cost's step time) and a plan prices a run
and a fit with: read back negative or as no number, one ranks first or spreads through every sum."""


def first_sights_of(epoch_s: float, each_s: float, shapes: int, met: int) -> float:
    """An epoch's first sights (``epoch_s`` for its ``shapes`` distinct lengths, ``each_s`` each
    after the first) for ``met`` lengths instead: 1, the first new one's alone; fewer than
    ``shapes``, a run shorter than an epoch; another count, another batching of the data. Without
    a count of shapes (a probe recorded before it was kept), ``epoch_s``."""
    return max(0.0, epoch_s + (met - shapes) * each_s) if shapes else epoch_s


def within_budget(peak_gb: float, memory_gb: float | None, headroom_gb: float) -> bool:
    """A measured peak fits a budget when it and the headroom stay inside it (no budget: it fits)."""
    return memory_gb is None or peak_gb + headroom_gb <= memory_gb


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """What one configuration did on one device.

    Throughput figures are None unless ``status == "ok"``. Memory is the process peak: on CUDA the
    caching allocator's max reserved bytes (what decides an OOM), on CPU the child's peak RSS (its
    loader's worker processes not counted: a note says so).
    """

    status: str
    """ok | oom | error | timeout | diverged (the loss was NaN or infinite at a step, or fp16's loss
    scaler skipped every timed step: the message says where; the speed of steps computing on NaNs,
    or skipping their update, is not a speed of training and is not kept)."""
    config: dict[str, Any]
    """The full resolved configuration (every knob, custom keys included)."""
    message: str | None = None
    """Why a probe did not succeed (last lines of the child's output for crashes)."""
    unsupported: dict[str, Any] = field(default_factory=dict)
    """``{knob: value}`` when the probe failed because this device or installation cannot run
    that value (e.g. ``{"attention": "flash_attention_2"}`` without flash-attn): every config
    with it fails alike, so a search skips them."""
    scaler_skipped_steps: int | None = None
    """fp16 only: the optimizer steps (memory, burn-in and timed phases) whose update the loss
    scaler skipped because their gradients overflowed; a few at the start, while it lowers its
    scale from 2**16, are normal."""
    samples_per_second: float | None = None
    """Samples per second expected over a first epoch of the data's own batches (``speed_basis``) in a
    fresh process: the step cost fitted on the timed shapes, summed over the epoch's micro-batches,
    with the first sight of its distinct padded lengths (``first_sights_s``; probe/estimate.py)."""
    tokens_per_second: float | None = None
    """Real (non-padding) tokens per second, likewise."""
    expected_step_time_s: float | None = None
    """The expected seconds of one optimizer step over the epoch's batches (the first sights shared out)."""
    first_sight_s: float | None = None
    """What a padded length costs the first time the process meets it, beyond its warm step, from
    the second new shape on: the mean over the timed shapes of their first step (in the burn-in)
    less their median timed step, 0 where that is within its own noise
    (``probe.estimate.first_sights``); None where no shape was timed both ways. A kept worker meets
    in a later probe only the shapes it has not met: where there are none, its last probe's figures
    stand."""
    first_sights_s: float | None = None
    """What a fresh process's first epoch pays for meeting its ``epoch_shapes`` padded lengths: the
    first new shape's excess (a compiled graph recompiles there), then ``first_sight_s`` each.
    Shared out in ``expected_step_time_s`` and the speeds; a run pays it once whatever its epochs
    (a plan counts it once)."""
    epoch_shapes: int | None = None
    """The distinct padded lengths of the epoch's micro-batches (of the uniform sample of the data's
    lengths the mix batches, a lower bound where the data holds more samples than it)."""
    speed_basis: str | None = None
    """Which batches the speed figures stand for: how the trainer batches the data (random order
    padded to the longest, length-grouped, fixed padding), or that there is no dataset."""
    padding_share: float | None = None
    """Share of the epoch's positions that are padding under that batching."""
    shape_times: list[dict[str, Any]] = field(default_factory=list)
    """Each timed shape: ``rows``, ``padded_length``, ``real_tokens``, median ``seconds`` per
    optimizer step, ``steps`` timed, and ``first_seconds``, its first step's (in the burn-in)."""
    fit_error_rel: float | None = None
    """The step-cost fit's largest miss at a timed shape, as a share of that shape's time."""
    data: str | None = None
    """What the timed steps trained on: ``real`` (the dataset's rows through a ``DataLoader`` with the
    config's loader knobs) or ``synthetic`` (inputs made on the device, nothing loaded)."""
    data_wait_s: float | None = None
    """The mean seconds a timed optimizer step waited for its micro-batches (0 for synthetic
    inputs): part of ``expected_step_time_s`` and so of the speeds."""
    input_bound_share: float | None = None
    """The share of the timed steps' wall time spent waiting for data: from 0.1 the loader, not the
    model, limits samples/s (a note says what to turn)."""
    loader_start_s: float | None = None
    """The first step's wait for data, with the loader's workers starting: paid again each epoch
    unless ``persistent_workers``."""
    step_time_median_s: float | None = None
    step_time_mean_s: float | None = None
    step_time_std_s: float | None = None
    step_time_ci95_rel: float | None = None
    """95% confidence half-width of the mean step time, as a share of the mean."""
    step_time_ci95_basis: str | None = None
    """What ``step_time_ci95_rel`` comes from: ``cycles`` (two or more whole cycles of the timed
    shapes), ``repeats`` (each shape's repeats), ``fit`` (no shape timed twice: the cost fit's
    residuals, which ``fit_error_rel`` then holds too) or ``steps`` (the spread of all steps, their
    shapes' own differences with it: an upper bound)."""
    steps_measured: int = 0
    step_times_s: list[float] = field(default_factory=list)
    """Every timed step, in order (cycles over the timed shapes)."""
    stable: bool = False
    """True when the timed phase stopped because ``step_time_ci95_rel`` met the target."""
    slower_than: dict[str, Any] | None = None
    """Where the timed phase stopped before that because this config was clearly slower than the
    search's bar, the best config measured with the same learning values: that bar
    (:class:`~trainfit.probe.request.Bar`'s fields: trial, objective, value, ci95_rel). Its speed is
    then known within its wider interval, enough to rank it below the bar."""
    samples_per_step: float | None = None
    """Samples an optimizer step trains: the effective batch, or under ``packing`` (a row holding
    several) the epoch's mean, a fraction kept whole: a plan counts the run's steps by it."""
    real_tokens_per_step: float | None = None
    """The epoch's mean real tokens per optimizer step (``samples_per_step`` samples)."""
    padded_tokens_per_step: float | None = None
    """The epoch's mean positions per optimizer step, padding included."""
    worst_case_lengths: list[int] = field(default_factory=list)
    """Sample lengths of the worst-case batch the memory phase ran."""
    truncated_samples: int | None = None
    """Samples in the dataset longer than max_length (truncated in training)."""
    peak_memory_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    """CUDA only: max bytes held by tensors."""
    memory_parts_bytes: dict[str, int] = field(default_factory=dict)
    """Where the peak went, measured: ``model`` (weights, buffers, adapters: tensor bytes),
    ``optimizer`` (its state tensors), ``runtime`` (the rest held between steps: on CPU the
    process itself, interpreter and libraries; on CUDA stray tensors, normally ~0), ``step`` (what
    the worst-case step adds on top at its peak: activations, gradients, temporaries), ``build``
    (CPU: how far building the model peaked above the steps), ``allocator_cache`` (CUDA: reserved
    but unallocated at the peak). They sum to ``peak_memory_bytes``. Empty when the probe failed
    before its steps began. CUDA's own context (~0.5 GiB) is outside the allocator: headroom."""
    full_logits_bytes: int | None = None
    """Hugging Face models with the model's own loss: the fp32 ``(batch, length, vocab)`` logits
    of the worst-case micro-batch, part of ``step`` (their gradient takes as much again); None
    where the loss never builds them (TRL's fused head) or the workload cannot tell."""
    alloc_retries: int | None = None
    """CUDA only: times the allocator freed its cache and retried (a sign of pressure)."""
    oom_needed_bytes: int | None = None
    """OOM only: a lower bound of what the config needs, what was allocated when an allocation
    failed plus what that allocation asked for (CUDA: tensors; CPU: the process's allocated
    address space, which the CPU cap counts). None where the error does not give the size."""
    memory_cap_bytes: int | None = None
    """The hard cap the child ran under (None = no cap)."""
    world_size: int = 1
    """The processes the probe ran (``nproc_per_node``, one machine's); the speeds are those of all
    ``nproc_per_node x nnodes`` processes the config trains on."""
    rank_peak_memory_bytes: list[int] = field(default_factory=list)
    """Several processes: each rank's peak (``peak_memory_bytes`` is the largest, which decides
    whether the config fits; ``memory_parts_bytes`` are that rank's)."""
    communication_share: float | None = None
    """DDP: the share of a step's time its gradients' all-reduce adds, the slowest rank's (1 - the same
    steps without syncing / with); None in one process and under FSDP, whose gathers cannot be left out."""
    model_flops_per_step: float | None = None
    mfu: float | None = None
    """Model FLOPs utilisation (PaLM formula, real tokens); None when the device's peak is unknown."""
    hfu: float | None = None
    """Hardware FLOPs utilisation: like MFU plus recomputed activations."""
    peak_flops_source: str | None = None
    device: str = "cpu"
    device_name: str = ""
    cpu_threads: int | None = None
    """torch's intra-op CPU threads in the probe: on CPU, a training run needs as many to go at the
    measured speed (``accelerate launch`` gives each process one unless told otherwise)."""
    versions: dict[str, str | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    """Fallbacks and facts the reader should know (e.g. 'tf32 has no effect on CPU')."""
    phases_s: dict[str, float] = field(default_factory=dict)
    """Seconds spent in start, build, memory, burn_in, timed (child side)."""
    started_at: str = ""
    finished_at: str = ""
    wall_time_s: float | None = None
    """From handing the probe to a worker (spawning one, if needed) to reading its result."""
    model_reused: bool = False
    """The worker ran this probe on the model it built for the previous one (same config but for
    the batch shape), so start and build took no time."""
    budget_memory_gb: float | None = None
    budget_headroom_gb: float | None = None
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    @property
    def peak_memory_gb(self) -> float | None:
        return None if self.peak_memory_bytes is None else self.peak_memory_bytes / 1024**3

    @property
    def oom_needed_gb(self) -> float | None:
        return None if self.oom_needed_bytes is None else self.oom_needed_bytes / 1024**3

    @property
    def needed_bytes(self) -> int:
        """The least this config needs as measured: its peak, or for an OOM that said what it asked
        for, what it held then plus the ask when that is more (the peak is where it failed)."""
        return max(self.peak_memory_bytes or 0, self.oom_needed_bytes or 0)

    def run_seconds(self, samples: float, epochs: float, speed: float | None = None) -> float:
        """Seconds to train ``samples``, ``epochs`` of the data, at ``speed`` (default: the probe's,
        a first epoch's): the speed shares out one epoch's first sights of its lengths, which a
        later epoch does not meet again, so a run counts them once."""
        speed = speed or self.samples_per_second
        if not speed:
            return math.inf
        return max(0.0, samples / speed - (self.first_sights_s or 0.0) * (epochs - 1))

    @property
    def fits(self) -> bool:
        """Ran, and peak + headroom stays inside the budget (when one was set)."""
        if self.status != "ok":
            return False
        if self.peak_memory_gb is None:
            return True
        return within_budget(self.peak_memory_gb, self.budget_memory_gb, self.budget_headroom_gb or 0.0)

    @property
    def headline(self) -> str:
        """The line of the message that says what went wrong: for a traceback, the exception (its
        last unindented line), not the frame it starts with."""
        lines = [line for line in (self.message or "").splitlines() if line.strip()]
        if any(line.startswith("Traceback") or line.lstrip().startswith('File "') for line in lines):
            raised = [line for line in lines if not line.startswith((" ", "\t", "Traceback"))]
            if raised:
                return raised[-1]
        return lines[0] if lines else ""

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    @property
    def cut_short(self) -> str | None:
        """Where the timing stopped at the search's bar (:attr:`slower_than`): that, in words."""
        bar = self.slower_than
        if not bar:
            return None
        units = "tokens/s" if bar.get("objective") == "tokens_per_second" else "samples/s"
        value = bar.get("value")
        figure = f"'s {value:.4g} {units}" if isinstance(value, (int, float)) else ""
        return f"cut short: clearly slower than trial {bar.get('trial', '?')}{figure}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"measurement schema {data.get('schema_version')} != {SCHEMA_VERSION}")
        names = {f.name for f in dataclasses.fields(cls)}
        if data.get("diverged") and data.get("status") == "error":  # recorded before the status existed
            data = {**data, "status": "diverged"}
        return cls(**{k: v for k, v in data.items() if k in names})

    def write_json(self, path: str | Path) -> None:
        write_atomically(Path(path), json.dumps(self.to_dict(), indent=2) + "\n")


def recorded_budget_gb(measurements: Iterable[Measurement]) -> float | None:
    """The memory budget the probes ran against: the spec's ``budget.memory_gb``, or the device's
    own memory, which a probe records when the spec sets none (None: no probe got that far)."""
    return next((m.budget_memory_gb for m in measurements if m.budget_memory_gb), None)


@functools.cache
def _hints() -> dict[str, Any]:
    return typing.get_type_hints(Measurement)


def read_measurement(data: Any, key: str = "measurement") -> Measurement:
    """A measurement as a record stored it (a study journal's trial, at ``key``), read back, or
    :class:`Malformed` naming the field: not an object, a field of the wrong type or null where a
    value belongs, a required one missing, another schema, or a :data:`RANKED_FIGURES` figure
    negative or no number. A journal edited by hand or by a tool can hold valid JSON of any type;
    tune and plan read it here alike, so they leave out the same trials."""
    data = typed(dict[str, Any | None], data, key, nullable=False)  # a field's null: checked below
    hints = _hints()
    for name, value in data.items():
        if name not in hints:
            continue
        if value is None and type(None) not in typing.get_args(hints[name]):  # a null within it may be a value
            raise Malformed(f"{key}.{name}", "null where a value belongs")
        typed(hints[name], value, f"{key}.{name}")
    for name in RANKED_FIGURES:
        check_finite({f"{key}.{name}": data.get(name)})
        check_bounds(f"{key}.{name}", data.get(name), {"at_least": 0})
    try:
        return Measurement.from_dict(data)
    except TypeError as err:  # a required field missing
        raise Malformed(key, str(err).partition("() ")[2] or str(err)) from None
    except ValueError as err:  # another schema, an unknown status
        raise Malformed(key, str(err)) from None
