"""The search space: which knobs vary and over what values, plus constraints.

Written in the spec under ``search:`` with the same keys as ``params``: a list is a set of
choices, ``{low, high, log, step}`` a range. Everything not searched keeps its ``params`` value.
"""

from __future__ import annotations

import difflib
import itertools
import json
import math
import operator
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainfit.devices import loader_worker_candidates
from trainfit.errors import Problem
from trainfit.params import KNOBS, Params, check_knob, split_modules

_OPS: dict[str, Callable[[Any, Any], Any]] = {
    ">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt, "<": operator.lt}
_CONSTRAINT = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(>=|<=|==|!=|>|<)\s*(.+?)\s*$")
_INVALID = object()
"""What a value check returns for a value it reported as a problem."""


@dataclass(frozen=True)
class Dimension:
    """One searched knob: explicit choices, or an int/float range."""

    name: str
    choices: tuple[Any, ...] = ()
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None

    @property
    def is_range(self) -> bool:
        return not self.choices

    def grid_values(self) -> tuple[Any, ...]:
        """The values a grid visits: the choices, or a few points across the range."""
        if self.choices:
            return self.choices
        assert self.low is not None and self.high is not None
        integer = isinstance(self.low, int) and isinstance(self.high, int)
        if integer and self.log:
            values = {int(self.low), int(self.high)}
            p = 1
            while p <= self.high:
                if p >= self.low:
                    values.add(p)
                p *= 2
            return tuple(sorted(values))
        if integer:
            steps = range(int(self.low), int(self.high) + 1, int(self.step or 1))  # a range: never a list of them all
            if len(steps) > 8:
                return tuple(sorted({steps[round(i * (len(steps) - 1) / 7)] for i in range(8)}))
            return tuple(steps)
        if self.log:
            lo, hi = math.log(self.low), math.log(self.high)
            return tuple(math.exp(lo + i * (hi - lo) / 4) for i in range(5))
        return tuple(self.low + i * (self.high - self.low) / 4 for i in range(5))

    def distribution(self) -> Any:
        import optuna

        if self.choices:
            return optuna.distributions.CategoricalDistribution(list(self.choices))
        assert self.low is not None and self.high is not None  # a range (see parse_space)
        if isinstance(self.low, int) and isinstance(self.high, int):
            return optuna.distributions.IntDistribution(int(self.low), int(self.high), log=self.log,
                                                        step=int(self.step or 1))
        return optuna.distributions.FloatDistribution(float(self.low), float(self.high), log=self.log,
                                                      step=self.step)


@dataclass(frozen=True)
class Constraint:
    knob: str
    op: str
    value: Any
    text: str

    def holds(self, config: Mapping[str, Any]) -> bool:
        actual = config.get(self.knob)
        if actual is None and self.op not in ("==", "!="):
            return False
        try:
            return bool(_OPS[self.op](actual, self.value))
        except TypeError:
            return False


@dataclass(frozen=True)
class SearchSpace:
    """Searched dimensions over a base configuration."""

    base: Params
    dims: tuple[Dimension, ...]
    constraints: tuple[Constraint, ...] = ()
    target_effective_batch: int | None = None
    """When set, gradient accumulation = round(target / batch_size), so configs compare at one effective batch."""

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.dims]

    def dim(self, name: str) -> Dimension | None:
        return next((d for d in self.dims if d.name == name), None)

    def allowed(self, values: Mapping[str, Any]) -> bool:
        config = {**self.base.to_dict(), **values}
        return all(c.holds(config) for c in self.constraints)

    def grid(self) -> Iterator[dict[str, Any]]:
        """Every combination of grid values that satisfies the constraints, in a fixed order."""
        for combo in itertools.product(*(d.grid_values() for d in self.dims)):
            values = dict(zip(self.names, combo))
            if self.allowed(values):
                yield values

    def grid_size(self) -> int:
        return sum(1 for _ in self.grid())

    def params(self, values: Mapping[str, Any]) -> Params:
        """The full configuration for searched ``values``: base + values + derived accumulation."""
        changes = dict(values)
        for name, value in values.items():
            if name in KNOBS and KNOBS[name].kind == "modules" and isinstance(value, str):
                changes[name] = split_modules(value)
        params = self.base.replace(**changes)
        if self.target_effective_batch is not None:  # over every process: each takes batch_size a micro-batch
            per_micro_batch = params.batch_size * params.processes
            params = params.replace(gradient_accumulation_steps=max(1, round(self.target_effective_batch
                                                                             / per_micro_batch)))
        return params

    def distributions(self) -> dict[str, Any]:
        return {d.name: d.distribution() for d in self.dims}


def parse_constraint(text: str) -> Constraint | Problem:
    m = _CONSTRAINT.match(text)
    if not m:
        return Problem("tune.constraints", f"{text!r} is not 'knob OP value'", "e.g. 'lora_r >= 16'")
    import yaml

    knob, op, raw = m.groups()
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return Problem("tune.constraints", f"{text!r}: cannot read the value {raw.strip()!r}",
                       "e.g. 'lora_r >= 16' or \"precision != 'fp32'\"")
    return Constraint(knob=knob, op=op, value=value, text=text.strip())


def did_you_mean(name: Any, known: Iterable[str]) -> str | None:
    """``did you mean 'x'?`` with the name of ``known`` closest to ``name``; None when none is close."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"did you mean {close[0]!r}?" if close else None


def _choice_value(name: str, value: Any, key: str, problems: list[Problem]) -> Any:
    """One choice of a searched knob in the form its dimension holds (``_INVALID`` with a problem added)."""
    if name not in KNOBS:
        return value  # a custom knob: any value
    if (p := check_knob(name, value, key)) is not None:
        problems.append(p)
        return _INVALID
    if KNOBS[name].kind == "choice" and value is False:
        return "off"
    if KNOBS[name].kind == "modules" and isinstance(value, list):
        return ",".join(value)  # Optuna choices are scalars; split again in params()
    return value


def _choices_dimension(name: str, spec: list[Any], key: str, problems: list[Problem]) -> Dimension | None:
    """``knob: [choices]``: a dimension of the choices that are valid values of the knob."""
    if not spec:
        problems.append(Problem(key, "needs at least one choice"))
        return None
    values = [_choice_value(name, v, key, problems) for v in spec]
    return Dimension(name, choices=tuple(v for v in values if v is not _INVALID))


def _is_finite_number(value: Any) -> bool:
    """A real number (not a bool), neither infinite nor NaN."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _range_dimension(name: str, spec: Mapping[str, Any], key: str, problems: list[Problem]) -> Dimension | None:
    """``knob: {low, high, log, step}``: a numeric range whose ends are valid values of the knob."""
    if set(spec) - {"low", "high", "log", "step"} or "low" not in spec or "high" not in spec:
        problems.append(Problem(key, "a range is {low, high} with optional log and step",
                                "e.g. batch_size: {low: 1, high: 64, log: true}"))
        return None
    low, high = spec["low"], spec["high"]
    if not (_is_finite_number(low) and _is_finite_number(high)) or low > high:
        problems.append(Problem(key, f"low {low!r} and high {high!r} must be finite numbers with low <= high"))
        return None
    if name in KNOBS and KNOBS[name].kind not in ("int", "float"):
        problems.append(Problem(key, f"{name} is not numeric: give a list of choices"))
        return None
    for v in (low, high):
        if name in KNOBS and (p := check_knob(name, v, key)) is not None:
            problems.append(p)
    if spec.get("log") and low <= 0:
        problems.append(Problem(key, "a log range needs low > 0"))
    step = spec.get("step")
    if step is not None and not (_is_finite_number(step) and step > 0):
        problems.append(Problem(key, f"step {step!r} must be a number > 0"))
        return None
    return Dimension(name, low=low, high=high, log=bool(spec.get("log", False)), step=step)


def _dimension(name: Any, spec: Any, allow_custom: bool, problems: list[Problem]) -> Dimension | None:
    """One entry of ``search:`` (a list of choices or a range); None when it is wrong."""
    key = f"search.{name}"
    if name not in KNOBS and not allow_custom:
        problems.append(Problem(key, "unknown knob", did_you_mean(name, KNOBS)))
        return None
    if spec == "auto" and name == "num_workers":
        return Dimension(name, choices=tuple(loader_worker_candidates()))
    if isinstance(spec, list):
        return _choices_dimension(name, spec, key, problems)
    if isinstance(spec, Mapping):
        return _range_dimension(name, spec, key, problems)
    problems.append(Problem(key, "expected a list of choices or a {low, high} range"
                            + (", or auto (this machine's cores and memory)" if name == "num_workers" else "")))
    return None


def _constraints(texts: Sequence[str], known: set[str], problems: list[Problem]) -> list[Constraint]:
    """``tune.constraints`` parsed; each must name a ``known`` knob."""
    parsed: list[Constraint] = []
    for text in texts:
        c = parse_constraint(text)
        if isinstance(c, Problem):
            problems.append(c)
        elif c.knob not in known:
            problems.append(Problem("tune.constraints", f"{text!r} names unknown knob {c.knob!r}"))
        else:
            parsed.append(c)
    return parsed


def parse_space(raw: Mapping[str, Any] | None, base: Params, *, allow_custom: bool,
                constraints: Sequence[str] = (), target_effective_batch: int | None = None
                ) -> tuple[SearchSpace, list[Problem]]:
    """Validate the ``search:`` section against the knobs; collect every problem."""
    problems: list[Problem] = []
    dims = [d for name, spec in (raw or {}).items()
            if (d := _dimension(name, spec, allow_custom, problems)) is not None]
    if target_effective_batch is not None and any(d.name == "gradient_accumulation_steps" for d in dims):
        problems.append(Problem("search.gradient_accumulation_steps",
                                "is derived from tune.target_effective_batch; do not search it too",
                                "drop one of the two"))
    parsed = _constraints(constraints, set(KNOBS) | {d.name for d in dims} | set(base.extra), problems)
    space = SearchSpace(base=base, dims=tuple(dims), constraints=tuple(parsed),
                        target_effective_batch=target_effective_batch)
    if not problems and dims and space.grid_size() == 0:
        problems.append(Problem("tune.constraints", "no configuration of the search space satisfies them"))
    return space, problems


DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


def default_batch_sizes(target_effective_batch: int, processes: int = 1) -> list[int]:
    """The default search's batch sizes: for each of :data:`DEFAULT_BATCH_SIZES`, the largest
    batch at or below it whose micro-batch over ``processes`` divides the effective batch, so each
    keeps it exactly with a whole accumulation (a target of 32: the powers of two up to 32; of 24:
    1, 2, 4, 8, 12, 24; of 200: 1, 2, 4, 8, 10, 25, 50, 100). A target no batch over the processes
    divides: the powers of two up to its share, the accumulation rounded."""
    share, rest = divmod(target_effective_batch, processes)
    if rest or not share:
        return [b for b in DEFAULT_BATCH_SIZES if b * processes <= target_effective_batch] or [1]
    divisors = [d for d in range(1, min(share, DEFAULT_BATCH_SIZES[-1]) + 1) if share % d == 0]
    return sorted({max(d for d in divisors if d <= p) for p in DEFAULT_BATCH_SIZES})


OPEN_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
"""The default search's batch sizes where the spec leaves the batch open (``Spec.batch_open``): the
powers of two to 1024, climbed by ``auto`` to what fits (at any integer past the grid's last fit) or
until the speed saturates."""


def default_batch_choices(base: Params, target_effective_batch: int | None, open_batch: bool = False) -> list[int]:
    """The default search's batch sizes: :data:`OPEN_BATCH_SIZES` for an open batch, else
    :func:`default_batch_sizes` of the target (``target_effective_batch``, else the spec's
    ``batch_size x gradient_accumulation_steps`` over its processes)."""
    if open_batch:
        return list(OPEN_BATCH_SIZES)
    return default_batch_sizes(target_effective_batch or base.effective_batch_size, base.processes)


def default_space(base: Params, target_effective_batch: int | None = None, *, constraints: Sequence[str] = (),
                  allow_custom: bool = False, liger: bool = False, grouping: bool = False,
                  open_batch: bool = False) -> tuple[SearchSpace, list[Problem]]:
    """What ``tune`` searches when the spec has no ``search:`` section: batch sizes (see
    :func:`default_batch_choices`) and gradient checkpointing, with gradient accumulation derived so
    every config trains with one effective batch (``tune.target_effective_batch``, else the spec's
    ``batch_size x gradient_accumulation_steps``); with ``liger`` (a trainer that takes
    ``use_liger_kernel``) the spec's loss and ``loss: liger`` too; with ``grouping`` (a trainer that
    takes ``group_by_length``, on data padded heavily) length-grouped batches beside random ones. No
    knob of these changes what is learned: the answer is the fastest way to train what the spec
    describes. With ``open_batch`` (a spec that states no batch, ``Spec.batch_open``) no effective
    batch is kept: each batch size trains at the spec's accumulation, so the effective batch is the
    search's pick, flagged as changing what is learned."""
    target = None if open_batch else target_effective_batch or base.effective_batch_size
    knobs: dict[str, list[Any]] = {"batch_size": default_batch_choices(base, target, open_batch),
                                   "gradient_checkpointing": [False, True]}
    if liger and base.loss != "liger":
        knobs["loss"] = [base.loss, "liger"]
    if grouping and not base.group_by_length:
        knobs["group_by_length"] = [False, True]
    return parse_space(knobs, base, allow_custom=allow_custom, constraints=constraints,
                       target_effective_batch=target)


MAX_SPAN = 4096
"""Past this many integers between two batch sizes the bisection visits a subset (64 points)."""


def integers_between(space: SearchSpace, low: int, high: int, processes: int = 1) -> list[int]:
    """The batch sizes ``auto`` may probe strictly between ``low`` and ``high``, past the grid:
    integers within the searched span (its choices' lowest to highest, or its range), and where
    ``tune.target_effective_batch`` derives the accumulation only those whose micro-batch over
    ``processes`` divides it, so every config keeps what is learned exactly (the accumulation is
    derived by rounding)."""
    dim = space.dim("batch_size")
    if dim is None:
        return []
    step = 1
    if dim.choices:
        if not all(isinstance(c, int) and not isinstance(c, bool) for c in dim.choices):
            return []
        lo, hi = min(dim.choices), max(dim.choices)
    else:
        lo, hi, step = int(dim.low or 1), int(dim.high or 1), int(dim.step or 1)  # a range keeps its step
    first, last = max(low + 1, lo), min(high - 1, hi)
    first = lo + -(-(first - lo) // step) * step  # the first point of the range's step at or above it
    if first > last:
        return []
    target = space.target_effective_batch
    if target is not None:
        return [b for b in range(first, min(last, target // processes) + 1, step) if target % (b * processes) == 0]
    points = range(first, last + 1, step)
    if len(points) <= MAX_SPAN:
        return list(points)
    return sorted({points[(len(points) - 1) * k // 64] for k in range(65)})


EFFECTIVE_BATCH = "effective_batch_size"


def learning_knobs(space: SearchSpace) -> list[str]:
    """Searched knobs whose values train a different model (custom knobs count: we cannot tell),
    and the effective batch where configs differ in it: no ``tune.target_effective_batch`` while the
    batch size, the accumulation or the processes are searched, or a target that a micro-batch over
    every process of some config of the grid already passes (the accumulation cannot go below 1;
    a target the batch sizes do not divide is kept to the nearest accumulation, as documented)."""
    knobs = [d.name for d in space.dims if d.name not in KNOBS or KNOBS[d.name].changes_learning]
    batch_knobs = {"batch_size", "gradient_accumulation_steps", "nproc_per_node", "nnodes"}
    searched = [d for d in space.dims if d.name in batch_knobs]
    if not searched:
        return knobs
    target = space.target_effective_batch
    if target is None or any(
            (p := space.params(dict(zip([d.name for d in searched], combo)))).batch_size * p.processes > target
            for combo in itertools.product(*(d.grid_values() for d in searched))):
        knobs.append(EFFECTIVE_BATCH)
    return knobs


def learning_value(space: SearchSpace, values: dict[str, Any], knob: str) -> Any:
    """A config's value of a :func:`learning_knobs` knob."""
    return space.params(values).effective_batch_size if knob == EFFECTIVE_BATCH else values.get(knob)


def learning_key(space: SearchSpace, values: Mapping[str, Any], knobs: Sequence[str]) -> str:
    """What ``values`` train, as one key: their values of ``knobs`` (of :func:`learning_knobs`), as JSON."""
    return json.dumps({k: learning_value(space, dict(values), k) for k in knobs}, sort_keys=True, default=list)
