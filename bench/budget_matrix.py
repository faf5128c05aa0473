"""What a budget matrix costs against a tune per budget (issue 21): probes spent, and whether each
budget gets the same pick.

`trainfit tune --budgets` over the bundled tiny Llama (its default search space, at most
--max-trials probes per search), with real probes under real CPU memory caps; then one separate
`trainfit tune` per budget, same options. Budgets in GiB, headroom 0 (on this CPU a probe's
resident peak is 0.5-1 GiB, so small budgets bind).

    python bench/budget_matrix.py [--budgets 1.2,1.0,0.9,0.8] [--max-trials 8]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import dump  # noqa: E402
from trainfit.tune.options import TuneOptions
from trainfit.spec import with_tune

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    from trainfit.tune.budgets import parse_budgets, tune_budgets
    from trainfit.spec import load_spec
    from trainfit.tune import tune, with_default_search

    ap = argparse.ArgumentParser()
    ap.add_argument("--budgets", default="1.2,1.0,0.9,0.8")
    ap.add_argument("--max-trials", type=int, default=8)
    args = ap.parse_args()
    budgets = parse_budgets(args.budgets)
    spec = with_default_search(load_spec(ROOT / "examples" / "tiny-llama.yaml", ["budget.headroom_gb=0"]))
    work = Path(tempfile.mkdtemp(prefix="budget-matrix-"))
    start = time.perf_counter()
    matrix, _ = tune_budgets(with_tune(spec, max_trials=args.max_trials), budgets, TuneOptions(output=work / "matrix"))
    matrix_s = time.perf_counter() - start
    rows = {}
    separate_probes = 0
    separate_s = 0.0
    for row in matrix.rows:
        spec_b = dataclasses.replace(spec, budget=dataclasses.replace(spec.budget, memory_gb=row.budget_gb))
        start = time.perf_counter()
        alone = tune(with_tune(spec_b, max_trials=args.max_trials),
                     TuneOptions(output=work / f"alone-{row.budget_gb:g}",
                                                                    calibrate_steps=0))
        separate_s += time.perf_counter() - start
        separate_probes += alone.new_trials
        best = alone.summary.best_config
        rows[f"{row.budget_gb:g}"] = {
            "matrix": {"searched": row.searched, "samples_per_second": row.samples_per_second, "peak_gb": row.peak_gb,
                       "probed": row.probed, "reused": row.reused},
            "alone": {"searched": best.searched if best else None,
                      "samples_per_second": best.samples_per_second if best else None,
                      "peak_gb": best.memory_peak_gb if best else None, "probed": alone.new_trials},
            "same_pick": (best.searched if best else None) == row.searched}
        print(f"{row.budget_gb:g} GiB: matrix {row.searched} ({row.probed} probed, {row.reused} taken); alone "
              f"{best.searched if best else None} ({alone.new_trials} probed)", file=sys.stderr, flush=True)
    dump("budget_matrix", {"budgets": budgets, "max_trials": args.max_trials, "matrix_probes": matrix.probes,
                           "separate_probes": separate_probes, "ratio": matrix.probes / separate_probes,
                           "matrix_s": matrix_s, "separate_s": separate_s, "rows": rows})


if __name__ == "__main__":
    main()
