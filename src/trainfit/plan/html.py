"""The plan's section of ``report.html``."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from trainfit.format import format_duration as dur
from trainfit.format import values_line
from trainfit.plan.estimated import ESTIMATED

if TYPE_CHECKING:
    from trainfit.plan import Plan


def plan_section(plan: Plan) -> str:
    """The window, the pick, the ETA and its parts, each priority's pick and the options."""
    e = plan.eta
    verdict = "fits" if plan.fits else "does not fit"
    picks = "".join(f"<tr><td>{p.priority}</td><td>{p.trial}</td><td>{html.escape(values_line(p.searched))}</td>"
                    f"<td>{dur(p.eta_s)}</td><td>{'fits' if p.fits else 'does not fit'}</td></tr>"
                    for p in plan.priorities)
    options = "".join(f"<li>{html.escape(o.change)}: ETA {dur(o.eta.total_s)} (up to {dur(o.eta.high_s)}); "
                      f"{html.escape(o.cost)}</li>" for o in plan.options)
    command = ("" if e.command_total_s is None else
               f" (by <code>trainfit train</code>; the written command: {dur(e.command_total_s)})")
    rests = "".join(f"<li>{html.escape(line)}</li>" for line in plan.rests_on)
    estimated = ("" if plan.estimated is None else f"<p><b>{ESTIMATED.capitalize()}</b>: "
                 f"{html.escape(plan.estimated.speed)}; its interval: {html.escape(plan.estimated.interval)}.</p>\n")
    chosen = "the spec's config" if plan.trial is None else f"trial {plan.trial}"
    marked = f", {ESTIMATED}" if plan.estimated else ""
    table = ("" if not picks else '<table style="font-size: 12px; border-collapse: collapse" border="1" cellpadding="3">'
             f"\n<tr><th>priority</th><th>trial</th><th>config</th><th>ETA</th><th></th></tr>{picks}</table>")
    return f"""<h3>Plan: {plan.epochs:g} epoch(s) in {plan.max_hours:g} h ({dur(plan.window_s)} after the margin)</h3>
{estimated}<p>Priority <b>{plan.priority}</b> ({html.escape(plan.rule)}): {chosen},
{html.escape(values_line(plan.searched))}. <b>ETA {dur(e.total_s)}</b> ({html.escape(e.interval)}){marked}: {verdict}{command}.
Training {e.steps:,} steps x {e.step_time_s:.3g} s; {e.checkpoints} checkpoint(s) every
{dur(plan.checkpoint_every_s)}, {dur(e.checkpoint_s)} in all.</p>
<ul style="font-size: 12px">{rests}</ul>
{table}
{f"<p>{'Room to spare: each still fits' if plan.fits else 'To fit the window'}:</p><ol>{options}</ol>" if options else ""}"""
