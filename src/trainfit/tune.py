"""``tune``: the search (``trainfit.search``) with the outputs it leaves behind (``trainfit.report``),
as one call: what ``trainfit tune`` runs and what a script imports."""

from __future__ import annotations

import dataclasses
from typing import Any

from trainfit.errors import SpecError
from trainfit.report import write_outputs
from trainfit.search.tune import TuneResult, run_search
from trainfit.space import default_space
from trainfit.spec import Spec


def with_default_search(spec: Spec) -> Spec:
    """``spec`` itself when it has a ``search:`` section, else with the default one (see
    :func:`trainfit.space.default_space`) and its target effective batch."""
    if spec.search is not None and spec.search.dims:
        return spec
    space, problems = default_space(spec.params, spec.search.target_effective_batch if spec.search else None,
                                    constraints=[c.text for c in spec.search.constraints] if spec.search else (),
                                    allow_custom=spec.model.factory is not None)
    if problems:
        raise SpecError(problems, source=spec.source or "spec")
    return dataclasses.replace(spec, search=space,
                               tune=dataclasses.replace(spec.tune, target_effective_batch=space.target_effective_batch))


def tune(spec: Spec, **options: Any) -> TuneResult:
    """Search ``spec.search`` (without one: batch sizes and gradient checkpointing, see
    :func:`with_default_search`) for the fastest configuration that fits ``spec.budget`` and write
    summary.json, trials.csv, report.html and train_command.sh to ``output``. ``options`` are
    those of :func:`trainfit.search.tune.run_search` (``output`` is required; ``resume``,
    ``storage``, ``strategy``, ``max_trials``, ``time_budget_s``, ``quick``, ``refine``, ``on_event``...).

    Example::

        import trainfit
        spec = trainfit.load_spec("examples/tiny-llama.yaml")
        result = trainfit.tune(spec, output="runs/a", quick=True)
        print(result.summary.best_config)
    """
    return run_search(with_default_search(spec), outputs=write_outputs, **options)
