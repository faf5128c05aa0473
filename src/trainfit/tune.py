"""``tune``: the search (``trainfit.search``) with the outputs it leaves behind (``trainfit.report``),
as one call: what ``trainfit tune`` runs and what a script imports."""

from __future__ import annotations

from typing import Any

from trainfit.report import write_outputs
from trainfit.search.tune import TuneResult, run_search
from trainfit.spec import Spec


def tune(spec: Spec, **options: Any) -> TuneResult:
    """Search ``spec.search`` for the fastest configuration that fits ``spec.budget`` and write
    summary.json, trials.csv, report.html and train_command.sh to ``output``. ``options`` are
    those of :func:`trainfit.search.tune.run_search` (``output`` is required; ``resume``,
    ``storage``, ``strategy``, ``max_trials``, ``time_budget_s``, ``quick``, ``refine``, ``on_event``...).

    Example::

        import trainfit
        spec = trainfit.load_spec("examples/tiny-llama.yaml")
        result = trainfit.tune(spec, output="runs/a", quick=True)
        print(result.summary["best_config"])
    """
    return run_search(spec, outputs=write_outputs, **options)
