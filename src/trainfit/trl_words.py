"""A knob's ``trl sft`` words: how ``params.knob(trl=...)`` says which flags a value writes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

TrlWords = Callable[[Any], list[str]]
"""A knob's value to its ``trl sft`` words."""

WITH_OTHER_KNOBS = "written by trainer/command.trl_args with the knobs or facts its flags depend on"
"""A knob's ``trl=`` when its flags depend on more than its own value (the precision's weight dtype
on LoRA, the truncation length on the data, TF32 on the device...)."""


def bool_word(on: bool) -> str:
    """A bool as a trainer's flag takes it: ``true`` or ``false``."""
    return "true" if on else "false"


def word_value(word: str) -> Any:
    """A flag's word as JSON or YAML holds it: ``true``/``false`` as booleans, numbers as numbers."""
    if word in ("true", "false"):
        return word == "true"
    for kind in (int, float):
        try:
            return kind(word)
        except ValueError:
            continue
    return word


def trl_flag(flag: str) -> TrlWords:
    """``flag`` and the value (``true``/``false`` for a bool); nothing for null."""
    def words(value: Any) -> list[str]:
        if value is None:
            return []
        return [flag, bool_word(value) if isinstance(value, bool) else str(value)]
    return words


def trl_when_on(*flags: str) -> TrlWords:
    """``flags`` when the (bool) knob is on, nothing when off."""
    return lambda on: list(flags) if on else []


def trl_mapped(flag: str, names: Mapping[Any, str]) -> TrlWords:
    """``flag`` and the trainer's name of the value (``names[value]``)."""
    return lambda value: [flag, names[value]]


def trl_compile(mode: str) -> list[str]:
    """``--torch_compile`` for any mode but off, and the mode unless it is torch's default."""
    if mode == "off":
        return []
    return ["--torch_compile", "true", *(["--torch_compile_mode", mode] if mode != "default" else [])]
