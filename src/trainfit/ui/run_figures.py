"""Each kind of run summarised as itself on its run page (issue 50 item 5), read through its own
record (a damaged one is said, never a traceback):

- a training: its status, steps, elapsed against the plan's ETA, its peak against the probe's, and
  its loss curve (from ``train_log.jsonl``);
- a probe: its speed with its interval, its peak, and the memory parts as bars;
- an ablation: its table, one row a lever;
- a plan: the ETA with its interval, the window, the chosen config and the options;
- a comparison: its best, and each config's status, final loss and speed;
- an analysis: the samples, their lengths, the max_length it recommends and the padding each way wastes.

A chart is SVG made here from numbers alone (labels escaped): no script, nothing fetched.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainfit.ablate import Ablation
from trainfit.compare import Comparison
from trainfit.compare.curves import final_loss
from trainfit.errors import TrainfitError
from trainfit.format import fmt_bytes, format_duration, spread, values_line
from trainfit.json_record import Malformed
from trainfit.plan import Plan
from trainfit.probe.measurement import MEMORY_PARTS, Measurement
from trainfit.train.records import TrainResult, log_events
from trainfit.ui.paths import read_regular

Rows = list[tuple[str, str]]


def kind_figures(folder: Path, kind: str) -> tuple[Rows, str]:
    """The figures of a run of ``kind`` that is not a tune (its rows, and a chart's SVG or '')."""
    if kind not in _READERS:
        return [], ""
    marker, read = _READERS[kind]
    try:
        return read(json.loads(read_regular(folder / marker)), folder)
    except (OSError, ValueError, TypeError, KeyError, Malformed, TrainfitError) as err:
        return [("error", f"cannot read {marker}: {err}")], ""


def _train(raw: dict[str, Any], folder: Path) -> tuple[Rows, str]:
    r = TrainResult.from_json(raw)
    rows = [("status", r.status + (f" ({r.stopped_by})" if r.stopped_by else "")),
            ("steps", f"{r.step if r.step is not None else '?'}" + (f" of {r.max_steps}" if r.max_steps else "")),
            ("elapsed", format_duration(r.elapsed_s) + (f" against the plan's ~{format_duration(r.planned_s)} "
                                                        f"({r.elapsed_s / r.planned_s:.0%} of it)" if r.planned_s else ""))]
    if r.peak_memory_bytes:
        rows.append(("peak memory", fmt_bytes(r.peak_memory_bytes) + (
            f" against the probe's {fmt_bytes(r.probe_peak_memory_bytes)}" if r.probe_peak_memory_bytes else "")))
    if r.resume:
        rows.append(("continue with", r.resume))
    losses = _losses(folder / "train_log.jsonl")
    if losses:
        (first_step, first), (last_step, last) = losses[0], losses[-1]
        rows.append(("loss", f"{first:.4g} at step {first_step:g} to {last:.4g} at step {last_step:g}"))
    return rows, _curve(losses, "loss against optimizer steps")


def _losses(path: Path) -> list[tuple[float, float]]:
    """The logged (step, loss) of a training's log, in order."""
    try:
        lines = read_regular(path).splitlines()
    except OSError:
        return []
    return [(float(e["step"]), float(e["loss"])) for e in log_events(lines)
            if e.get("event") == "log" and isinstance(e.get("step"), int) and isinstance(e.get("loss"), (int, float))
            and e["loss"] == e["loss"]]  # a NaN loss drawn nowhere


def _probe(raw: dict[str, Any], folder: Path) -> tuple[Rows, str]:
    m = Measurement.from_dict(raw)
    rows = [("status", m.status), ("config", values_line({k: v for k, v in m.config.items()
                                                          if k in ("batch_size", "gradient_accumulation_steps",
                                                                   "max_length", "lora_r", "gradient_checkpointing")})),
            ("samples/s", f"{m.samples_per_second:,.4g}{spread(m.step_time_ci95_rel)}"
             + (" (its step time's 95% interval)" if spread(m.step_time_ci95_rel) else "")
             if m.samples_per_second else "—"),
            ("tokens/s", f"{m.tokens_per_second:,.4g}" if m.tokens_per_second else "—"),
            ("peak memory", fmt_bytes(m.peak_memory_bytes) if m.peak_memory_bytes else "—")]
    parts = {k: m.memory_parts_bytes[k] / 2**30 for k in MEMORY_PARTS if m.memory_parts_bytes.get(k)}
    return rows, _bars(parts, "memory parts, GiB")


def _ablation(raw: dict[str, Any], folder: Path) -> tuple[Rows, str]:
    a = Ablation.from_json(raw)
    rows = [("baseline", values_line(a.baseline)), ("device", a.device)]
    for row in a.rows:
        if row.speedup is None:
            rows.append((row.name, f"{row.status}" + (f": {row.reason}" if row.reason else "")))
            continue
        interval = (f" ({row.speedup_low:.2f}x-{row.speedup_high:.2f}x)" if row.speedup_low and row.speedup_high
                    else "")
        memory = f", memory {row.memory_change:+.0%}" if row.memory_change is not None else ""
        rows.append((row.name, f"{row.speedup:.2f}x{interval}{memory}"
                     + (" (changes what is learned)" if row.changes_learning else "")))
    return rows, ""


def _plan(raw: dict[str, Any], folder: Path) -> tuple[Rows, str]:
    p = Plan.from_json(raw)
    rows = [("ETA", f"~{format_duration(p.eta.total_s)} ({format_duration(p.eta.low_s)} - "
                    f"{format_duration(p.eta.high_s)})"),
            ("window", f"{p.max_hours:g} h less {p.margin_minutes:g} min: " + ("fits" if p.fits else "does NOT fit")),
            ("chosen", f"trial {p.trial}: {values_line(p.searched)}" if p.trial is not None else "the spec's config"),
            ("priority", f"{p.priority}: {p.rule}"), ("epochs", f"{p.epochs:g}")]
    rows += [(f"option {i}", f"{o.change} (~{format_duration(o.eta.total_s)}; {o.cost})")
             for i, o in enumerate(p.options, 1)]
    return rows, ""


def _compare(raw: dict[str, Any], folder: Path) -> tuple[Rows, str]:
    c = Comparison.from_json(raw)
    rows = [("best", c.ranking[0] if c.ranking else "none finished"), ("steps", f"{c.steps} each"),
            ("device", c.device)]
    for name in c.configs:
        run = c.runs.get(name)
        loss = final_loss(run) if run else None
        rows.append((name, "not run" if run is None else f"{run.status}" + (f", final loss {loss:.4g}" if loss else "")
                     + (f", {run.samples_per_second:.3g} samples/s" if run.samples_per_second else "")))
    return rows, ""


def _lengths(raw: dict[str, Any], folder: Path) -> tuple[Rows, str]:
    p, waste = dict(raw.get("percentiles") or {}), dict(raw.get("waste") or {})
    spread_of = ", ".join(f"{k} {float(v):,.0f}" for k, v in [("min", raw["min"]), *(
        (k, p[k]) for k in ("p50", "p90", "p99") if k in p), ("max", raw["max"])])
    rows = [("samples", f"{int(raw['samples']):,}" + (f" ({raw['bad_rows']} bad rows)" if raw.get("bad_rows") else "")),
            ("lengths", spread_of), ("source", str(raw.get("description") or raw.get("source")))]
    if raw.get("recommended_max_length"):
        rows.append(("max_length", f"{raw['recommended_max_length']} ({raw.get('recommended_rule')}; "
                                   f"{float(raw.get('truncated_share') or 0):.2%} of samples cut)"))
    rows += [(f"padding ({k.replace('_', ' ')})", f"{float(v):.0%} of positions") for k, v in waste.items()]
    return rows, ""


_READERS: dict[str, tuple[str, Callable[[dict[str, Any], Path], tuple[Rows, str]]]] = {
    "train": ("train_result.json", _train), "probe": ("measurement.json", _probe),
    "ablate": ("ablation.json", _ablation), "plan": ("plan.json", _plan),
    "compare": ("compare.json", _compare), "analyze": ("lengths.json", _lengths)}

_W, _H, _PAD = 520, 200, 40


def _curve(points: list[tuple[float, float]], title: str) -> str:
    """A line through ``points`` (x, y), its axes labelled at their ends."""
    if len(points) < 2:
        return ""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)

    def at(x: float, y: float) -> str:
        return (f"{_PAD + (x - x0) / ((x1 - x0) or 1) * (_W - 2 * _PAD):.1f},"
                f"{_H - _PAD - (y - y0) / ((y1 - y0) or 1) * (_H - 2 * _PAD):.1f}")

    line = " ".join(at(x, y) for x, y in points)
    return (f'<figure class="chart"><figcaption>{html.escape(title)}</figcaption><svg width="{_W}" height="{_H}" '
            f'role="img"><polyline points="{line}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>'
            f'<text x="{_PAD - 4}" y="{_PAD + 4}" font-size="11" text-anchor="end">{y1:.4g}</text>'
            f'<text x="{_PAD - 4}" y="{_H - _PAD + 4}" font-size="11" text-anchor="end">{y0:.4g}</text>'
            f'<text x="{_PAD}" y="{_H - 12}" font-size="11">{x0:g}</text>'
            f'<text x="{_W - _PAD}" y="{_H - 12}" font-size="11" text-anchor="end">{x1:g}</text></svg></figure>')


def _bars(parts: dict[str, float], title: str) -> str:
    """A horizontal bar per part, its value beside it."""
    if not parts:
        return ""
    top, height = max(parts.values()) or 1.0, 22
    bars = "".join(
        f'<text x="0" y="{i * height + 15}" font-size="12">{html.escape(name)}</text>'
        f'<rect x="120" y="{i * height + 4}" width="{value / top * (_W - 200):.1f}" height="14" fill="#1f77b4"/>'
        f'<text x="{125 + value / top * (_W - 200):.1f}" y="{i * height + 15}" font-size="12">{value:.3g}</text>'
        for i, (name, value) in enumerate(parts.items()))
    return (f'<figure class="chart"><figcaption>{html.escape(title)}</figcaption>'
            f'<svg width="{_W}" height="{len(parts) * height + 6}" role="img">{bars}</svg></figure>')
