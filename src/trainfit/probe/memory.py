"""The probe's memory: the budget's cap on the process or the GPU, an out-of-memory error told from
any other (and how much it asked for), and :class:`MemoryMeter`, which splits a peak into its parts.

Imports are light (no torch at the top), as the worker's are: the worker forks before any library
has started a thread."""

from __future__ import annotations

import gc
import re
import resource
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trainfit.devices import committed_bytes, peak_rss_bytes, reset_peak_rss, rss_bytes
from trainfit.errors import TrainfitError

if TYPE_CHECKING:
    from trainfit.probe.phases import Built


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


def cap_cpu_memory(cap: int, out: dict[str, Any]) -> None:
    """Cap this process's data at ``cap`` bytes (``RLIMIT_DATA``). The cap covers the whole process,
    interpreter and libraries included, so an allocation beyond it fails for real
    ("DefaultCPUAllocator: can't allocate memory"). Set once torch is imported: a cap below what
    that takes made the import fail with a traceback; now the OOM names what starting takes."""
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


def _tensor_bytes(values: Sequence[Any], device_type: str) -> int:
    """Bytes held on ``device_type`` by the tensors among ``values`` (each storage once: tied weights
    count once; FSDP's CPU offload keeps a GPU run's shards on the host, which its peak does not hold)."""
    import torch

    seen: set[int] = set()
    total = 0
    for v in values:
        v = v.to_local() if hasattr(v, "to_local") else v  # an FSDP2 DTensor: this rank's shard
        if isinstance(v, torch.Tensor) and v.device.type == device_type:
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
            device = "cuda" if self.cuda else "cpu"
            weights = _tensor_bytes([*model.parameters(), *model.buffers()], device)
            state = _tensor_bytes([v for per_param in optimizer.state.values() for v in per_param.values()], device)
        except Exception:  # a model left unusable by its failure: the peak is still reported
            return {}
        return {"model": weights, "optimizer": state, "runtime": max(0, held - weights - state),
                "step": max(0, steps_peak - held)}

