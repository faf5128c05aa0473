"""Measure one configuration, isolated in a child process.

Its names are imported when first used: the probe worker imports modules of this package before
it forks (:mod:`trainfit.probe.supervisor`), which must not start numpy's threads first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

_LAZY = {
    "EXIT_CODES": "trainfit.probe.measurement",
    "Measurement": "trainfit.probe.measurement",
    "run_probe": "trainfit.probe.runner",
}

__all__ = ["EXIT_CODES", "Measurement", "run_probe"]

if TYPE_CHECKING:
    from trainfit.probe.measurement import EXIT_CODES, Measurement
    from trainfit.probe.runner import run_probe


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trainfit.probe' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
