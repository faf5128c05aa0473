"""A ``tune.command_template`` filled with a configuration: the user's own trainer launched.

The template is a bash command
line (``$VAR``, ``&&``, ``|`` and quotes stay the shell's) whose ``{knob}`` placeholders are filled
from the configuration (custom keys too, plus ``{effective_batch_size}``, ``{epochs}``,
``{use_liger_kernel}`` and ``{max_steps}``), e.g.::

    python -m vibevoice.finetune.train_vibevoice --per_device_train_batch_size {batch_size}
        --gradient_accumulation_steps {gradient_accumulation_steps} --lora_r {lora_r}

The rules, so the trainer receives each value exactly as configured:

- a value is quoted once, for where its placeholder stands (bare, inside ``"..."`` or ``'...'``):
  spaces, quotes and ``$`` in it reach the trainer as written;
- a null knob drops its flag: ``--lora_r {lora_r}`` (or ``--lora_r={lora_r}``) vanishes whole
  for ``lora_r: null``, a bare ``{lora_r}`` too; inside a longer word or quotes a null is empty;
- a list is separate words (``--targets q_proj v_proj``, as argparse's ``nargs`` takes it), or one
  word joined by what follows a colon: ``{lora_target_modules:,}`` is ``q_proj,v_proj``;
- booleans are ``true``/``false`` and a whole float an integer (``lora_alpha: 16`` is ``16``);
  other numbers take a format spec after a colon (``{lora_dropout:.2f}``).
"""

from __future__ import annotations

import re
import shlex
import string
from collections.abc import Iterable, Mapping
from typing import Any

from trainfit.errors import TrainfitError
from trainfit.params import Params


def placeholders(template: str) -> set[str]:
    """The names a (valid) template's placeholders fill: ``{lora_r}`` and ``{lora_r:.2f}`` are both ``lora_r``."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def template_problem(template: str, names: Iterable[str]) -> str | None:
    """What is wrong with a command template that may use ``names`` (None when nothing is)."""
    names = list(names)
    try:
        pieces = list(string.Formatter().parse(template))
    except ValueError as err:
        return f"is not a valid template ({err}): placeholders are {{knob}}, a literal brace is {{{{ or }}}}"
    if any(name == "" for _, name, _, _ in pieces):
        return "has an empty placeholder {}: name a knob, e.g. {batch_size}"
    missing = [name for _, name, _, _ in pieces if name and name not in names]
    if missing:
        return f"uses unknown placeholders: {', '.join(missing)} (available: {', '.join(names)})"
    converted = [f"{{{name}!{conversion}}}" for _, name, _, conversion in pieces if conversion]
    if converted:
        return f"uses conversions trainfit does not apply: {', '.join(converted)} (drop the !r / !s / !a)"
    quote = _open_quote("".join(literal for literal, _, _, _ in pieces))
    if quote:
        return (f"has an unterminated {quote} quote: the template is a bash command line "
                "(a placeholder's value is quoted for you; quote around it only to join it with other text)")
    return None


TEMPLATE_EXTRAS = ("effective_batch_size", "epochs", "use_liger_kernel", "max_steps")
"""Placeholders besides the knobs: ``batch_size x gradient_accumulation_steps x processes``, ``tune.epochs``
(the epochs the runtime estimate is for), ``loss == liger`` (``true``/``false``, as a transformers
Trainer script takes ``--use_liger_kernel {use_liger_kernel}``) and ``max_steps``: null in the
written command (so ``--max_steps {max_steps}`` drops out and the trainer runs its epochs), a step
count where a calibration times a few real steps of the command."""


def render_template(template: str, params: Params, epochs: float = 1.0, max_length: int | None = None,
                    max_steps: int | None = None) -> str:
    """The template filled with ``params`` by the rules in this module's docstring. ``max_length``:
    the length the probe truncated at (for ``{max_length}`` when the knob is null: the longest
    sample, not a dropped flag). ``max_steps``: the optimizer steps to stop after (None: the flag
    of ``{max_steps}`` is dropped)."""
    values: dict[str, Any] = params.to_dict()
    values.update(effective_batch_size=params.effective_batch_size, epochs=float(epochs),
                  use_liger_kernel=params.loss == "liger", max_steps=max_steps)
    if max_length is not None:
        values["max_length"] = max_length
    problem = template_problem(template, values)
    if problem:
        raise TrainfitError(f"command_template {problem}", "fix tune.command_template")
    return _fill(list(string.Formatter().parse(template)), values)


_FLAG_BEFORE = re.compile(r"(?:^|(?<=\s))-{1,2}[A-Za-z][\w.-]*(?:=|(?:[ \t]|\\\n)+)$")
"""A flag word ending the text so far (``--lora_r `` or ``--lora_r=``): what a null value drops with it."""


def _fill(pieces: list[tuple[str, str | None, str | None, str | None]], values: Mapping[str, Any]) -> str:
    """The text of a parsed template with every placeholder filled. The quote state is read from
    the text written so far: a filled value never changes it, so the template's own quotes decide."""
    out = ""
    for i, (literal, name, spec, _) in enumerate(pieces):
        out += literal
        if name is None:
            continue
        value, quote = values[name], _open_quote(out)
        if value is None or value == ():
            if not quote:
                next_literal, next_name = pieces[i + 1][:2] if i + 1 < len(pieces) else ("", None)
                out = _without_null(out, None if not next_literal and next_name is not None else next_literal)
            continue
        try:
            out += _quoted(value, spec or "", quote)
        except ValueError as err:
            raise TrainfitError(f"command_template {{{name}:{spec}}}: {err} (value {value!r})",
                                "fix the format spec after the colon in tune.command_template") from None
    return out.strip()


def _without_null(out: str, after: str | None) -> str:
    """The text so far once a null placeholder is dropped: with its flag, when the placeholder is a
    word of its own (``after``: the template text after it; None where a placeholder follows at once).
    Inside a longer word a null is empty."""
    flag = _FLAG_BEFORE.search(out)
    starts = not out or out[-1].isspace() or (flag is not None and out.endswith("="))
    ends = after is not None and (after == "" or after[0].isspace() or after[0] in ";&|)")
    if not (starts and ends):
        return out
    return (out[:flag.start()] if flag else out).rstrip(" \t")


def _quoted(value: Any, spec: str, quote: str) -> str:
    """``value`` as shell text where ``quote`` is open: a list as separate words (bare) or joined by
    ``spec``; a number through the format ``spec``."""
    if isinstance(value, (list, tuple, str)):
        words = [value] if isinstance(value, str) else [_text(v) for v in value]
        if spec or quote or len(words) == 1:
            return _in_quote(spec.join(words) if spec else " ".join(words), quote)
        return " ".join(shlex.quote(w) for w in words)
    return _in_quote(format(value, spec) if spec else _text(value), quote)


def _text(value: Any) -> str:
    """A scalar as a trainer's command line takes it: ``true``/``false``, ``16`` for 16.0."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _in_quote(text: str, quote: str) -> str:
    """``text`` escaped for where ``quote`` (``'``, ``"`` or none) is open, so bash reads it back unchanged."""
    if quote == "'":
        return text.replace("'", "'\"'\"'")  # close, a double-quoted ', reopen
    if quote == '"':
        return re.sub(r'([\\"$`])', r"\\\1", text)
    return shlex.quote(text)


def _open_quote(text: str) -> str:
    """The quote bash holds open at the end of ``text``: ``'``, ``"`` or '' (none)."""
    quote, escaped = "", False
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote and ch == quote:
            quote = ""
        elif not quote and ch in "'\"":
            quote = ch
    return quote
