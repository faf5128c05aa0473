"""Search for the fastest configuration that fits: space, strategies, persistent study, loop."""

from trainfit.search.space import SearchSpace
from trainfit.search.tune import TuneResult, tune

__all__ = ["SearchSpace", "TuneResult", "tune"]
