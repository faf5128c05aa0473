"""A comparison's outputs besides ``compare.json``: its table, one self-contained HTML page (the
loss curves against steps and against training time, train and eval, and the speed and memory
bars, drawn as inline SVG: no script, no network), and ``next_configs.yaml`` from the suggestions."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainfit.compare.curves import final_loss
from trainfit.compare.suggest import reached
from trainfit.files import write_atomically

if TYPE_CHECKING:
    from trainfit.compare import Comparison

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
HEADER = ("config", "status", "steps", "final loss", "samples/s", "peak GiB", "to target")


def header(state: Comparison) -> tuple[str, ...]:
    """The table's columns: "to target" only where ``--target-loss`` gave one (an empty column says nothing)."""
    return HEADER if state.target_loss is not None else HEADER[:-1]


def rows(state: Comparison) -> list[tuple[str, ...]]:
    """One row per config, in the file's order (the table's and the page's), the columns of :func:`header`."""
    return [row[:len(header(state))] for row in _rows(state)]


def _rows(state: Comparison) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for name in state.configs:
        run = state.runs.get(name)
        if run is None:
            out.append((name, "not run", "", "", "", "", ""))
            continue
        loss = final_loss(run)
        hit = reached(run, state.target_loss) if state.target_loss is not None else None
        target = "" if state.target_loss is None else (
            "not reached" if hit is None else f"step {hit[0]:.0f}, {hit[1]:.1f} s, {hit[2]:,.0f} samples")
        status = run.status + (f" at step {run.diverged_at}" if run.diverged_at else "")
        out.append((name, status, f"{run.steps}/{run.max_steps}", "" if loss is None else f"{loss:.4g}",
                    "" if run.samples_per_second is None else f"{run.samples_per_second:.3g}",
                    "" if run.peak_memory_gb is None else f"{run.peak_memory_gb:.2f}", target))
    return out


def next_configs(state: Comparison) -> dict[str, dict[str, Any]]:
    """The next round: every config a suggestion proposes (the best kept first)."""
    out: dict[str, dict[str, Any]] = {}
    for s in state.suggestions:
        out.update(s.configs)
    return out


def write_report(output: Path, state: Comparison) -> None:
    import yaml

    nxt = next_configs(state)
    if nxt:
        text = "# trainfit compare: the next round, from the suggestions in compare.json\n"
        write_atomically(output / "next_configs.yaml", text + yaml.safe_dump(nxt, sort_keys=False))
    write_atomically(output / "compare.html", page(state))


def page(state: Comparison) -> str:
    names = list(state.configs)
    color = {n: COLORS[i % len(COLORS)] for i, n in enumerate(names)}
    runs = {n: r for n, r in state.runs.items() if r.losses}
    table = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows(state))
    suggestions = "".join(f"<li><b>{html.escape(s.says)}</b><br><small>{html.escape(s.evidence)}</small></li>"
                          for s in state.suggestions)
    legend = " ".join(f'<span style="color:{color[n]}">&#9632; {html.escape(n)}</span>' for n in names)
    dots = ", dots: eval loss" if any(r.evals for r in runs.values()) else ""  # no legend for dots not drawn
    charts = [
        _chart("loss against optimizer steps", {n: [(p[0], p[2]) for p in r.losses] for n, r in runs.items()},
               {n: [(p[0], p[2]) for p in r.evals] for n, r in runs.items()}, color, "step"),
        _chart("loss against training time (evaluations taken out)",
               {n: [(p[1], p[2]) for p in r.losses] for n, r in runs.items()},
               {n: [(p[1], p[2]) for p in r.evals] for n, r in runs.items()}, color, "seconds"),
        _bars("samples/s", {n: r.samples_per_second for n, r in state.runs.items()}, color),
        _bars("peak memory, GiB", {n: r.peak_memory_gb for n, r in state.runs.items()}, color),
    ]
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>trainfit compare</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:70em}}td,th{{padding:.2em .8em;text-align:left}}
svg{{background:#fafafa;margin:.5em 0}}</style></head><body>
<h1>trainfit compare: {len(names)} configs, {state.steps} steps each</h1>
<p>{html.escape(state.spec)} on {html.escape(state.device)}, seed {state.seed}; lines: train loss{dots}</p>
<table><tr>{"".join(f"<th>{h}</th>" for h in header(state))}</tr>{table}</table>
<h2>Suggestions for the next round</h2><ul>{suggestions}</ul>
<p>{legend}</p>
{"".join(charts)}
</body></html>
"""


def _chart(title: str, lines: dict[str, list[tuple[float, Any]]], dots: dict[str, list[tuple[float, Any]]],
           color: dict[str, str], x_name: str, w: int = 640, h: int = 300) -> str:
    def finite(series: list[tuple[float, Any]]) -> list[tuple[float, float]]:  # a diverged run's nan is left out
        return [(x, y) for x, y in series if y is not None and math.isfinite(y)]

    lines = {n: finite(s) for n, s in lines.items()}
    dots = {n: finite(s) for n, s in dots.items()}
    points = [p for series in (*lines.values(), *dots.values()) for p in series]
    if not points:
        return f"<h3>{html.escape(title)}</h3><p>nothing recorded</p>"
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y0, y1 = min(p[1] for p in points), max(p[1] for p in points)
    pad = 40

    def xy(x: float, y: float) -> str:
        px = pad + (x - x0) / ((x1 - x0) or 1) * (w - 2 * pad)
        py = h - pad - (y - y0) / ((y1 - y0) or 1) * (h - 2 * pad)
        return f"{px:.1f},{py:.1f}"

    body = "".join(f'<polyline fill="none" stroke="{color[n]}" stroke-width="1.5" points="'
                   f'{" ".join(xy(x, y) for x, y in s)}"/>' for n, s in lines.items() if s)
    body += "".join(f'<circle cx="{xy(x, y).split(",")[0]}" cy="{xy(x, y).split(",")[1]}" r="3.5" fill="{color[n]}"/>'
                    for n, s in dots.items() for x, y in s)
    axes = (f'<text x="{pad}" y="{h - 8}" font-size="11">{x0:g}</text>'
            f'<text x="{w - pad}" y="{h - 8}" font-size="11" text-anchor="end">{x1:g} {x_name}</text>'
            f'<text x="4" y="{pad}" font-size="11">{y1:.3g}</text><text x="4" y="{h - pad}" font-size="11">{y0:.3g}</text>')
    return (f'<h3>{html.escape(title)}</h3><svg class="chart" width="{w}" height="{h}" '
            f'xmlns="http://www.w3.org/2000/svg">{axes}{body}</svg>')


def _bars(title: str, values: dict[str, float | None], color: dict[str, str], w: int = 640) -> str:
    known = {n: v for n, v in values.items() if v is not None}
    if not known:
        return ""
    top = max(known.values()) or 1.0
    h = 24 * len(known) + 10
    bars = "".join(f'<rect x="150" y="{5 + 24 * i}" width="{(w - 220) * v / top:.1f}" height="18" fill="{color[n]}"/>'
                   f'<text x="145" y="{19 + 24 * i}" font-size="12" text-anchor="end">{html.escape(n)}</text>'
                   f'<text x="{155 + (w - 220) * v / top:.1f}" y="{19 + 24 * i}" font-size="12">{v:.3g}</text>'
                   for i, (n, v) in enumerate(known.items()))
    return f'<h3>{html.escape(title)}</h3><svg class="bars" width="{w}" height="{h}">{bars}</svg>'
