"""What one row's length is: a numeric field, or the tokens of its text fields or chat messages
(through the spec's tokenizer, or regex word pieces without one), and why a row has none."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainfit.data.audio import audio_seconds
from trainfit.errors import TrainfitError
from trainfit.spec import LENGTH_BY


BAD = -1  # length recorded for a row that could not be read


_WORDS = re.compile(r"\w+|[^\w\s]")


FALLBACK_DESCRIPTION = ("no tokenizer given: lengths are regex word pieces (runs of letters/digits and "
                        "single punctuation marks), an approximation of a subword tokenizer's count; "
                        "give a tokenizer (--tokenizer; in a spec, tokenizer:) for exact counts")


@dataclass(frozen=True, kw_only=True)
class LengthRecipe:
    """How one row's length is obtained."""

    text_fields: tuple[str, ...] = ()
    messages_field: str | None = None
    length_field: str | None = None
    audio_field: str | None = None
    """A field naming each sample's audio file: its duration, read from the file's header, is the
    length (times ``length_scale``, the frames a second). A relative path is relative to ``audio_root``."""
    length_scale: float = 1.0
    tokenizer: str | None = None
    audio_root: str | None = None
    """The folder relative audio paths start at: the dataset file's."""
    length_by: str = "sum"
    """With text and an audio field both: which length drives memory, so is the sample's length:
    ``sum`` (text tokens and audio frames in one sequence, as a TTS language model holds them),
    ``max`` (the longer of the two), ``text`` or ``audio``. Both stay in ``LengthTable.parts``."""

    def __post_init__(self) -> None:
        text = bool(self.text_fields or self.messages_field)
        given = sum(bool(x) for x in (self.text_fields, self.messages_field, self.length_field, self.audio_field))
        if given != 1 and not (given == 2 and text and self.audio_field):
            raise TrainfitError("say how long a sample is: give one of a text field, a messages field, "
                                "a length field or an audio field (or text and an audio field together)",
                                "e.g. --text-field text, --length-field duration_s or --audio-field path")
        if self.length_by not in LENGTH_BY:
            raise TrainfitError(f"length_by {self.length_by!r} is not one of {', '.join(LENGTH_BY)}",
                                "sum: text tokens and audio frames in one sequence; max: the longer")

    @property
    def combined(self) -> bool:
        """A sample's length is made of its text's tokens and its audio's frames (:attr:`length_by`)."""
        return bool(self.audio_field and (self.text_fields or self.messages_field))

    def parts(self) -> dict[str, LengthRecipe]:
        """A combined recipe's two, each counted (and cached) on its own: ``text`` and ``audio``."""
        return {"text": dataclasses.replace(self, audio_field=None, audio_root=None),
                "audio": dataclasses.replace(self, text_fields=(), messages_field=None, tokenizer=None)}

    @property
    def fields(self) -> list[str]:
        if self.combined:
            return [*self.parts()["text"].fields, *self.parts()["audio"].fields]
        return list(self.text_fields) or [self.messages_field or self.length_field or self.audio_field]  # type: ignore[list-item]

    @property
    def counted(self) -> bool:
        """Each row's length is read from the row (a number or an audio file's header), not tokenized."""
        return bool(self.length_field or self.audio_field) and not self.combined

    @property
    def approximate(self) -> bool:
        """Text counted without a tokenizer (regex word pieces), not as training will count it."""
        return not self.counted and not self.tokenizer

    def describe(self) -> str:
        if self.combined:
            how = {"sum": "the sum", "max": "the longer"}.get(self.length_by, f"the {self.length_by} part")
            return f"{how} of {self.parts()['text'].describe()} and {self.parts()['audio'].describe()}"
        if self.audio_field:
            return (f"the duration of the audio file in {self.audio_field!r} (its header) x {self.length_scale:g} "
                    "frames a second, rounded up")
        if self.length_field:
            scale = f" x {self.length_scale:g}" if self.length_scale != 1 else ""
            return f"numeric field {self.length_field!r}{scale}, rounded up to whole positions"
        what = f"chat messages in {self.messages_field!r}" if self.messages_field else \
            f"text in {', '.join(map(repr, self.text_fields))}"
        how = f"tokenized with {self.tokenizer}" if self.tokenizer else FALLBACK_DESCRIPTION
        return f"{what}, {how}"


class Tokenizer:
    """A uniform ``count(texts) -> lengths`` over tokenizers, transformers or the fallback."""

    def __init__(self, path: str | None, need_chat: bool) -> None:
        self.path = path
        self.fast = None  # tokenizers.Tokenizer
        self.hf = None  # transformers tokenizer, for chat templates
        self.chat_note: str | None = None
        if path is None:
            return
        p = Path(path)
        tok_json = p if p.is_file() else p / "tokenizer.json"
        if tok_json.is_file():
            from tokenizers import Tokenizer

            try:
                self.fast = Tokenizer.from_file(str(tok_json))
            except Exception as err:  # a corrupt or foreign file
                raise TrainfitError(f"cannot load tokenizer {tok_json}: {err}") from None
        if p.is_dir() and (need_chat or self.fast is None):
            from transformers import AutoTokenizer

            try:
                self.hf = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
            except Exception as err:
                raise TrainfitError(f"cannot load tokenizer folder {p}: {err}",
                                    "give a folder saved with tokenizer.save_pretrained (in a spec, `tokenizer:`; "
                                    "without it, a model folder's own tokenizer is used)") from None
        if self.fast is None and self.hf is None:
            raise TrainfitError(f"{path} is not a tokenizer", "give a tokenizer folder or a tokenizer.json file")
        if need_chat and (self.hf is None or not getattr(self.hf, "chat_template", None)):
            self.chat_note = "the tokenizer has no chat template: messages rendered as 'role: content' lines"

    def count(self, texts: list[str], add_special_tokens: bool = True) -> list[int]:
        if self.fast is None and self.hf is None:
            return [len(_WORDS.findall(t)) for t in texts]
        return [len(ids) for ids in self.encode(texts, add_special_tokens)]

    def encode(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Each text's token ids (a tokenizer is needed: word pieces have no ids)."""
        if self.fast is not None:
            return [e.ids for e in self.fast.encode_batch(texts, add_special_tokens=add_special_tokens)]
        assert self.hf is not None, "encode needs a tokenizer"
        return list(self.hf(texts, add_special_tokens=add_special_tokens)["input_ids"])

    def adds_special_tokens(self, recipe: LengthRecipe) -> bool:
        """Whether the row's text is tokenized with the tokenizer's special tokens: not a chat the
        template rendered (which holds them already)."""
        return not recipe.messages_field or self.chat_note is not None

    def render_chat(self, messages: list[dict[str, Any]]) -> str:
        """The messages as the chat template renders them; a ValueError (a bad row) where the
        template refuses them (its ``raise_exception``: roles that do not alternate, say)."""
        if self.hf is not None and not self.chat_note:
            from jinja2 import TemplateError

            try:
                # tokenize=False returns the text; transformers annotates the union of every mode's result.
                return self.hf.apply_chat_template(messages, tokenize=False)  # type: ignore[return-value]
            except TemplateError as err:
                raise ValueError(f"the chat template refused the messages: {err}") from None
        return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in messages)


def _row_value(row: dict[str, Any], name: str) -> Any:
    if name in row:
        return row[name]
    raise KeyError(name)


def _null(names: list[str] | tuple[str, ...]) -> ValueError:
    """A present but null field (JSON null, a missing Parquet value) holds no sample: the row is
    bad, not a sample of length 0."""
    return ValueError(f"{', '.join(map(repr, names))} {'is' if len(names) == 1 else 'are'} null")


def field_length(row: dict[str, Any], recipe: LengthRecipe) -> tuple[int, Any]:
    """A row's length from its numeric field, or from the duration of the audio file its audio
    field names (scaled, rounded up), and the field's value."""
    name = recipe.length_field or recipe.audio_field
    assert name is not None
    value = _row_value(row, name)
    if value is None:
        raise _null([name])
    if recipe.audio_field:
        if not isinstance(value, str) or not value:
            raise TypeError(f"{name!r} holds {_shown(value)}, not the path of an audio file")
        path = Path(value) if recipe.audio_root is None else Path(recipe.audio_root) / value  # an absolute value wins
        return int(np.ceil(audio_seconds(path) * recipe.length_scale)), value
    return int(np.ceil(float(value) * recipe.length_scale)), value


def row_text(row: dict[str, Any], recipe: LengthRecipe, tokenizer: Tokenizer | None) -> str:
    """The text a row's length is counted on: its chat messages rendered, or its text fields joined."""
    if recipe.messages_field:
        messages = _row_value(row, recipe.messages_field)
        if messages is None:
            raise _null([recipe.messages_field])
        _check_messages(recipe.messages_field, messages)
        return tokenizer.render_chat(messages)  # type: ignore[union-attr]
    parts = [_row_value(row, f) for f in recipe.text_fields]
    if all(p is None for p in parts):  # one null part of several joins as empty
        raise _null(recipe.text_fields)
    for name, part in zip(recipe.text_fields, parts, strict=True):
        if part is not None and not isinstance(part, str):  # 42 would count as the text "42"
            raise TypeError(f"{name!r} holds {_shown(part)}, not text")
    return "\n".join(p or "" for p in parts)


def _shown(value: Any) -> str:
    """``int 42``, ``list ['x', 'y']``: a value's type and a short view of it, for a bad row's reason."""
    import reprlib

    return f"{type(value).__name__} {reprlib.repr(value)}"


def _check_messages(name: str, messages: Any) -> None:
    """A messages field must be a list of messages, each an object whose ``content`` is text, a
    list of parts (text and images) or null (a tool call's turn): anything else is a bad row, where
    a string among them crashed the count and a number was rendered as its digits."""
    if not isinstance(messages, list):
        raise TypeError(f"{name!r} is not a list of messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise TypeError(f"{name!r} item {i} is {_shown(message)}, not a message ({{role, content}})")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise TypeError(f"{name!r} item {i} has content {_shown(content)}, not text, a list of parts or null")

