"""What ``trainfit ablate`` leaves and says: ``ablation.json`` (written after each row, so an
interrupted ablation resumes), ``ablation.html``, and the table's text; :func:`ablate_into` runs
the ablation into an output folder with all of it."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from trainfit.ablate import AGAIN, TOGETHER, Ablation, Row, ablate, baseline_params, helpful, measured_on, reference
from trainfit.errors import TrainfitError
from trainfit.files import folder_holder, held_folder, write_atomically
from trainfit.format import fmt_num
from trainfit.json_record import finite, non_finite
from trainfit.params import Params
from trainfit.spec import Spec

ABLATION_FILE = "ablation.json"
PAGE_FILE = "ablation.html"


def ablate_into(output: Path, spec: Spec, *, resume: bool = False, only: Sequence[str] = (), stats: Any = None,
                on_row: Callable[[Row], None] | None = None, on_note: Callable[[str], None] | None = None) -> Ablation:
    """:func:`~trainfit.ablate.ablate` into the folder ``output``, held for the whole ablation
    (:func:`held_ablation`): ``ablation.json`` after each row (``resume``: the rows it already holds
    are reused, once checked to be of this baseline config), then ``ablation.html``. ``on_row`` hears
    each row once it is kept; ``on_note`` what is said of the rows reused (a row taken as not measured)."""
    with held_ablation(output):
        return _ablate_held(output, spec, resume=resume, only=only, stats=stats, on_row=on_row, on_note=on_note)


def held_ablation(output: Path) -> contextlib.AbstractContextManager[IO[str]]:
    """Hold ``output`` (:func:`~trainfit.files.held_folder`) while an ablation writes into it: a
    second one (a ``--resume`` while it runs, say) is refused before it touches anything, where both
    would measure and ``ablation.json`` end as whichever wrote last."""
    return held_folder(output, functools.partial(_busy, output))


def refuse_if_held(output: Path) -> None:
    """Refuse ``output`` at once where a live ablation holds it (the check :func:`ablate_into` makes
    again as it takes the folder): before the data is counted. A folder without a ``.lock`` is asked
    nothing (asking would leave one in it)."""
    holder = folder_holder(output) if (output / ".lock").is_file() else None
    if holder is not None:
        raise _busy(output, holder)


def _busy(output: Path, holder: str) -> TrainfitError:
    return TrainfitError(f"{output} is in use by a running trainfit ({holder})",
                         "wait for it to end (or stop it and --resume it), or give a new --output")


def _ablate_held(output: Path, spec: Spec, *, resume: bool, only: Sequence[str], stats: Any,
                 on_row: Callable[[Row], None] | None, on_note: Callable[[str], None] | None) -> Ablation:
    path = output / ABLATION_FILE
    baseline, scope = baseline_params(spec).to_dict(), measured_on(spec)
    done = {r.name: r for r in rows_to_reuse(output, spec, resume, on_note)}
    measured: list[Row] = []

    def kept(rows: list[Row]) -> list[Row]:  # this run's rows, then earlier ones it did not measure again
        names = {r.name for r in rows}
        return rows + [r for name, r in done.items() if name not in names]

    def keep(row: Row) -> None:
        measured.append(row)
        partial = {"schema_version": 1, "created_at": "", "device": measured[0].device, "baseline": baseline,
                   "rows": [r.to_json() for r in kept(measured)], "measured_on": scope}
        write_atomically(path, _json(partial))  # kept as it comes, before it is said
        if on_row is not None:
            on_row(row)

    result = ablate(spec, stats=stats, done=done, only=only, on_row=keep)
    result = dataclasses.replace(result, rows=kept(result.rows))
    write_atomically(path, _json(result.to_json()))
    write_atomically(output / PAGE_FILE, page(result, str(spec.source)))
    return result


def _json(doc: dict[str, Any]) -> str:
    """``ablation.json``'s text: refused (:func:`~trainfit.json_record.finite`) where a figure is NaN
    or an infinity, which no strict JSON reader takes; the file is then left as it was."""
    return json.dumps(finite(doc, ABLATION_FILE), indent=2, allow_nan=False) + "\n"


def rows_to_reuse(output: Path, spec: Spec, resume: bool, say: Callable[[str], None] | None = None) -> list[Row]:
    """The rows an ablation into ``output`` reuses: with ``resume``, those its ``ablation.json``
    holds (checked by :func:`earlier_rows`) whose figures are all numbers (:func:`measured_rows`:
    each other one is taken as not measured, and ``say`` hears why); without, none, and an ablation
    already there is refused rather than written over."""
    path = output / ABLATION_FILE
    if not resume:
        if path.exists():
            raise TrainfitError(f"{output} already holds an ablation ({ABLATION_FILE})",
                                "pass --resume to continue it, or --output NEW_FOLDER to start afresh")
        return []
    rows = measured_rows(earlier_rows(path, baseline_params(spec).to_dict(), measured_on(spec)), say)
    # local: torch loads only for a resume, to name this machine's device as a probe names it
    from trainfit.devices import device_label, resolve_device_name

    here = device_label(resolve_device_name(spec.probe.device))
    there = {r.device for r in rows if r.status == "ok" and r.device}
    if there - {here}:
        raise TrainfitError(f"{path} was measured on {', '.join(sorted(there))}, and this run is on {here}",
                            "resume on that machine, or ablate into a new --output here")
    return rows


def measured_rows(rows: Sequence[Row], say: Callable[[str], None] | None = None) -> list[Row]:
    """``rows`` less those holding a figure that is no number (NaN, an infinity: a file edited, or
    written by an older trainfit): reused, one would print as ``xnan`` and spread into every ratio
    against it. Each is taken as not measured (an ablation that measures it measures it again), and
    ``say`` hears which and why."""
    kept = []
    for row in rows:
        found = non_finite(row.to_json())
        if found is None:
            kept.append(row)
        elif say is not None:
            say(f"{ABLATION_FILE}'s row {row.name!r} holds {found[0]} = {found[1]}, not a number: taken as not "
                "measured (measured again where this ablation measures it, else left out)")
    return kept


def earlier_rows(path: Path, baseline: dict[str, Any], scope: dict[str, Any] | None = None) -> list[Row]:
    """The rows of the ablation in ``path``, once it is checked to be of this baseline config and,
    where both say, measured on the same model, data, budget and probe settings (``scope``:
    :func:`~trainfit.ablate.measured_on`)."""
    if not path.is_file():
        raise TrainfitError(f"nothing to resume: {path} does not exist",
                            "drop --resume, or give the --output of the interrupted ablation")
    try:
        earlier = Ablation.from_json(json.loads(path.read_text()))
    except (ValueError, TypeError, KeyError) as err:
        raise TrainfitError(f"{path} is not an ablation trainfit can read ({err})",
                            "ablate into a new --output") from None

    # A knob added since that file was written ran at its default there.
    defaults = Params().to_dict()
    was = {**{k: defaults[k] for k in baseline.keys() - earlier.baseline.keys() if k in defaults}, **earlier.baseline}
    differ = sorted(k for k in baseline.keys() | was.keys() if baseline.get(k) != was.get(k))
    if scope is not None and earlier.measured_on is not None:
        differ += _changed(scope, earlier.measured_on)
    if differ:
        raise TrainfitError(f"{path} measured another config: {', '.join(differ)} differ",
                            "resume with the same spec and --set, or ablate into a new --output")
    return earlier.rows


def _changed(now: dict[str, Any], then: dict[str, Any]) -> list[str]:
    """Where two :func:`~trainfit.ablate.measured_on` records differ: ``section.key``, or the section."""
    out: list[str] = []
    for section in sorted(now.keys() | then.keys()):
        a, b = now.get(section), then.get(section)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += [f"{section}.{k}" for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]
        else:
            out.append(section)
    return out


def cells(row: Row) -> list[str]:
    """One table row: what, speed, ratio with its interval, peak, its change, step memory, MFU, claim."""
    if row.status != "ok":
        reason = (row.reason or "").splitlines()[0][:90] if row.reason else ""
        return [row.name, row.status, reason, "", "", "", "", row.claim or ""]
    # the baseline's two probes are each read against their mean, the reference: not "baseline x1.13" against itself
    against = f" vs {row.versus}" if row.versus else " of the reference, the baseline's probes' mean" if row.name in (
        "baseline", AGAIN) else ""
    ratio = "" if row.speedup is None else f"x{row.speedup:.2f} ({ratio_interval(row)}){against}"
    change = "" if row.memory_change is None else f"{row.memory_change:+.0%}"
    name = row.name + (" *" if row.changes_learning else "")
    return [name, fmt_num(row.samples_per_second or 0), ratio, f"{row.peak_gb or 0:.2f}", change,
            f"{row.step_memory_gb:.3f}" if row.step_memory_gb is not None else "",
            f"{row.mfu:.1%}" if row.mfu is not None else "", row.claim or ""]


HEADER = ["technique", "samples/s", "vs baseline (95%)", "peak GiB", "memory", "step GiB", "MFU", "the guide claimed"]


def together_notes(result: Ablation) -> list[str]:
    """What the row of the techniques together (or its absence) does not say itself: why there is
    none; which techniques joined it for memory alone; and where it ran slower than the fastest of
    them alone, beyond both intervals (they interact on this device: a combination is measured,
    never assumed to add up)."""
    why_alone = no_together_row(result)
    rows = {r.name: r for r in result.rows}
    together = rows.get(TOGETHER)
    if why_alone or together is None or together.status != "ok" or "baseline" not in rows:
        return [why_alone] if why_alone else []
    _, _, memory_noise = reference(rows["baseline"], rows.get(AGAIN))
    # rows compared with another (compile, against fixed padding) carry that row's ratio, not the baseline's
    joined = [r for r in helpful([r for r in result.rows if r.name not in ("baseline", AGAIN, TOGETHER)], memory_noise)
              if r.versus is None]
    if not joined:
        return []
    notes = []
    lean = [r for r in joined if not (r.speedup_low is not None and r.speedup_low > 1)]
    if lean:
        notes.append("together: " + ", ".join(f"{r.name} (x{r.speedup:.2f})" for r in lean)
                     + " joined for the memory it saved, not for speed")
    fastest = max(joined, key=lambda r: r.speedup or 0.0)
    if (together.speedup_high is not None and fastest.speedup_low is not None
            and together.speedup_high < fastest.speedup_low):
        notes.append(f"together ran at x{together.speedup:.2f}, slower than {fastest.name} alone (x{fastest.speedup:.2f}) "
                     "beyond both intervals: these techniques interact on this device; for speed, take "
                     f"{fastest.name} alone")
    return notes


def no_together_row(result: Ablation) -> str | None:
    """Why the table has no row of the techniques together, where it has none but has techniques."""
    names = [r.name for r in result.rows]
    if TOGETHER in names or "baseline" not in names or len(names) <= 2:
        return None
    rows = {r.name: r for r in result.rows}
    _, _, memory_noise = reference(rows["baseline"], rows.get(AGAIN))
    helped = [r.name for r in helpful([r for r in result.rows if r.name not in ("baseline", AGAIN)], memory_noise)]
    return ("no row of the techniques together: " + (f"only {helped[0]} helped" if helped else "none helped")
            + " beyond the noise here (faster, or less memory at the same speed), and it takes two")


def page(result: Ablation, source: str) -> str:
    """ablation.html: the table and a bar per row for speed and for peak memory (self-contained)."""
    import html

    rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells(r)) + "</tr>" for r in result.rows)
    ok = [r for r in result.rows if r.status == "ok"]
    top_speed = max((r.samples_per_second or 0 for r in ok), default=1) or 1
    top_peak = max((r.peak_gb or 0 for r in ok), default=1) or 1

    def bars(value: Any, top: float, unit: str) -> str:
        return "".join(f'<div class="bar"><span class="label">{html.escape(r.name)}</span>'
                       f'<span class="fill" style="width: {280 * (value(r) or 0) / top:.0f}px"></span>'
                       f'<span>{value(r) or 0:.3g} {unit}</span></div>' for r in ok)

    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>trainfit ablation: {html.escape(source)}</title>
<style>body {{font-family: sans-serif; margin: 2em}} table {{border-collapse: collapse}}
td, th {{border: 1px solid #ccc; padding: 4px 8px; text-align: left}}
.bar {{display: flex; align-items: center; gap: 8px; margin: 2px 0}} .label {{width: 260px}}
.fill {{display: inline-block; height: 14px; background: #1f77b4}} #memory .fill {{background: #d62728}}</style>
</head><body>
<h1>Ablation: {html.escape(source)}</h1>
<p>Measured on {html.escape(result.device)}, {html.escape(result.created_at)}. Each technique alone over the
baseline (every technique off), then together. Claims: {html.escape(result.claim_source)}.</p>
<table><tr>{"".join(f"<th>{html.escape(h)}</th>" for h in HEADER)}</tr>{rows}</table>
{"".join(f"<p>{html.escape(note)}</p>" for note in together_notes(result))}
<h2>samples/s</h2><div id="speed">{bars(lambda r: r.samples_per_second, top_speed, "samples/s")}</div>
<h2>peak memory</h2><div id="memory">{bars(lambda r: r.peak_gb, top_peak, "GiB")}</div>
</body></html>
"""


def ratio_interval(row: Row) -> str:
    """``0.95-1.05``; ``up to 8.64`` where the interval reaches 0 (a spread past 100%), as a plan says it."""
    if not row.speedup_low:
        return f"up to {row.speedup_high:.2f}"
    return f"{row.speedup_low:.2f}-{row.speedup_high:.2f}"
