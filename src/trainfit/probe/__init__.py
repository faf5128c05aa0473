"""Measure one configuration, isolated in a child process."""

from trainfit.probe.measurement import EXIT_CODES, Measurement
from trainfit.probe.runner import run_probe

__all__ = ["EXIT_CODES", "Measurement", "run_probe"]
