"""``report.html``: a tuning run on one self-contained page (inline SVG, no JavaScript, no
dependencies), rewritten with ``summary.json`` after every trial.

Two charts share the x axis, the batch size (log scale), with one line per *family* (the other
searched knobs): the objective, and the peak memory against the budget. Every probe is a point
(hover for its config); an OOM is a cross, an over-budget config a hollow point. Below them, the
best config with its command, and every trial.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trainfit.format import fmt_need, fmt_num, format_duration, spread, values_line
from trainfit.page_slots import PLAN_SLOT
from trainfit.search.loop import common_failure
from trainfit.search.ranking import noise_warning
from trainfit.search.trials import Trial
from trainfit.summary import Summary

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22")
_W, _H, _PAD_L, _PAD_R, _PAD_Y = 720, 280, 60, 20, 30
_OFF_SCALE = 4.0
"""The device's own memory (no budget set) is drawn only within this factor of the largest measured need."""


def _family(values: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in values.items() if k != "batch_size") or "all configs"


def _batch(t: Trial) -> int:
    return int(t.measurement.config.get("batch_size") or 1)


def _chart(title: str, trials: Sequence[Trial], color: Mapping[str, str], y_of: Callable[[Trial], float | None], *,
           lines: Sequence[tuple[float, str]] = (), oom_y: Callable[[Trial], float | None] | None = None,
           rel: Callable[[Trial], float | None] = lambda t: None) -> str:
    """One SVG chart: ``y_of(trial)`` (None: not drawn) against the batch size, a polyline per
    family; ``lines``: horizontal reference lines (value, label); ``oom_y(trial)``: where an OOM's
    cross goes (None: on the x axis); ``rel(trial)``: the figure's 95% interval, relative to its step
    time (a speed's bar runs from v/(1+r) to v/(1-r)), drawn as an error bar."""
    batches = sorted({_batch(t) for t in trials}) or [1]
    ys = [v for t in trials if (v := y_of(t)) is not None] + [v for v, _ in lines]
    ys += [v for t in trials if t.measurement.status == "oom" and oom_y and (v := oom_y(t)) is not None]
    top = max(ys) * 1.1 if ys and max(ys) > 0 else 1.0
    lo, hi = math.log2(batches[0]), math.log2(batches[-1])

    def x(b: int) -> float:
        span = hi - lo
        return _PAD_L + (0.5 if span == 0 else (math.log2(b) - lo) / span) * (_W - _PAD_L - _PAD_R)

    def y(v: float) -> float:
        return _H - _PAD_Y - v / top * (_H - 2 * _PAD_Y)

    out = [f'<line x1="{_PAD_L}" x2="{_W - _PAD_R}" y1="{y(0):.1f}" y2="{y(0):.1f}" stroke="#888"/>',
           f'<line x1="{_PAD_L}" x2="{_PAD_L}" y1="{_PAD_Y}" y2="{y(0):.1f}" stroke="#888"/>']
    for b in batches:
        out.append(f'<text x="{x(b):.1f}" y="{_H - 8}" font-size="11" text-anchor="middle">{b}</text>')
    for frac in (0.0, 0.5, 1.0):
        v = top / 1.1 * frac
        out.append(f'<text x="{_PAD_L - 6}" y="{y(v) + 4:.1f}" font-size="11" text-anchor="end">{v:.3g}</text>')
    for i, (value, label) in enumerate(lines):  # the first label above its line, the others below
        out.append(f'<line x1="{_PAD_L}" x2="{_W - _PAD_R}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
                   f'stroke="#c0392b" stroke-dasharray="5"/><text x="{_W - _PAD_R}" '
                   f'y="{y(value) + (-4 if i == 0 else 12):.1f}" font-size="11" fill="#c0392b" '
                   f'text-anchor="end">{html.escape(label)}</text>')
    for fam, c in color.items():
        mine = sorted(((t, v) for t in trials if _family(t.values) == fam and (v := y_of(t)) is not None),
                      key=lambda tv: _batch(tv[0]))
        if len(mine) > 1:
            pts = " ".join(f"{x(_batch(t)):.1f},{y(v):.1f}" for t, v in mine)
            out.append(f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="1.5"/>')
        for t in trials:
            if _family(t.values) != fam:
                continue
            need = f", {fmt_need(t.measurement.oom_needed_gb)}" if t.measurement.oom_needed_gb else ""
            tip = html.escape(f"trial {t.number}: {' '.join(f'{k}={v}' for k, v in t.values.items())} "
                              f"({t.measurement.status}{need})")
            v = y_of(t)
            if t.measurement.status == "oom":
                at = (oom_y(t) if oom_y else None) or 0.0
                cx, cy = x(_batch(t)), y(at)
                out.append(f'<path class="oom" d="M{cx - 5:.1f},{cy - 5:.1f}L{cx + 5:.1f},{cy + 5:.1f}'
                           f'M{cx - 5:.1f},{cy + 5:.1f}L{cx + 5:.1f},{cy - 5:.1f}" stroke="{c}" '
                           f'stroke-width="2"><title>{tip}</title></path>')
            elif v is not None:
                out += _error_bar(x(_batch(t)), v, rel(t), top / 1.1 * 1.09, y, c)
                fill = c if t.feasible else "white"
                out.append(f'<circle cx="{x(_batch(t)):.1f}" cy="{y(v):.1f}" r="4" fill="{fill}" stroke="{c}" '
                           f'stroke-width="1.5"><title>{tip}</title></circle>')
    return (f'<h3>{html.escape(title)}</h3><svg width="{_W}" height="{_H}" role="img">{"".join(out)}</svg>'
            f'<div style="font-size: 11px; text-align: center; width: {_W}px">batch size</div>')


def _error_bar(cx: float, v: float, rel: float | None, most: float, y: Callable[[float], float], c: str) -> list[str]:
    """A speed's 95% interval as a bar with caps: its step time's ``rel`` either way (none where it
    rounds to nothing); the high end held under ``most``, the chart's top."""
    if not spread(rel):
        return []
    assert rel is not None
    low, high = y(v / (1 + rel)), y(min(most, v / (1 - rel)) if rel < 1 else most)
    return [f'<path class="interval" d="M{cx:.1f},{high:.1f}V{low:.1f}M{cx - 3:.1f},{high:.1f}H{cx + 3:.1f}'
            f'M{cx - 3:.1f},{low:.1f}H{cx + 3:.1f}" stroke="{c}" stroke-width="1"><title>95% interval: '
            f'±{rel:.0%} of the step time</title></path>']


def _best_html(summary: Summary, objective: str, trials: Sequence[Trial]) -> str:
    """The best config's line (with its probe's interval), its command, how noisy the probes were,
    and the configs as fast within that noise: what the console says, or that none fits."""
    best = summary.best_config
    if best is None and (failure := common_failure(trials)) is not None:
        advice = failure.advice()  # what the console and summary.json say; its paths from the page's own folder
        return f"<p><b>No configuration fits.</b> {html.escape(advice[:1].upper() + advice[1:])}</p>"
    if best is None:
        return "<p><b>No configuration fits the budget.</b> See summary.json (all_failed) for advice.</p>"
    probe = next((t.measurement for t in trials if t.number == best.trial), None)
    ci = probe.step_time_ci95_rel if probe is not None else None
    interval = "" if ci is None else (f" (step time +-{ci:.0%}" if ci >= 0.1 else f" (step time +-{ci:.1%}") + (
        ")" if best.stable else ", its probe did not settle)")
    noisy = noise_warning(trials)
    ties = "".join(f"<li>trial {e.trial}: {fmt_num(e.samples_per_second)} samples/s, {e.gap:.1%} slower (noise allows "
                   f"{e.noise:.1%}): {html.escape(values_line(e.searched))}</li>" for e in summary.within_noise_of_best)
    return (f"<p><b>Best: trial {best.trial}</b>, {html.escape(_family(best.searched))} "
            f"batch_size={best.config['batch_size']}: {fmt_num(best.objective(objective), 4)} "
            f"{objective.replace('_', ' ')}{interval}, peak {fmt_num(best.memory_peak_gb)} GiB"
            + (f", full run ~{format_duration(best.estimated_full_runtime_hours * 3600)}"
               if best.estimated_full_runtime_hours is not None else "")
            + "</p>" + _trainer_cost_note(summary)
            + (f"<p><b>{html.escape(noisy)}</b></p>" if noisy else "")
            + (f"<p>As fast within measurement noise ({len(summary.within_noise_of_best)}): the gap to the best is no "
               f"larger than the two probes' 95% CIs; <code>--confirm N</code> re-probes them.</p><ul>{ties}</ul>"
               if ties else "")
            + f"<pre style='white-space: pre-wrap'>{html.escape(best.command or '')}</pre>")


def _trainer_cost_note(summary: Summary) -> str:
    """With ``tune --calibrate``: what the best's speed includes, and what the charts do not."""
    cost = summary.trainer_cost
    if cost is None:
        return ""
    timed = (html.escape(cost.words()) if len(cost.measured) > 1 else
             f"{fmt_num(cost.per_micro_batch_s * 1000, 3)} ms a micro-batch, timed by real <code>trl sft</code> steps "
             f"of trial {cost.trial}")
    return (f"<p>Its speed includes the trainer's own cost, {timed} (<code>--calibrate</code>); "
            "the charts and the table below are the probes' own figures, the model's step alone.</p>")


def tune_report_html(summary: Summary, trials: Sequence[Trial], source: str) -> str:
    """The page for ``summary`` and its ``trials``."""
    objective = summary.objective
    families = list(dict.fromkeys(_family(t.values) for t in sorted(trials, key=lambda t: t.number)))
    color = {f: _COLORS[i % len(_COLORS)] for i, f in enumerate(families)}
    budget = summary.budget
    limits: list[tuple[float, str]] = []
    memory_title = "peak memory, GiB (worst-case batch; an OOM at least what it needed)"
    if budget.memory_gb:
        limit = budget.memory_gb - budget.headroom_gb
        device = budget.of_device
        total = fmt_num(budget.memory_gb)
        limits = [(budget.memory_gb, f"{'device memory' if device else 'budget'} {total} GiB")]
        if limit < budget.memory_gb:
            limits.append((limit, f"fits below {fmt_num(limit)} GiB (headroom {budget.headroom_gb:g})"))
        measured = max((t.measurement.needed_bytes / 1024**3 for t in trials), default=0.0)
        if device and limit > _OFF_SCALE * measured:
            # No budget was set: the device's memory (a machine's RAM, on CPU) would flatten every peak.
            memory_title += f"; device memory {total} GiB, far above, not drawn"
            limits = []
    legend = "".join(f'<span style="color: {c}">&#9632;</span> {html.escape(f)}&nbsp;&nbsp; '
                     for f, c in color.items())
    speed = _chart(f"{objective.replace('_', ' ')} (filled: fits, hollow: over budget, x: OOM; bars: 95% interval)",
                   trials, color, lambda t: getattr(t.measurement, objective) if t.measurement.status == "ok" else None,
                   rel=lambda t: t.measurement.step_time_ci95_rel)
    memory = _chart(memory_title, trials, color,
                    lambda t: t.measurement.peak_memory_gb if t.measurement.status == "ok" else None,
                    lines=limits, oom_y=lambda t: t.measurement.needed_bytes / 1024**3 or None)
    best_html = _best_html(summary, objective, trials)
    names = list(dict.fromkeys(k for t in trials for k in t.values))
    head = "".join(f"<th>{html.escape(h)}</th>" for h in ["trial", "status", *names, objective, "peak GiB", "fits"])
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in [
            t.number, t.measurement.status, *(t.values.get(n) for n in names),
            fmt_num(getattr(t.measurement, objective), 4) + spread(t.measurement.step_time_ci95_rel),
            fmt_num(t.measurement.peak_memory_gb), t.feasible]) + "</tr>"
        for t in sorted(trials, key=lambda t: t.number))
    return f"""<!doctype html><meta charset="utf-8"><title>trainfit tune: {html.escape(source)}</title>
<body style="font-family: sans-serif; max-width: 760px">
<h2>trainfit tune: {html.escape(source)}</h2>
<p>{summary.total_tested} probed: {summary.successful} fit, {summary.failed_oom} OOM,
{summary.over_budget} over budget, {summary.failed_error} errors, {summary.failed_timeout} timeouts{
    f', {summary.failed_diverged} diverged' if summary.failed_diverged else ''};
strategy {html.escape(summary.strategy)}; {html.escape(summary.stop_reason)}; device
{html.escape(str(summary.device))}.</p>
{best_html}
{PLAN_SLOT}
<p style="font-size: 12px">{legend}</p>
{speed}
{memory}
<h3>Trials</h3>
<table style="font-size: 12px; border-collapse: collapse" border="1" cellpadding="3"><tr>{head}</tr>{rows}</table>
</body>
"""
