"""A self-contained HTML page (inline SVG, no JavaScript, no dependencies) of a length histogram."""

from __future__ import annotations

import html

from trainfit.data.stats import LengthStats


def histogram_html(stats: LengthStats) -> str:
    edges, counts = stats.histogram["edges"], stats.histogram["counts"]
    width, height, pad = 720, 300, 40
    peak = max(counts) or 1
    bar_w = (width - 2 * pad) / len(counts)
    bars = []
    for i, c in enumerate(counts):
        h = (height - 2 * pad) * c / peak
        x = pad + i * bar_w
        label = f"{edges[i]:.0f}-{edges[i + 1]:.0f}: {c} samples"
        bars.append(f'<rect x="{x:.1f}" y="{height - pad - h:.1f}" width="{bar_w - 1:.1f}" height="{h:.1f}" '
                    f'fill="#4a7ab5"><title>{label}</title></rect>')
    fixed = stats.recommended_max_length
    lo, hi = edges[0], edges[-1]
    marker = ""
    if lo <= fixed <= hi:
        x = pad + (fixed - lo) / (hi - lo) * (width - 2 * pad)
        marker = (f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{pad}" y2="{height - pad}" stroke="#c0392b" '
                  f'stroke-dasharray="4"/><text x="{x + 4:.1f}" y="{pad + 12}" font-size="12" fill="#c0392b">'
                  f'max_length {fixed}</text>')
    axis = (f'<text x="{pad}" y="{height - 10}" font-size="12">{lo:.0f}</text>'
            f'<text x="{width - pad}" y="{height - 10}" font-size="12" text-anchor="end">'
            f'{hi:.0f}{"+" if stats.max > hi else ""}</text>'
            f'<text x="{width / 2:.0f}" y="{height - 10}" font-size="12" text-anchor="middle">length (positions)</text>'
            + _count_axis(peak, height, pad))
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{v:,.0f}</td></tr>" for k, v in stats.percentiles.items())
    waste = "".join(f"<tr><td>{html.escape(k)}</td><td>{v:.1%}</td></tr>" for k, v in stats.waste.items())
    return f"""<!doctype html><meta charset="utf-8"><title>trainfit: lengths of {html.escape(stats.source)}</title>
<body style="font-family: sans-serif; max-width: 760px">
<h2>Sample lengths: {html.escape(stats.source)}</h2>
<p>{stats.samples:,} samples, {stats.total:,} positions in all; {html.escape(stats.description)}.</p>
<svg width="{width}" height="{height}" role="img">{''.join(bars)}{marker}{axis}</svg>
<h3>Percentiles</h3><table>{rows}</table>
<h3>Padding waste at batch size {stats.batch_size}</h3><table>{waste}</table>
<p>Recommended fixed length: {fixed} ({html.escape(stats.recommended_rule)}),
truncating {stats.truncated_share:.2%} of samples.</p>
</body>
"""


def _count_axis(peak: float, height: int, pad: int) -> str:
    """The y-axis: a line, the sample counts at 0, half and the tallest bar, and its title."""
    top, bottom = pad, height - pad
    ticks = "".join(f'<text x="{pad - 4}" y="{bottom - (bottom - top) * share + 4:.1f}" font-size="11" '
                    f'text-anchor="end">{round(peak * share):,}</text>' for share in (0.0, 0.5, 1.0))
    return (f'<line x1="{pad}" x2="{pad}" y1="{top}" y2="{bottom}" stroke="#888"/>{ticks}'
            f'<text x="12" y="{(top + bottom) / 2:.0f}" font-size="12" text-anchor="middle" '
            f'transform="rotate(-90 12 {(top + bottom) / 2:.0f})">samples</text>')
