"""trainfit: find the fastest training configuration that fits in memory, by measurement.

Public API (heavy libraries such as torch are imported only when used)::

    import trainfit
    spec = trainfit.load_spec("examples/tiny-llama.yaml", ["batch_size=8"])
    m = trainfit.run_probe(spec)
    print(m.status, m.samples_per_second, m.peak_memory_bytes)
    from trainfit.tune import tune
    result = tune(spec, trainfit.TuneOptions(output="runs/a", quick=True))  # the fastest config that fits
    print(result.summary.best_config)                            # summary.json as a typed record
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# The workflows' entry points are their packages' own (``from trainfit.tune import tune``,
# ``from trainfit.train import train``): a name here that is also a subpackage's would turn into
# that module as soon as anything imports the subpackage (tests/test_spec.py keeps them apart).

_LAZY = {
    "Params": "trainfit.params",
    "Spec": "trainfit.spec",
    "load_spec": "trainfit.spec",
    "TrainfitError": "trainfit.errors",
    "SpecError": "trainfit.errors",
    "CustomWorkload": "trainfit.workloads.factory",
    "Measurement": "trainfit.probe.measurement",
    "run_probe": "trainfit.probe.runner",
    "LengthStats": "trainfit.data.stats",
    "LengthRecipe": "trainfit.data.row_length",
    "count_lengths": "trainfit.data.lengths",
    "summarize": "trainfit.data.stats",
    "TuneOptions": "trainfit.tune.options",
    "with_tune": "trainfit.spec",
    "TuneResult": "trainfit.tune.options",
    "Summary": "trainfit.summary",
    "OnTrackCallback": "trainfit.train.monitor",
    "TrainOptions": "trainfit.train.train_options",
}

__all__ = ["CustomWorkload", "LengthRecipe", "LengthStats", "Measurement", "OnTrackCallback", "Params", "Spec", "SpecError",
           "Summary", "TrainOptions", "TrainfitError", "TuneOptions", "TuneResult", "__version__", "count_lengths", "load_spec",
           "run_probe", "summarize", "with_tune"]

if TYPE_CHECKING:
    from trainfit.data.lengths import count_lengths
    from trainfit.data.row_length import LengthRecipe
    from trainfit.data.stats import LengthStats, summarize
    from trainfit.errors import SpecError, TrainfitError
    from trainfit.train.monitor import OnTrackCallback
    from trainfit.train.train_options import TrainOptions
    from trainfit.params import Params
    from trainfit.probe.measurement import Measurement
    from trainfit.probe.runner import run_probe
    from trainfit.spec import Spec, load_spec, with_tune
    from trainfit.summary import Summary
    from trainfit.tune.options import TuneOptions, TuneResult
    from trainfit.workloads.factory import CustomWorkload


WORKFLOWS = ("tune", "plan", "train", "compare", "ablate")
"""The workflow packages, imported on first use: ``import trainfit; trainfit.tune.tune(spec, options)``."""


def __getattr__(name: str) -> Any:
    import importlib

    if name in WORKFLOWS:
        return importlib.import_module(f"trainfit.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trainfit' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
