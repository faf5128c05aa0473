"""``trainfit compare``: train a handful of named configs for K steps each on the real data, with
the same seed and data order, and compare their loss curves, speed and memory; then suggest the
next round.

Each config trains in its own process (:mod:`trainfit.compare.child`), in its own folder
(``OUTPUT/configs/NAME``: a config's name never reaches the comparison's own files), on the
trainers ``trainfit train`` uses; that process dies with the comparison. ``compare.json`` is
rewritten after each config, so an interrupted comparison resumes (``--resume``) with the configs
not yet done; a damaged one is rebuilt from the configs' folders. The output folder is held while
a comparison runs (:func:`~trainfit.files.held_folder`): a second one into it is refused. The
suggestions (:mod:`trainfit.compare.suggest`) come with their evidence and a ``next_configs.yaml``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from trainfit.compare.configs import NamedConfig, read_configs, split_training
from trainfit.compare.jobs import CONFIGS, ConfigJobs, as_job_json, measured_run, recorded_jobs, with_changes
from trainfit.compare.report import write_report
from trainfit.compare.runs import MEASURED, ConfigRun, Suggestion
from trainfit.compare.shared import SharedConfigs
from trainfit.compare.suggest import standing, suggest
from trainfit.data.holdout import hold_out
from trainfit.devices import resolve_device_name
from trainfit.errors import TrainfitError
from trainfit.files import held_folder, set_aside, write_atomically
from trainfit.json_record import Record, check_schema
from trainfit.plan.eval_pass import EvalSchedule, eval_set
from trainfit.search.reconnect import outage_line
from trainfit.spec import Spec, load_spec

SCHEMA_VERSION = 1


__all__ = ["Comparison", "compare"]


@dataclass(frozen=True, kw_only=True)
class Comparison(Record):
    """``compare.json``: what was compared, how, each config's run, and the suggestions."""

    schema_version: int = SCHEMA_VERSION
    created_at: str
    spec: str
    spec_sha256: str
    """The spec file's contents, hashed: a resume with an edited spec is another comparison."""
    overrides: list[str]
    steps: int
    minutes: float | None
    """A cap on each config's training time (its steps', evaluations left out); None: the steps decide."""
    seed: int
    evaluation: EvalSchedule | None
    target_loss: float | None
    holdout: int | None = None
    """Rows of the spec's data held out as the eval set (``--holdout``); None: none held out."""
    holdout_sha256: str | None = None
    """The held-out rows' file, hashed: a resume (or another machine of a ``--storage`` comparison)
    with other rows is another comparison."""
    device: str
    configs: dict[str, dict[str, Any]]
    """Each config as written, in the file's order."""
    runs: dict[str, ConfigRun] = field(default_factory=dict)
    """The configs trained so far."""
    suggestions: list[Suggestion] = field(default_factory=list)
    ranking: list[str] = field(default_factory=list)
    """The configs that finished, best first (:func:`~trainfit.compare.suggest.standing`): what
    ``plan --from-compare`` and ``train --from-compare`` carry on."""

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Comparison:  # type: ignore[override]
        check_schema(raw, SCHEMA_VERSION, "compare.json", "compare again into a new --output")
        return super().from_json(raw)

    def setup(self) -> dict[str, Any]:
        """What a resumed comparison must share with this one."""
        evaluation = self.evaluation.to_json() if self.evaluation else None
        if evaluation is not None and self.holdout is not None:  # the rows' hash says it: the path is this output's
            evaluation.pop("path")
        return {"spec": self.spec, "spec contents (sha256)": self.spec_sha256, "--set": self.overrides,
                "steps": self.steps, "minutes": self.minutes, "seed": self.seed, "evaluation": evaluation,
                "target_loss": self.target_loss, "holdout": self.holdout, "held-out rows (sha256)": self.holdout_sha256}


def compare(spec_path: str | Path, configs_path: str | Path, *, steps: int, output: str | Path,
            overrides: Sequence[str] = (), eval_data: str | Path | None = None, eval_every: int | None = None,
            eval_batch_size: int | None = None, target_loss: float | None = None, resume: bool = False,
            storage: str | None = None, minutes: float | None = None, holdout: int | None = None,
            say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> Comparison:
    """Train each config of ``configs_path`` for ``steps`` optimizer steps on ``spec_path``'s model
    and data (see the module) into ``output``; ``eval_data`` is evaluated every ``eval_every``
    steps (default: 5 times in the run). ``minutes``: stop each config after this much training
    time too (the same time for each; ``steps`` is still the schedule's length). ``storage``: a database URL shared with other machines
    running the same comparison, which split the configs between them
    (:mod:`trainfit.compare.shared`). ``holdout``: hold out this many rows of the data (drawn with
    the spec's seed) as the eval set, the configs training on the rest (:mod:`trainfit.data.holdout`)."""
    training, spec_overrides = split_training(overrides)
    spec = load_spec(spec_path, spec_overrides)
    configs = read_configs(configs_path, spec, defaults=training)
    check_can_compare(spec, steps)
    output = Path(output).resolve()
    with _only_comparison(output, resume) as lock:
        split = None if holdout is None else _split(spec, holdout, eval_data, output)
        if split is not None:
            eval_path: Path | None = output / HOLDOUT / "heldout.jsonl"  # where the split is moved once accepted
        else:
            eval_path = None if eval_data is None else eval_set(eval_data)
        evaluation = None if eval_path is None else EvalSchedule(
            path=str(eval_path), every=eval_every or math.ceil(steps / 5), batch_size=eval_batch_size or spec.params.batch_size)
        try:
            state = _start(spec, configs, steps, output, evaluation, target_loss, resume, say, list(overrides), minutes,
                           holdout, split[1] if split else None)
        except BaseException:
            if split is not None:
                shutil.rmtree(split[0], ignore_errors=True)
            raise
        trained_on = list(spec_overrides)
        if split is not None:  # accepted: the split replaces the folder's
            shutil.rmtree(output / HOLDOUT, ignore_errors=True)
            split[0].rename(output / HOLDOUT)
            trained_on += [f"data.path={output / HOLDOUT / 'train.jsonl'}", "data.format=jsonl"]
            spec = load_spec(spec_path, trained_on)
        jobs = ConfigJobs(spec, spec_path, trained_on, output, evaluation, steps, minutes, comparison=state.setup(),
                     lock=lock)
        if storage is not None:
            state = _shared(state, storage, configs, jobs, output, say)
        for i, config in enumerate(configs, 1):
            if config.name in state.runs:
                continue
            say(f"[{i}/{len(configs)}] {config.name}: {steps} steps of {_settings(config)}")
            run = jobs.run(config)
            state = with_changes(state, runs={**state.runs, config.name: run})
            _write(output, state)  # kept before it is said: an interrupt after the line loses nothing
            say(f"[{i}/{len(configs)}] {config.name}: {run.status}" + (f" ({run.error})" if run.error else ""))
        suggestions = suggest(state.configs, state.runs, target_loss, steps, spec.params.to_dict())
        state = with_changes(state, suggestions=suggestions, ranking=standing(state.configs, state.runs))
        _write(output, state)

        write_report(output, state)
        return state


def _only_comparison(output: Path, resume: bool) -> contextlib.AbstractContextManager[IO[str]]:
    """Hold ``output`` (:func:`~trainfit.files.held_folder`) for the whole comparison, its lock
    handed to each config's process (the folder stays held while one lives): a second comparison
    into it (a ``--resume`` while this one runs, say) is refused before it touches anything, where
    it would rewrite ``compare.json`` and start this one's configs over, deleting their folders."""
    if resume and not output.is_dir():  # a typo in --output, not a comparison cut short (that made its folder)
        raise TrainfitError(f"nothing to resume: {output} does not exist",
                            "drop --resume, or give the --output of the interrupted comparison")
    return held_folder(output, lambda holder: TrainfitError(
        f"{output} is in use by a running trainfit ({holder})",
        "wait for it to end (or stop it and --resume it), or give a new --output"))


HOLDOUT = "holdout"
"""The folder of a comparison's held-out split (``--holdout``): ``train.jsonl`` and ``heldout.jsonl``."""


def _split(spec: Spec, n: int, eval_data: str | Path | None, output: Path) -> tuple[Path, str]:
    """The held-out split of ``spec``'s data, made in a folder beside the output's (it replaces
    the output's own once the comparison is accepted: a refused one leaves that as it was), and its
    held-out rows' sha256."""
    import hashlib
    import tempfile

    if eval_data is not None:
        raise TrainfitError("--holdout and --eval-data both give an eval set", "give one of them")
    assert spec.data is not None  # _check
    output.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f".{output.name}-holdout-", dir=output.parent))
    try:
        _, held = hold_out(spec.data.path, n, seed=spec.probe.seed, folder=folder, fmt=spec.data.format,
                           on_bad_row=spec.data.on_bad_row)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder, hashlib.sha256(held.read_bytes()).hexdigest()


def check_can_compare(spec: Spec, steps: int) -> None:
    """Refuse, before anything trains, a step count below 1 or a spec without data."""
    if steps < 1:
        raise TrainfitError(f"--steps {steps}: each config trains at least 1 step", "e.g. --steps 200")
    if spec.data is None:
        raise TrainfitError("compare trains on the spec's data, and the spec has none", "add data: {path: ...}")
    if spec.model.factory is None and not spec.uses_trl_sft:
        raise TrainfitError("compare trains a Hugging Face model with TRL's trainer; this spec trains with its "
                            "tune.command_template", "remove command_template from the spec for the comparison")


def _start(spec: Spec, configs: list[NamedConfig], steps: int, output: Path, evaluation: EvalSchedule | None,
           target_loss: float | None, resume: bool, say: Callable[[str], None], overrides: list[str],
           minutes: float | None = None, holdout: int | None = None, holdout_sha256: str | None = None) -> Comparison:
    import hashlib

    source = Path(spec.source or "spec").resolve()
    now = Comparison(created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                     spec=str(source), spec_sha256=hashlib.sha256(source.read_bytes()).hexdigest(),
                     overrides=overrides, steps=steps, minutes=minutes, seed=spec.probe.seed,
                     evaluation=evaluation, target_loss=target_loss, device=resolve_device_name(spec.probe.device),
                     configs={c.name: c.given for c in configs}, holdout=holdout, holdout_sha256=holdout_sha256)
    path = output / "compare.json"
    if not path.exists():
        if resume:
            say(f"trainfit: {output} holds no comparison yet: starting one")
        output.mkdir(parents=True, exist_ok=True)
        return now
    if not resume:
        raise TrainfitError(f"{output} already holds a comparison (compare.json)",
                            "finish it with --resume, or give a new --output")
    try:
        before = _recorded(path)
    except ValueError as damage:
        return _rebuilt(now, output, f"{path} cannot be read ({damage})", say)
    _refuse_other_settings(output, before.setup(), now.setup())
    kept = {n: r for n, r in before.runs.items()
            if now.configs.get(n) == before.configs.get(n) and r.status in MEASURED}
    for name in sorted(set(before.runs) - set(kept)):
        why = "did not finish" if now.configs.get(name) == before.configs.get(name) else "changed in the configs file"
        say(f"trainfit: {name} {why}: training it again")
    if kept:
        say(f"trainfit: resuming: {', '.join(kept)} done, kept")
    return with_changes(now, runs=kept)


def _recorded(path: Path) -> Comparison:
    """``compare.json`` as written; a :class:`ValueError` saying why where it is damaged (cut off,
    edited, not a comparison's). One of another schema version is no damage (a newer trainfit's):
    its :class:`TrainfitError` says so."""
    try:
        raw = json.loads(path.read_text())
    except ValueError as err:  # UnicodeDecodeError is one
        raise ValueError(f"not JSON: {err}") from None
    if isinstance(raw, dict) and isinstance(raw.get("schema_version"), int):
        check_schema(raw, SCHEMA_VERSION, "compare.json", "compare again into a new --output")
    try:
        return Comparison.from_json(raw)
    except (TrainfitError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(getattr(err, "message", None) or f"{type(err).__name__}: {err}") from None


def _refuse_other_settings(output: Path, before: dict[str, Any], now: dict[str, Any]) -> None:
    """Refuse a resume whose setup (:meth:`Comparison.setup`) is not the one ``output`` was
    compared with, naming what differs: its runs would not compare with the new ones."""
    changed = [f"{k}: {before.get(k)} -> {v}" for k, v in now.items() if before.get(k) != v]
    if changed:
        raise TrainfitError(f"{output} compared with other settings; what differs:\n  " + "\n  ".join(changed),
                            "resume with the same spec and flags, or compare into a new --output")


def _rebuilt(now: Comparison, output: Path, damage: str, say: Callable[[str], None]) -> Comparison:
    """A resumed comparison whose ``compare.json`` is damaged (``damage`` says how), rebuilt from
    its configs' folders. Only this folder's own comparison can have written them, so a setup their
    ``job.json`` records other than the resume's is a changed setting, refused as an intact file's
    is (before anything is moved or deleted). A config's measured run is kept where its ``job.json``
    says it trained the config as the configs file has it now; one edited since, or not done, trains
    again. The damaged file is set aside (:func:`~trainfit.files.set_aside`)."""
    setup = as_job_json(now.setup())
    jobs = recorded_jobs(output)
    for job in jobs.values():
        _refuse_other_settings(output, job["comparison"], setup)
    runs: dict[str, ConfigRun] = {}
    for name, given in now.configs.items():
        run = measured_run(output / CONFIGS / name, name)
        if name not in jobs or run is None:
            continue  # not trained, cut short, or damaged too: it trains again
        if jobs[name].get("given") != as_job_json(given):
            say(f"trainfit: {name} changed in the configs file: training it again")
        else:
            runs[name] = run
    aside = set_aside(output / "compare.json")
    say(f"trainfit: {damage}; rebuilt from the configs' results: {', '.join(runs) or 'none kept'} "
        f"(the damaged file is kept as {aside})")
    return with_changes(now, runs=runs)


def _shared(state: Comparison, url: str, configs: list[NamedConfig], jobs: ConfigJobs, output: Path,
            say: Callable[[str], None]) -> Comparison:
    """Train the configs this machine claims in the shared storage, then wait for the ones other
    machines train (a dead machine's config is given back and claimed again); the comparison
    ends with every machine's runs."""
    import hashlib

    key = json.dumps({**state.setup(), "configs": state.configs}, sort_keys=True, default=str)
    shared = SharedConfigs(url, "trainfit-compare-" + hashlib.sha256(key.encode()).hexdigest()[:12],
                           [c.name for c in configs], on_outage=lambda event: say(outage_line(event)))
    by_name = {c.name: c for c in configs}
    waiting_for: list[str] = []
    while True:
        claimed = shared.claim()
        if claimed is not None:
            trial, name = claimed
            say(f"{name}: claimed in the shared storage; {state.steps} steps of {_settings(by_name[name])}")
            with shared.training(trial):
                run = jobs.run(by_name[name])
            shared.finish(trial, run, name)
            say(f"{name}: {run.status}" + (f" ({run.error})" if run.error else ""))
        state = with_changes(state, runs={n: r for n, r in sorted(shared.runs().items(), key=lambda kv: list(by_name).index(
            kv[0]))})
        _write(output, state)
        busy = shared.elsewhere()
        if claimed is None and not busy:
            return state
        if claimed is None:
            if busy != waiting_for:
                say(f"waiting for {', '.join(busy)}: training on other machines")
                waiting_for = busy
            shared.wait()


def _settings(config: NamedConfig) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.given.items()) or "the spec's params"


def _write(output: Path, state: Comparison) -> None:
    write_atomically(output / "compare.json", json.dumps(state.to_json(), indent=2) + "\n")

