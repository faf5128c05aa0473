"""Know the data: stream any dataset, count sample lengths, summarize them for probing and planning."""

from trainfit.data.lengths import LengthTable, count_lengths
from trainfit.data.row_length import LengthRecipe
from trainfit.data.stats import LengthStats, summarize

__all__ = ["LengthRecipe", "LengthStats", "LengthTable", "count_lengths", "summarize"]
