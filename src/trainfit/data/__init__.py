"""Know the data: stream any dataset, count sample lengths, summarize them for probing and planning."""

from trainfit.data.lengths import LengthRecipe, LengthTable, count_lengths
from trainfit.data.stats import LengthStats, summarize

__all__ = ["LengthRecipe", "LengthStats", "LengthTable", "count_lengths", "summarize"]
