"""Numbers, configs and memory as every report says them (terminal, summary, report.html): one
wording, used from the CLI and the report alike."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_num(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "n/a"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def spread(rel: float | None) -> str:
    """A figure's 95% interval, relative, as every figure with one is followed by it (`` ±12%``); empty
    where there is none or it rounds to nothing."""
    return f" ±{rel:.0%}" if rel is not None and rel >= 0.005 else ""


def values_line(values: Mapping[str, Any]) -> str:
    """Searched values as ``knob=value`` pairs, every one shown (``lora_r=None`` is a choice, said as
    what it is: ``lora_r=None (full fine-tuning)``)."""
    return " ".join(f"{k}={v}" + (" (full fine-tuning)" if k == "lora_r" and v is None else "")
                    for k, v in values.items())


def unit(objective: str) -> str:
    """'samples_per_second' -> 'samples/s'."""
    return objective.replace("_per_second", "/s")


def config_line(config: dict[str, Any]) -> str:
    lora = config.get("lora_r") is not None
    return " ".join(f"{k}={v}" for k, v in config.items() if v is not None and (lora or not k.startswith("lora_")))


PART_NAMES = {"model": "model", "optimizer": "optimizer state", "runtime": "runtime",
              "step": "worst-case step", "build": "build", "allocator_cache": "allocator cache"}
"""How the report names each part of ``Measurement.memory_parts_bytes``."""


def parts_line(parts: Mapping[str, float], unit: float = 1) -> str:
    """``model 1.30 MiB, optimizer state 2.66 MiB, ...`` (see ``Measurement.memory_parts_bytes``);
    ``unit``: bytes per unit of ``parts`` (``1024**3`` for summary.json's ``memory_parts_gb``)."""
    return ", ".join(f"{PART_NAMES.get(k, k)} {fmt_bytes(v * unit)}" for k, v in parts.items())


OOM_NEED = "held when an allocation failed, plus what it asked for"
"""What ``Measurement.oom_needed_bytes`` counts, as the reports say it."""


def fmt_need(gb: float) -> str:
    """An OOM's lower bound of need (``Measurement.oom_needed_gb``), as every report says it."""
    return f"needs > {gb:.2f} GiB"


def table(rows: Sequence[Sequence[Any]], header: Sequence[str] | None = None) -> str:
    """Left-aligned columns; the first row may be a header."""
    cells = [[str(c) for c in r] for r in ([header] if header else []) + list(rows)]
    if not cells:
        return ""
    widths = [max(len(r[i]) for r in cells if i < len(r)) for i in range(max(map(len, cells)))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    if header:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_duration(seconds: float | None) -> str:
    """``83`` -> ``1m23s``; None -> ``?``."""
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "?"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"
