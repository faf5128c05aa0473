"""One search, a matrix of memory budgets (``tune --budgets 8,12,16,24``): which config is the
fastest under each.

The search runs first under the largest budget, into the output folder. Each smaller budget then
gets a search of its own (its own priors, its own stop rules) into ``OUTPUT/budget-<N>gb/``, where
every config a larger budget's search measured is taken as measured, judged again against the
smaller budget (its peak plus the headroom against the budget; an OOM stays an OOM). Only the
configs no search measured yet are probed. A probe's peak does not depend on the budget it ran
under, so nothing is guessed: a smaller budget's best is always a measured config.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trainfit.errors import TrainfitError
from trainfit.files import write_atomically
from trainfit.format import values_line
from trainfit.json_record import Record
from trainfit.page_slots import with_section
from trainfit.params import Params
from trainfit.probe.measurement import Measurement
from trainfit.run_folder import RunFolder
from trainfit.search.loop import default_probe
from trainfit.tune.options import TuneOptions, TuneResult
from trainfit.spec import MAX_MEMORY_GB, Spec
from trainfit.tune import tune

SCHEMA_VERSION = 1
HEADER = ("budget", "config", "samples/s", "peak GiB", "full run", "probes (taken as measured)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BudgetRow(Record):
    """The fastest config under one budget, and what finding it cost."""

    budget_gb: float
    output: str
    """The folder of this budget's search (its summary.json, report.html, train_command.sh)."""
    trial: int | None
    """None: nothing measured fits this budget."""
    searched: dict[str, Any] | None
    samples_per_second: float | None
    peak_gb: float | None
    estimated_full_runtime_hours: float | None
    command: str | None
    probed: int
    """Configs this budget's search probed."""
    reused: int
    """Configs it took from a larger budget's search instead of probing them."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class BudgetMatrix(Record):
    """``budgets.json``: each budget's fastest config, largest budget first."""

    schema_version: int = SCHEMA_VERSION
    rows: list[BudgetRow]

    @property
    def probes(self) -> int:
        return sum(r.probed for r in self.rows)

    def cells(self) -> list[tuple[str, ...]]:
        """The rows as text, under :data:`HEADER` (the terminal's table and the report's)."""
        return [(f"{r.budget_gb:g} GiB", values_line(r.searched) if r.searched else "nothing fits",
                 f"{r.samples_per_second:.4g}" if r.samples_per_second else "",
                 f"{r.peak_gb:.2f}" if r.peak_gb is not None else "",
                 f"{r.estimated_full_runtime_hours * 60:.1f} min" if r.estimated_full_runtime_hours else "",
                 f"{r.probed} ({r.reused})") for r in self.rows]


def parse_budgets(text: str) -> list[float]:
    """``8,12,16`` -> the budgets in GiB, largest first; a clear error for anything else."""
    try:
        values = [float(word) for word in text.split(",") if word.strip()]
    except ValueError:
        raise TrainfitError(f"--budgets {text}: not a comma-separated list of GiB", "e.g. --budgets 8,12,16,24") from None
    if len(values) < 2 or any(not (v > 0 and math.isfinite(v)) for v in values):
        raise TrainfitError(f"--budgets {text}: give two or more positive budgets in GiB", "e.g. --budgets 8,12,16,24")
    if max(values) > MAX_MEMORY_GB:  # as budget.memory_gb: far larger ones overflow when made bytes
        raise TrainfitError(f"--budgets {text}: each budget must be <= {MAX_MEMORY_GB:,} GiB (a pebibyte)",
                            "e.g. --budgets 8,12,16,24")
    return sorted(set(values), reverse=True)


def rejudged(m: Measurement, budget_gb: float) -> Measurement:
    """``m`` as it stands against ``budget_gb``: the same peak and speed, the budget's verdict."""
    return dataclasses.replace(m, budget_memory_gb=budget_gb)


def tune_budgets(spec: Spec, budgets: Sequence[float], options: TuneOptions, *,
                 announce: Callable[[float, Path], None] = lambda budget, folder: None,
                 make_probe: Callable[[Spec, Path], Callable[[Params, int], Measurement]] | None = None,
                 ) -> tuple[BudgetMatrix, list[TuneResult]]:
    """Tune ``spec`` under each of ``budgets`` (GiB), sharing every measurement (see the module), each
    search as ``options`` say (its ``output`` the matrix's folder; each smaller budget's search in a
    folder of it). ``announce(budget, folder)`` is called as each budget's search starts.
    ``make_probe(spec, folder)``: the probe of a budget's search (default: real, isolated probes);
    tests of the sharing pass a synthetic one. Writes ``OUTPUT/budgets.json``."""
    output = Path(options.output)
    known: dict[str, Measurement] = {}
    rows: list[BudgetRow] = []
    results: list[TuneResult] = []
    stats, device_type = options.stats, options.device_type
    for i, budget in enumerate(sorted(set(budgets), reverse=True)):
        folder = output if i == 0 else output / f"budget-{budget:g}gb"
        spec_b = dataclasses.replace(spec, budget=dataclasses.replace(spec.budget, memory_gb=budget))
        announce(budget, folder)
        session = None
        if make_probe is not None:
            real = make_probe(spec_b, folder)
        else:
            real, session, device_type, stats = default_probe(
                spec_b, stats, folder, options.on_event or (lambda event: None), device_type)
        counts = {"probed": 0, "reused": 0}
        probe_fn = _sharing(real, dict(known), budget, counts)
        try:
            result = tune(spec_b, dataclasses.replace(options, output=folder, stats=stats, probe_fn=probe_fn,
                                                      device_type=device_type,
                                                      # not by default: `plan FOLDER --calibrate` times one folder's
                                                      calibrate_steps=options.calibrate_steps or 0))
        finally:
            if session is not None:
                session.close()
        for t in result.trials:  # the next, smaller budget takes these as measured (a resumed run's too)
            known.setdefault(_key(t.measurement.config), t.measurement)
        results.append(result)
        rows.append(_row(budget, folder, result, counts))
    matrix = BudgetMatrix(rows=rows)
    write_atomically(output / "budgets.json", json.dumps(matrix.to_json(), indent=2) + "\n")
    _record(output, matrix)
    return matrix, results


def _record(output: Path, matrix: BudgetMatrix) -> None:
    """The matrix in the largest budget's ``summary.json`` and as a section of its ``report.html``,
    with each row's command."""
    import html

    summary = dataclasses.replace(RunFolder(output).summary, budget_matrix=[r.to_json() for r in matrix.rows])
    write_atomically(output / "summary.json", json.dumps(summary.to_json(), indent=2, default=list) + "\n")
    report = output / "report.html"
    if not report.is_file():
        return
    head = (*HEADER, "command")
    cells = [(*row, r.command or "") for row, r in zip(matrix.cells(), matrix.rows, strict=True)]
    table = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in cells)
    section = ("<h3>Budget matrix: the fastest measured config under each budget</h3><table><tr>"
               + "".join(f"<th>{h}</th>" for h in head) + f"</tr>{table}</table>")
    write_atomically(report, with_section(report.read_text(), "budgets", section))


def _sharing(real: Callable[[Params, int], Measurement], earlier: dict[str, Measurement], budget: float,
             counts: dict[str, int]) -> Callable[[Params, int], Measurement]:
    """A probe that takes a config a larger budget's search measured (``earlier``) as measured,
    judged against ``budget``, the first time this search asks for it; anything else, and a
    confirmation's repeat of it, is a real probe."""
    taken: set[str] = set()

    def probe_fn(params: Params, number: int) -> Measurement:
        key = _key(params.to_dict())
        if key in earlier and key not in taken:
            taken.add(key)
            counts["reused"] += 1
            return rejudged(earlier[key], budget)
        counts["probed"] += 1
        return real(params, number)

    return probe_fn


def _key(config: Mapping[str, Any]) -> str:
    """A config's identity: every knob (``Params.to_dict``, as a measurement records it)."""
    return json.dumps(dict(config), sort_keys=True, default=str)


def _row(budget: float, folder: Path, result: TuneResult, counts: dict[str, int]) -> BudgetRow:
    best = result.summary.best_config
    return BudgetRow(budget_gb=budget, output=str(folder), trial=best.trial if best else None,
                     searched=dict(best.searched) if best else None,
                     samples_per_second=best.samples_per_second if best else None,
                     peak_gb=best.memory_peak_gb if best else None,
                     estimated_full_runtime_hours=best.estimated_full_runtime_hours if best else None,
                     command=best.command if best else None, probed=counts["probed"], reused=counts["reused"])
