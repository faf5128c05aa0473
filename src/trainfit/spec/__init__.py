"""The user's YAML spec plus ``--set`` overrides, validated into one frozen :class:`Spec`.

Precedence is CLI > file > defaults, merged by :func:`merge_overrides` (pure). Validation collects
every problem before raising one :class:`~trainfit.errors.SpecError`, so a user sees all of them
at once. Relative paths are resolved against the spec file's folder.

The rooms: ``sections`` (the dataclasses), ``yaml_input`` (the YAML and ``--set``), ``fields``
(types and bounds), ``rules`` (what the training command can run), ``build`` (all of it, in order).
"""

from __future__ import annotations

from trainfit.spec.build import RUN_LIMITS, build_spec, load_spec, model_folder_tokenizer, with_tune
from trainfit.spec.rules import unused_lora_note
from trainfit.spec.sections import (
    LENGTH_BY,
    MAX_MEMORY_GB,
    MAX_SEED,
    OBJECTIVES,
    STRATEGIES,
    Budget,
    DataSpec,
    GiB,
    ModelSpec,
    ProbeSettings,
    Spec,
    TuneSettings,
    is_trl_command,
)
from trainfit.spec.yaml_input import load_yaml, merge_overrides, parse_override

__all__ = ["Budget", "DataSpec", "GiB", "LENGTH_BY", "MAX_MEMORY_GB", "MAX_SEED", "ModelSpec", "OBJECTIVES", "ProbeSettings",
           "RUN_LIMITS", "STRATEGIES", "Spec", "TuneSettings", "build_spec", "is_trl_command", "load_spec", "load_yaml",
           "merge_overrides", "model_folder_tokenizer", "parse_override", "unused_lora_note", "with_tune"]
