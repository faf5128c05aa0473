"""Device facts: names, peak FLOP/s with their sources, and library versions.

The peak table holds dense (no 2:4 sparsity) tensor-core figures from vendor datasheets as
quoted by torchtitan's ``get_peak_flops`` and NVIDIA's spec sheets. A device that is not in the
table has no peak, so MFU is reported as ``None`` rather than a wrong number.
"""

from __future__ import annotations

import contextlib
import platform
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from trainfit.errors import Unsupported


@dataclass(frozen=True)
class PeakFlops:
    """Dense peak FLOP/s of one device per math mode, and where the figures come from."""

    bf16: float
    tf32: float
    fp32: float
    source: str


GA102 = "NVIDIA Ampere GA102 GPU architecture whitepaper, appendix A (dense; FP16/BF16 with FP32 accumulate)"
ADA = "NVIDIA Ada GPU architecture whitepaper, appendix A (dense; FP16/BF16 with FP32 accumulate)"
TURING = "NVIDIA Turing GPU architecture whitepaper, appendix A (FP16 tensor with FP32 accumulate; no BF16, no TF32)"

# Matched in order against torch.cuda.get_device_name(), each a regular expression; the first that
# matches wins. A consumer card's name is matched to its end, so a Ti, SUPER or Laptop variant (other
# figures) is no match rather than a wrong peak.
PEAK_FLOPS: tuple[tuple[str, PeakFlops], ...] = (
    ("H200", PeakFlops(989e12, 494.5e12, 66.9e12,
                       "NVIDIA H200 datasheet (dense = half the sparsity figure 1,979 TFLOPS)")),
    ("H100 NVL", PeakFlops(835e12, 417.5e12, 60e12, "torchtitan get_peak_flops; NVIDIA H100 NVL datasheet")),
    ("H100 PCIe", PeakFlops(756e12, 378e12, 51e12, "torchtitan get_peak_flops; NVIDIA H100 PCIe datasheet")),
    ("H100", PeakFlops(989e12, 494.5e12, 66.9e12, "torchtitan get_peak_flops (H100 SXM); NVIDIA H100 datasheet")),
    ("A100", PeakFlops(312e12, 156e12, 19.5e12, "torchtitan get_peak_flops; NVIDIA A100 datasheet")),
    ("L40S", PeakFlops(362.05e12, 183e12, 91.6e12, "NVIDIA L40S datasheet (dense = half the sparsity figures)")),
    (r"\bL4$", PeakFlops(121e12, 60e12, 30.3e12, "NVIDIA L4 datasheet (dense = half the sparsity figures)")),
    (r"\bA10$", PeakFlops(125e12, 62.5e12, 31.2e12, "NVIDIA A10 datasheet (dense = half the sparsity figures)")),
    (r"RTX A6000$", PeakFlops(154.8e12, 77.4e12, 38.7e12, GA102 + ": RTX A6000 (a workstation card: FP32 "
                                                           "accumulate at the full rate)")),
    (r"RTX 4090$", PeakFlops(165.2e12, 82.6e12, 82.6e12, ADA + ": GeForce RTX 4090")),
    (r"RTX 3090 Ti$", PeakFlops(80e12, 40e12, 40e12, "GeForce RTX 3090 Ti (after the GA102 whitepaper: its 84 SMs "
                                                      "at 1.86 GHz, counted as the whitepaper counts the 3090)")),
    (r"RTX 3090$", PeakFlops(71e12, 35.6e12, 35.6e12, GA102 + ": GeForce RTX 3090")),
    (r"RTX 3080$", PeakFlops(59.5e12, 29.8e12, 29.8e12, GA102 + ": GeForce RTX 3080 (10 GB; the 12 GB card, same "
                                                        "name, has 70 SMs: about 3% more)")),
    (r"RTX 2080 Ti$", PeakFlops(53.8e12, 13.4e12, 13.4e12, TURING + ": GeForce RTX 2080 Ti")),
    (r"V100S", PeakFlops(130e12, 16.4e12, 16.4e12, "NVIDIA V100S datasheet, PCIe (tensor FP16; no BF16, no TF32)")),
    (r"V100-PCIE", PeakFlops(112e12, 14e12, 14e12, "NVIDIA V100 datasheet, PCIe (tensor FP16; no BF16, no TF32)")),
    (r"V100", PeakFlops(125e12, 15.7e12, 15.7e12, "NVIDIA V100 datasheet, SXM2 (tensor FP16; no BF16, no TF32)")),
    (r"\bT4$", PeakFlops(65e12, 8.1e12, 8.1e12, "NVIDIA T4 datasheet (mixed-precision FP16; no BF16, no TF32)")),
)
"""A card without BF16 (V100, T4, RTX 2080 Ti) gives its FP16 figure under ``bf16`` (a bf16 config is
refused there anyway), and without TF32 its FP32 figure under ``tf32``."""


def peak_flops(device_name: str, precision: str, tf32: bool) -> tuple[float, str] | None:
    """(peak FLOP/s, source) for the math mode a config uses, or None for an unknown device."""
    for pattern, peak in PEAK_FLOPS:
        if re.search(pattern, device_name.strip()):
            if precision in ("bf16", "fp16"):
                return peak.bf16, peak.source
            return (peak.tf32 if tf32 else peak.fp32), peak.source
    return None


def known_devices() -> list[str]:
    """The devices with a peak on record, by the names a user gives them (``H100``, ``RTX 4090``):
    each matches its own entry of :data:`PEAK_FLOPS` first."""
    return [re.sub(r"\\b|\$", "", pattern) for pattern, _ in PEAK_FLOPS]


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _status_bytes(field: str) -> int | None:
    """A memory line of Linux's ``/proc/self/status`` (e.g. ``VmHWM``), in bytes; None elsewhere."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def peak_rss_bytes() -> int:
    """This process's peak resident memory.

    Linux's ``VmHWM`` belongs to the process's own address space. ``ru_maxrss`` is not used
    where VmHWM exists: Linux carries it across fork+exec, so a child started by a big parent
    would report the parent's size.
    """
    peak = _status_bytes("VmHWM")
    if peak is not None:
        return peak
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def trim_heap() -> bool:
    """Return the heap memory freed so far to the OS (glibc's ``malloc_trim``); False where unavailable."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


def rss_bytes() -> int | None:
    """This process's resident memory now, after freed heap is returned (None where unknown)."""
    trim_heap()
    return _status_bytes("VmRSS")


def committed_bytes() -> int | None:
    """This process's private writable address space (Linux's ``VmData``, what ``RLIMIT_DATA``
    caps): allocations count whole, touched or not, as a GPU allocator counts them (None elsewhere)."""
    return _status_bytes("VmData")


def process_peak_memory() -> dict[str, int]:
    """This process's peak memory so far, in the fields a probe counts its own with: where CUDA is in
    use, the caching allocator's peaks on the current device (``peak_reserved_bytes``, what decides an
    out of memory and what a probe's ``peak_memory_bytes`` is there, and ``peak_allocated_bytes``);
    else the peak RSS (``peak_rss_bytes``, a CPU probe's ``peak_memory_bytes``)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return {"peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
                "peak_reserved_bytes": int(torch.cuda.max_memory_reserved())}
    return {"peak_rss_bytes": peak_rss_bytes()}


def reset_peak_rss() -> bool:
    """Return freed heap to the OS, then restart this process's peak RSS from the current RSS.

    ``malloc_trim`` first, so memory a previous, larger batch freed does not count again; then
    Linux's ``clear_refs`` (value 5 resets VmHWM). False where either is unavailable, and the
    peak keeps counting from process start.
    """
    if not trim_heap():
        return False
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def versions() -> dict[str, str | None]:
    """Versions of everything that changes a measurement."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {"python": sys.version.split()[0], "platform": platform.platform()}
    for pkg in ("trainfit", "torch", "transformers", "peft", "trl", "optuna", "flash-attn", "bitsandbytes"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    try:
        import torch

        out["cuda"] = torch.version.cuda
    except ImportError:
        out["cuda"] = None
    return out


def describe_environment() -> dict[str, Any]:
    """What ``trainfit env`` prints: devices, memory, versions, optional kernels."""
    import psutil
    import torch

    info: dict[str, Any] = {
        "cpu": cpu_name(),
        "cpu_cores": psutil.cpu_count(logical=True),
        "cpu_bf16_native": bool({"avx512_bf16", "amx_bf16"} & cpu_flags()),
        "ram_gb": round(psutil.virtual_memory().total / 1024**3, 1),
        "cuda_available": torch.cuda.is_available(),
        "gpus": [],
        "versions": versions(),
    }
    if torch.cuda.is_available():
        gpus = []
        for i in range(torch.cuda.device_count()):
            prop = torch.cuda.get_device_properties(i)
            peak = peak_flops(prop.name, "bf16", False)
            gpus.append({
                "index": i, "name": prop.name, "memory_gb": round(prop.total_memory / 1024**3, 1),
                "capability": f"{prop.major}.{prop.minor}",
                "bf16_supported": torch.cuda.is_bf16_supported(),
                "peak_bf16_tflops": peak[0] / 1e12 if peak else None,
            })
        info["gpus"] = gpus
    return info


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op CPU threads set to ``threads`` (the probe's, say) inside the block only;
    None: left as they are."""
    if threads is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def resolve_device_name(name: str) -> str:
    """``auto`` -> ``cuda:0`` or ``cpu`` (decided in the parent so the child's memory cap fits the device)."""
    import torch

    if name == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise Unsupported(f"probe.device is {name} but no CUDA GPU is visible", "use probe.device: cpu or auto")
    return "cuda:0" if name == "cuda" else name


def device_label(device: str) -> str:
    """The name a measurement records for ``device`` (a resolved name: ``cuda:0``, ``cpu``): the
    GPU's model, or the CPU's."""
    import torch

    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else cpu_name()


def synchronize(device: Any) -> None:
    """Wait for a CUDA device's queued work (a timing's end); nothing on a CPU."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


WORKER_RAM_GIB = 2.0
"""Host memory set aside per data-loader worker when picking candidates: a worker is a copy of the
training process (forked) that decodes and collates batches of its own."""


def loader_worker_candidates(cores: int | None = None, memory_gib: float | None = None) -> list[int]:
    """The ``num_workers`` a search tries for ``search: {num_workers: auto}``: 0 (loading in the
    training process), then powers of two up to this machine's usable cores less the one the
    training process takes and its memory at :data:`WORKER_RAM_GIB` a worker, and that cap itself
    (at most 16). The machine's total memory, not what is free now: the choices are part of the
    study's identity, and a ``--resume`` must find the same study whatever else runs meanwhile."""
    import os

    import psutil

    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    memory_gib = memory_gib if memory_gib is not None else psutil.virtual_memory().total / 2**30
    cap = max(1, min(cores - 1, int(memory_gib // WORKER_RAM_GIB), 16))
    return [0, *sorted({2**k for k in range(5) if 2**k <= cap} | {cap})]
