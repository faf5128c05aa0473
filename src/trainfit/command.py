"""The training command a user runs, built from the same ``Params`` the probe ran.

With ``tune.command_template`` the user's own trainer is launched. The template is a bash command
line (``$VAR``, ``&&``, ``|`` and quotes stay the shell's) whose ``{knob}`` placeholders are filled
from the configuration (custom keys too, plus ``{effective_batch_size}`` and ``{epochs}``), e.g.::

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

Without one, Hugging Face models get a ``trl sft`` command (TRL's CLI over transformers'
TrainingArguments and peft), whose flags are mapped knob by knob below.
"""

from __future__ import annotations

import re
import shlex
import string
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from trainfit.errors import Problem, TrainfitError
from trainfit.params import Params
from trainfit.spec import Spec

_OPTIM = {"adamw": "adamw_torch", "adamw_fused": "adamw_torch_fused", "adamw_8bit": "adamw_bnb_8bit"}


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


TEMPLATE_EXTRAS = ("effective_batch_size", "epochs")
"""Placeholders besides the knobs: ``batch_size x gradient_accumulation_steps`` and ``tune.epochs``
(the epochs the runtime estimate is for)."""


def render_template(template: str, params: Params, epochs: float = 1.0, max_length: int | None = None) -> str:
    """The template filled with ``params`` by the rules in this module's docstring. ``max_length``:
    the length the probe truncated at (for ``{max_length}`` when the knob is null: the longest
    sample, not a dropped flag)."""
    values: dict[str, Any] = params.to_dict()
    values.update(effective_batch_size=params.effective_batch_size, epochs=float(epochs))
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


_LOADERS = {"jsonl": "json", "json": "json", "csv": "csv", "parquet": "parquet", "text": "text"}
"""``datasets`` loaders for the data formats trainfit reads (TSV and save_to_disk folders have none)."""


def is_trl_command(factory: str | None, command_template: str | None) -> bool:
    """Is the training command a ``trl sft`` one (no user template, a Hugging Face model)? Takes
    the two keys, so a spec being validated can ask too."""
    return not command_template and factory is None


def writes_trl(spec: Spec) -> bool:
    return is_trl_command(spec.model.factory, spec.tune.command_template)


def trl_data_config(spec: Spec) -> dict[str, Any] | None:
    """The ``datasets:`` section of a TRL config file that loads the spec's data file. TRL's
    ``--dataset_name`` takes Hub names and folders, not a file; None where no loader fits or the
    command is not a ``trl sft`` one."""
    if spec.data is None or not writes_trl(spec):
        return None
    from trainfit.data.readers import data_files, detect_format

    loader = _LOADERS.get(detect_format(Path(spec.data.path), spec.data.format))
    files = [str(f) for f in data_files(spec.data.path)]  # shards: the very files trainfit counted, in order
    return None if loader is None else {"datasets": [{"path": loader, "data_files": files[0] if len(files) == 1
                                                      else files}]}


def trl_args(params: Params, max_length: int | None = None, cpu: bool = False) -> list[str]:
    """TRL ``sft`` flags for every knob, each one explicit: TRL's own defaults differ from the
    probe's (bf16 on unless told, gradient checkpointing on, max_length 1024, fp32 LoRA base).
    ``max_length``: the length the probe truncated at (see ``LengthStats.truncation_length``: the
    dataset's longest sample when ``params.max_length`` is null, never past the model's positions);
    None: ``params.max_length``. ``cpu``: probed on a CPU, so the command trains on one too
    (``--use_cpu true``: transformers refuses bf16 without a GPU unless told), where TF32 does
    nothing and transformers refuses ``--tf32 true``."""
    args = ["--per_device_train_batch_size", str(params.batch_size),
            "--gradient_accumulation_steps", str(params.gradient_accumulation_steps)]
    max_length = max_length if max_length is not None else params.max_length
    if max_length is not None:
        args += ["--max_length", str(max_length)]
    if params.padding == "max_length" and max_length is not None:
        args += ["--pad_to_multiple_of", str(max_length)]
    half = params.precision in ("bf16", "fp16")
    # LoRA trains adapters over a frozen base held in the compute dtype; full fine-tuning keeps fp32 weights.
    dtype = {"bf16": "bfloat16", "fp16": "float16"}[params.precision] if half and params.lora_r else "float32"
    args += ["--bf16", _flag(params.precision == "bf16"), "--fp16", _flag(params.precision == "fp16"),
             "--dtype", dtype, "--tf32", _flag(params.tf32 and not cpu),
             "--gradient_checkpointing", _flag(params.gradient_checkpointing),
             "--attn_implementation", params.attention, "--optim", _OPTIM[params.optimizer]]
    if cpu:
        args += ["--use_cpu", "true"]
    if params.compile != "off":
        args += ["--torch_compile", "true"]
        if params.compile != "default":
            args += ["--torch_compile_mode", params.compile]
    if params.lora_r is not None:
        from trainfit.workloads.lora import trl_lora_args

        args += trl_lora_args(params)
    return args


def _flag(on: bool) -> str:
    return "true" if on else "false"


MODEL_PLACEHOLDER = "<a local model folder: this spec builds a random-init model from a config>"


def build_command(spec: Spec, params: Params, *, max_length: int | None = None, data_config: Path | None = None,
                  cpu_threads: int | None = None, model_dir: Path | None = None) -> str:
    """The command line for ``params``: the user's template, or ``trl sft`` for HF models (see
    :func:`trl_command`)."""
    if spec.tune.command_template:
        return render_template(spec.tune.command_template, params, spec.tune.epochs, max_length)
    return " ".join(shlex.quote(word) for word in trl_command(
        spec, params, max_length=max_length, data_config=data_config, cpu_threads=cpu_threads, model_dir=model_dir))


def trl_command(spec: Spec, params: Params, *, max_length: int | None = None, data_config: Path | None = None,
                cpu_threads: int | None = None, model_dir: Path | None = None) -> list[str]:
    """The ``trl sft`` command for ``params``, word by word (unquoted).
    ``data_config``: a TRL config file holding :func:`trl_data_config` (see ``write_outputs``).
    ``cpu_threads``: the threads a CPU probe ran with (None: not a CPU probe); ``trl sft`` starts
    ``accelerate launch``, which gives each process one CPU thread unless OMP_NUM_THREADS says
    otherwise (on the 2-vCPU test machine, one thread trained at about half the speed;
    docs/benchmarks.md). ``model_dir``: the random-init model of a ``config:`` spec, saved
    (``trainfit.workloads.hf.save_initial_model``)."""
    if spec.model.factory is not None:
        raise TrainfitError("a custom factory model needs tune.command_template to build its training command",
                            "e.g. command_template: 'python train.py --batch_size {batch_size} ...'")
    model = spec.model.path or (str(model_dir) if model_dir is not None else MODEL_PLACEHOLDER)
    if data_config is not None:
        data = ["--config", str(data_config)]
    else:
        data = ["--dataset_name", "<your dataset: a Hub name or a folder>" if spec.data is None
                else f"<{spec.data.path} as a Hub name or a folder>"]
    if spec.data is not None and isinstance(spec.data.text_field, str):
        data += ["--dataset_text_field", spec.data.text_field]
    threads = [f"OMP_NUM_THREADS={cpu_threads}"] if cpu_threads else []
    # TRL trains 3 epochs unless told: the command trains what the runtime estimate is for.
    return [*threads, "trl", "sft", "--model_name_or_path", model, *data,
            *trl_args(params, max_length, cpu=cpu_threads is not None),
            "--num_train_epochs", f"{spec.tune.epochs:g}", "--output_dir", "trainfit-run"]


def trl_problems(model: Mapping[str, Any] | None, tune: Mapping[str, Any] | None, params: Params | None,
                 space: Any) -> list[Problem]:
    """What a ``trl sft`` command cannot take, said when the spec is loaded rather than after the
    search: TRL's ``--lora_alpha`` is an integer, while the knob is a float (for trainers of one's
    own). ``model``, ``tune``: the spec's raw sections; ``space``: its ``SearchSpace``, if any."""
    if model is None or tune is None or params is None or not is_trl_command(model.get("factory"),
                                                                             tune.get("command_template")):
        return []
    dim = space.dim("lora_alpha") if space is not None else None
    if dim is not None and dim.is_range:  # a float range proposes fractions, however whole its ends
        floats = not (isinstance(dim.low, int) and isinstance(dim.high, int))
        what = f"a range of floats ({dim.low:g} to {dim.high:g})" if floats else None
    else:
        values = dim.choices if dim is not None else (params.lora_alpha,)
        what = ", ".join(f"{v:g}" for v in values if v is not None and not float(v).is_integer()) or None
    if what is None:
        return []
    key = "params.lora_alpha" if dim is None else "search.lora_alpha"
    return [Problem(key, f"{what}: not a whole number, and trl sft's --lora_alpha takes an integer",
                    "use whole numbers (e.g. 16; a range with integer ends), or a tune.command_template "
                    "for a trainer that takes a float")]


def command_notes(spec: Spec, model_dir: Path | None = None) -> list[str]:
    """What the generated ``trl sft`` command cannot express about the model or the data: say so in
    its script. ``model_dir``: as for :func:`trl_command`."""
    if not writes_trl(spec):
        return []
    notes = []
    if spec.model.path is None and model_dir is None:
        notes.append("this spec builds a random-init model from model.config: save it as a folder "
                     "(AutoModelForCausalLM.from_config(...).save_pretrained) and give it to --model_name_or_path")
    elif spec.model.path is None and spec.tokenizer is None:
        notes.append(f"{model_dir} holds no tokenizer (the spec names none: its lengths were counted approximately): "
                     "save the tokenizer you train with there (tokenizer.save_pretrained) before running")
    if spec.data is None:
        return notes
    if trl_data_config(spec) is None:
        notes.append(f"TRL cannot load {spec.data.path} as a file: save it as JSON lines, CSV or Parquet")
    if isinstance(spec.data.text_field, tuple):
        notes.append("TRL reads prompt/completion pairs from columns named 'prompt' and 'completion': "
                     f"rename {', '.join(spec.data.text_field)}")
    if spec.data.messages_field not in (None, "messages"):
        notes.append(f"TRL reads conversations from a column named 'messages': rename {spec.data.messages_field!r}")
    if spec.data.length_field is not None:
        notes.append("this spec gives lengths, not text: point the command at the text of the dataset")
    return notes


def command_script(spec: Spec, params: Params, header: str, *, max_length: int | None = None,
                   data_config: Path | None = None, cpu_threads: int | None = None,
                   model_dir: Path | None = None) -> str:
    """train_command.sh: ``header``, notes on what the command cannot express, then the command. A
    template is written as filled (its shell syntax intact); a ``trl sft`` command one flag per
    line, passing the script's own arguments on (``bash train_command.sh --max_steps 2``)."""
    template = spec.tune.command_template
    try:
        if template:
            body = render_template(template, params, spec.tune.epochs, max_length)
        else:
            words = trl_command(spec, params, max_length=max_length, data_config=data_config, cpu_threads=cpu_threads,
                                model_dir=model_dir)
            body = " \\\n    ".join([*_split_flags(words), '"$@"'])
    except TrainfitError as err:
        reason = str(err).replace("\n", "\n# ")
        return f"#!/usr/bin/env bash\n{header}\n# No command: {reason}\nexit 1\n"
    notes = command_notes(spec, model_dir)
    if not template:
        notes.append("arguments given to this script go to `trl sft` after the ones here (a later flag wins), "
                     "e.g. bash train_command.sh --max_steps 2 --output_dir /tmp/try")
        if cpu_threads:
            notes.append(f"OMP_NUM_THREADS={cpu_threads}: the CPU threads the probe used; `accelerate launch` "
                         "(which `trl sft` starts) would give the run one")
        if cpu_threads is not None:
            notes.append("--use_cpu true: the config was measured on a CPU, so it trains on one (transformers "
                         "refuses bf16 without a GPU unless told); on a GPU machine drop it and OMP_NUM_THREADS, "
                         "and probe there: speed and memory differ")
    lines = "".join(f"\n# note: {n}" for n in notes)
    return f"#!/usr/bin/env bash\n{header}{lines}\nset -euo pipefail\n{body}\n"


def _split_flags(words: list[str]) -> list[str]:
    """One flag and its values per line, quoted, for a readable script."""
    out: list[str] = []
    for word in words:
        quoted = shlex.quote(word)
        if word.startswith("--") or not out:
            out.append(quoted)
        else:
            out[-1] += " " + quoted
    return out
