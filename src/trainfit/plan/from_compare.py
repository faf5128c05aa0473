"""A compare winner carried on to the real run (``plan --from-compare DIR [--config NAME]``).

``trainfit compare`` finds which config learns best: its learning rate, schedule, LoRA rank. The
tune found the fastest way to train each config it measured. A plan from a compare winner keeps
both. It chooses among the configs the tune measured that learn as the winner did, and trains them
with the winner's training values:

- the knobs that change what is learned (``Knob.changes_learning``, and a factory's own keys) must
  be the winner's, from the comparison's spec with the config's settings over it;
- the effective batch must be the winner's, since its learning rate was found at that batch;
- the speed knobs (batch split, checkpointing, attention...) are free.

It reads ``compare.json`` as a record of its own (this tier does not import compare): its
``configs`` as written, its ``ranking`` (best first) and its spec.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainfit.errors import TrainfitError
from trainfit.json_record import Record
from trainfit.params import KNOBS, Params
from trainfit.plan.inputs import Candidate, TuneRun
from trainfit.spec import load_spec, parse_override
from trainfit.spec.training import TRAINING_KEYS, TrainValues

COMPARE_FILE = "compare.json"


@dataclass(frozen=True, kw_only=True)
class Winner(Record):
    """The compare config a plan carries on (``plan.json``'s ``from_compare``)."""

    compare_dir: str
    name: str
    chosen: str
    """Why this config: ``best`` (the comparison's ranking), ``named`` (``--config``) or ``final``
    (one of ``train --top N``'s, trained whatever the plan chose)."""
    training: dict[str, Any]
    """Its training values as the comparison trained it (``--set`` ones under its own)."""
    learned: dict[str, Any]
    """Every knob that changes what is learned, at its value: the plan's config keeps them."""
    effective_batch: int
    """The samples an optimizer step trained on: the plan's config keeps it."""

    def values(self, base: TrainValues) -> TrainValues:
        """Its training values over ``base`` (the tune's ``train:`` section)."""
        return base.over(self.training)

    def learns_as(self, c: Candidate) -> bool:
        return c.samples_per_step == self.effective_batch and all(c.config.get(k) == v for k, v in self.learned.items())

    def line(self) -> str:
        """What the plan rests on, in words."""
        values = ", ".join(f"{k}={v}" for k, v in self.training.items()) or "the spec's train: section"
        shown = [f"{k}={v}" for k, v in self.learned.items() if k in ("lora_r", "max_length") or k not in KNOBS]
        return (f"learns as compare's {self.name} ({'its best' if self.chosen == 'best' else 'named'}, "
                f"{self.compare_dir}): among the tune's configs, those with all its knobs that change what is learned "
                f"({', '.join(shown)}...) and its effective batch {self.effective_batch}; trained with {values}")


def read_winner(compare_dir: str | Path, name: str | None = None) -> Winner:
    """The config ``name`` of the comparison in ``compare_dir``, else its best; a clear error where
    the folder holds no comparison, names no such config, or ranks none."""
    folder = Path(compare_dir)
    raw = _compare_json(folder)
    configs, ranking = raw.get("configs") or {}, raw.get("ranking")
    if name is not None and name not in configs:
        raise TrainfitError(f"{folder} compared no config named {name!r}", f"name one of {', '.join(configs)}")
    if name is None and not ranking:
        why = "ranks none (written before compare ranked its configs)" if ranking is None else "has no config that finished"
        raise TrainfitError(f"the comparison in {folder} {why}", f"name a config with --config ({', '.join(configs)})")
    chosen = name or str(ranking[0])  # type: ignore[index]  # refused above where there is no ranking
    if chosen not in configs:
        raise TrainfitError(f"{folder / COMPARE_FILE} ranks {chosen!r}, a config it does not hold (a damaged record)",
                            "resume the comparison (compare --resume) to write it again, or name one with --config")
    given = dict(configs[chosen] or {})
    training_set = {_key(o): parse_override(o)[1] for o in raw.get("overrides", []) if _key(o) in TRAINING_KEYS}
    params = _params(folder, raw, {k: v for k, v in given.items() if k not in TRAINING_KEYS})
    learned = {k: v for k, v in params.to_dict().items() if k not in KNOBS or KNOBS[k].changes_learning}
    return Winner(compare_dir=str(folder.resolve()), name=chosen, chosen="named" if name else "best",
                  training={**training_set, **{k: v for k, v in given.items() if k in TRAINING_KEYS}},
                  learned=learned, effective_batch=params.effective_batch_size)


def _key(override: str) -> str:
    """A ``--set`` override's key as written (compare takes a training value by its bare name)."""
    return override.partition("=")[0].strip()


def _compare_json(folder: Path) -> dict[str, Any]:
    path = folder / COMPARE_FILE
    if not path.is_file():
        raise TrainfitError(f"{folder} holds no {COMPARE_FILE}", "give the output folder of `trainfit compare`")
    try:
        raw = json.loads(path.read_bytes())
    except ValueError as err:
        raise TrainfitError(f"cannot read {path}: {err}", "resume the comparison (compare --resume) to write it again")
    if not isinstance(raw, dict) or not isinstance(raw.get("configs"), dict):
        raise TrainfitError(f"{path} is not a comparison's record", "give the output folder of `trainfit compare`")
    return raw


def _params(folder: Path, raw: Mapping[str, Any], knobs: Mapping[str, Any]) -> Params:
    """The config's every knob: the comparison's spec (with its ``--set`` knobs) and the config's over it."""
    overrides = [o for o in raw.get("overrides", []) if _key(o) not in TRAINING_KEYS]
    path = Path(str(raw.get("spec", "")))
    try:
        changed = hashlib.sha256(path.read_bytes()).hexdigest() != raw.get("spec_sha256")
        spec = load_spec(path, overrides)
    except (TrainfitError, OSError) as err:
        raise TrainfitError(f"the comparison in {folder} was run on the spec {path}, which cannot be read now: {err}",
                            "restore the spec at its path, or compare again") from None
    if changed:  # its knobs now are not those the configs trained over
        raise TrainfitError(f"the spec {path} has changed since the comparison in {folder} ran on it",
                            "restore it as it was, or compare again")
    return spec.params.replace(**knobs)


def keep_learned(run: TuneRun, winner: Winner) -> TuneRun:
    """``run`` with only the configs that learn as ``winner`` does; a clear error, naming what differs,
    where the tune measured none."""
    kept = [c for c in run.candidates if winner.learns_as(c)]
    if kept:
        return dataclasses.replace(run, candidates=kept)
    wanted = {**winner.learned, "effective batch": winner.effective_batch}
    seen: dict[str, set[str]] = {}
    for c in run.candidates:
        for key, value in {**c.config, "effective batch": c.samples_per_step}.items():
            seen.setdefault(key, set()).add(json.dumps(value))
    differ = [f"{k}={json.dumps(v)} (the tune measured {', '.join(sorted(seen.get(k, {'none'})))})"
              for k, v in wanted.items() if k == "effective batch" and float(v) not in {float(x) for x in seen[k]}
              or k != "effective batch" and json.dumps(v) not in seen.get(k, set())]
    raise TrainfitError(
        f"the tune in {run.folder} measured no config that learns as compare's {winner.name} does: "
        + ("; ".join(differ) if differ else "no one config has all of its values"),
        f"tune with those values fixed (params:, and tune.target_effective_batch: {winner.effective_batch}), "
        "or name another config with --config")

