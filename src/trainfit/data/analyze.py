"""Count and summarize in one call, from CLI flags or from a spec's ``data`` section."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainfit.data.lengths import count_lengths
from trainfit.data.row_length import LengthRecipe
from trainfit.data.stats import LengthStats, summarize
from trainfit.spec import Spec
from trainfit.spec.model_config import load_config, max_positions_of


def recipe_for_spec(spec: Spec) -> LengthRecipe:
    assert spec.data is not None
    d = spec.data
    text = d.text_field
    fields = (text,) if isinstance(text, str) else tuple(text or ())
    if not (fields or d.messages_field or d.length_field or d.audio_field):
        fields = ("text",)
    return LengthRecipe(text_fields=fields, messages_field=d.messages_field, length_field=d.length_field,
                        audio_field=d.audio_field, length_scale=d.length_scale, tokenizer=spec.tokenizer,
                        length_by=d.length_by)


def model_max_positions(spec: Spec) -> int | None:
    """The model's position limit when it can be read without building the model."""
    if spec.model.factory is not None:
        return None

    return max_positions_of(load_config(spec.model))


def analyze_spec(spec: Spec, *, progress: bool = True, cache_dir: Path | None = None,
                 batch_size: int | None = None, **summary_options: Any) -> LengthStats:
    """Length statistics of ``spec.data`` (cached), for probing, search and planning.
    ``summary_options`` go to :func:`~trainfit.data.stats.summarize` (percentile, multiple, top)."""
    assert spec.data is not None
    table = count_lengths(spec.data.path, recipe_for_spec(spec), fmt=spec.data.format,
                          on_bad_row=spec.data.on_bad_row, cache_dir=cache_dir, progress=progress)
    return summarize(table, batch_size=batch_size or spec.params.batch_size,
                     max_positions=model_max_positions(spec), **summary_options)
