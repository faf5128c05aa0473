"""``tune --budgets``: one search under the largest budget, then each smaller budget's search with
what is measured taken as measured. On the synthetic surface (search logic only, never a
measurement): the same pick per budget as separate tunes, for a fraction of their probes; then end
to end with real probes under real CPU caps (integration)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY_LLAMA, make_spec_file, write_texts
from tune_helpers import Surface, synthetic_spec

from trainfit.cli import main
from trainfit.errors import TrainfitError
from trainfit.tune.options import TuneOptions
from trainfit.tune import tune
from trainfit.tune.budgets import parse_budgets, rejudged, tune_budgets

BUDGETS = [40.0, 30.0, 24.0, 16.0]


def test_the_budgets_are_parsed_largest_first_and_bad_lists_are_refused() -> None:
    assert parse_budgets("8,24,12,8") == [24.0, 12.0, 8.0]
    for bad in ("8", "8,x", "8,-2", ""):
        with pytest.raises(TrainfitError, match="--budgets"):
            parse_budgets(bad)


def test_a_measurement_is_judged_again_against_a_smaller_budget() -> None:
    from trainfit.params import Params

    m = Surface(40.0)(Params(batch_size=8, lora_r=8), 0)  # 10 + 8 x 1.8 x 1.04 = 25 GiB
    assert m.fits and not rejudged(m, 24.0).fits and rejudged(m, 30.0).fits
    assert rejudged(m, 24.0).peak_memory_gb == m.peak_memory_gb and rejudged(m, 24.0).samples_per_second == m.samples_per_second


@pytest.mark.integration  # eight searches writing their outputs: ~4 s, past the fast tier's share
def test_the_matrix_picks_what_separate_tunes_pick_for_a_fraction_of_their_probes(tmp_path: Path) -> None:
    spec = synthetic_spec(tmp_path, "grid")
    surfaces: list[Surface] = []

    def make_probe(spec_b, folder):
        surfaces.append(Surface(spec_b.budget.memory_gb))  # OOMs past the budget's cap, as a real probe does
        return surfaces[-1]

    matrix, _ = tune_budgets(spec, BUDGETS, TuneOptions(output=tmp_path / "matrix"), make_probe=make_probe)
    assert [r.budget_gb for r in matrix.rows] == BUDGETS
    shared = sum(len(s.calls) for s in surfaces)
    assert shared == matrix.probes and matrix.rows[0].reused == 0 and all(r.reused > 0 for r in matrix.rows[1:])

    separate = 0
    for row in matrix.rows:
        import dataclasses

        alone = Surface(row.budget_gb)
        spec_b = dataclasses.replace(spec, budget=dataclasses.replace(spec.budget, memory_gb=row.budget_gb))
        result = tune(spec_b, TuneOptions(output=tmp_path / f"alone-{row.budget_gb:g}", probe_fn=alone))
        separate += len(alone.calls)
        best = result.summary.best_config
        assert best is not None and row.searched == best.searched, row.budget_gb  # the same pick
        assert row.peak_gb is not None and row.peak_gb + 2.0 <= row.budget_gb  # it fits its budget
    assert shared <= 0.4 * separate, (shared, separate)
    written = json.loads((tmp_path / "matrix" / "budgets.json").read_text())
    assert [r["budget_gb"] for r in written["rows"]] == BUDGETS
    assert (tmp_path / "matrix" / "budget-16gb" / "summary.json").is_file()
    summary = json.loads((tmp_path / "matrix" / "summary.json").read_text())
    assert [r["budget_gb"] for r in summary["budget_matrix"]] == BUDGETS  # the largest budget's summary holds it
    page = (tmp_path / "matrix" / "report.html").read_text()
    assert page.count("<h3>Budget matrix") == 1 and all(f"<td>{b:g} GiB</td>" in page for b in BUDGETS)


@pytest.mark.integration
def test_a_matrix_of_real_probes_takes_what_the_largest_budget_measured(tmp_path: Path, capsys) -> None:
    data = tmp_path / "train.jsonl"
    write_texts(data, n=40)
    spec = make_spec_file(tmp_path, model={"config": {**TINY_LLAMA, "vocab_size": 256}},
                          data={"path": str(data), "text_field": "text"}, params={"max_length": 64},
                          budget={"headroom_gb": 0.0})
    spec.write_text(spec.read_text() + "search:\n  batch_size: [1, 2]\n")
    out = tmp_path / "out"
    assert main(["tune", str(spec), "--budgets", "8,6", "--strategy", "grid", "--output", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    matrix = json.loads((out / "budgets.json").read_text())["rows"]
    assert [(r["budget_gb"], r["probed"], r["reused"]) for r in matrix] == [(8.0, 2, 0), (6.0, 0, 2)]
    assert matrix[0]["searched"] == matrix[1]["searched"] and matrix[1]["command"]  # both fit: the same pick
    assert "BUDGET MATRIX" in printed and "2 probes in all" in printed
    for folder in (out, out / "budget-6gb"):  # --strategy went into the spec each search ran, and its summary says so
        assert json.loads((folder / "summary.json").read_text())["spec"]["tune"]["strategy"] == "grid"
    assert main(["tune", str(spec), "--budgets", "8,6", "--memory-gb", "4", "--output", str(tmp_path / "x")]) == 2
    assert "drop --memory-gb" in capsys.readouterr().err
