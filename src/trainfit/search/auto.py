"""``auto``: the default strategy. Knob families in a device-aware prior order, each climbing its
batch sizes (past the grid, to the integer the memory allows) until a larger batch stops helping or
cannot win; memory-only knobs probed only where they can help (see docs/search.md)."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from trainfit.params import KNOBS, model_values
from trainfit.probe.measurement import BROKEN, recorded_budget_gb
from trainfit.search.layouts import same_but_layout, state_bytes_as
from trainfit.search.trials import Trial, can_run, config_key, unsupported_values
from trainfit.space import SearchSpace, integers_between

# Which value of a knob usually wins on each device type (each knob's declaration says, params.py):
# tried first, the rest later. A prior only orders the search; measurements decide.
_PRIOR: dict[str, dict[str, tuple[Any, ...]]] = {
    device: {k.name: k.prior[device] for k in KNOBS.values() if k.prior is not None} for device in ("cuda", "cpu")}


NO_PRIOR: dict[str, str] = {k.name: k.no_prior for k in KNOBS.values() if k.no_prior is not None}
"""The knobs without a device prior, and why (each knob's declaration has one or the other)."""


MEMORY_ONLY: dict[str, Any] = {k.name: True for k in KNOBS.values() if k.memory_only}
"""Knob values that only trade speed for memory (nothing learned changes; ``knob(memory_only=True)``):
worth a probe only at a batch the same config without them cannot fit (see :func:`trainfit.search.pruned.pruned`)."""


class AutoStrategy:
    """Uses the structure of the problem instead of treating it as a black box.

    The space splits into *families* (every knob but batch size). A family climbs its batch
    sizes one step at a time, which is cheap: the probe worker keeps the built model for growing
    batches; on a GPU, where each probe's phases cost seconds, it jumps from its first probe to
    the largest batch its memory line allows and checks the grid's step below (:meth:`_jump`). Peak memory grows about linearly with the batch size, so after two fitting probes a
    line predicts the largest batch that fits (with a safety margin); no probe is spent on a
    predicted OOM, and a measured OOM bounds the family from above. Throughput saturates with the
    batch size, so a family stops once a larger batch no longer helps or cannot beat the others.
    Families are visited in a device-aware prior order; a family is dropped when, at the same
    batch size, it is slower than the best family with the same learning-relevant knobs and uses
    no less memory (it cannot win by fitting a larger batch either).
    """

    name = "auto"

    def __init__(self, space: SearchSpace, budget_gb: float | None, headroom_gb: float, device_type: str,
                 margin: float = 0.05, saturation: float = 0.02) -> None:
        self.space = space
        self.budget_gb, self.headroom_gb = budget_gb, headroom_gb
        self.margin, self.saturation = margin, saturation
        self.jumps = device_type.startswith("cuda")
        """On a GPU a family's climb jumps from its first probe to the largest batch its memory line
        says fits (:meth:`_jump`); on a CPU it steps (a CPU's speed often falls at large batches, and a
        large batch's probe is slow there)."""
        bdim = space.dim("batch_size")
        self.batches = sorted(bdim.grid_values()) if bdim else [space.base.batch_size]
        others = [d for d in space.dims if d.name != "batch_size"]
        prior = _PRIOR["cuda" if device_type.startswith("cuda") else "cpu"]

        def rank(name: str, value: Any) -> int:
            order = prior.get(name)
            return order.index(value) if order and value in order else 0

        families = [dict(zip([d.name for d in others], combo))
                    for combo in itertools.product(*(d.grid_values() for d in others))]
        # Learning-relevant knobs keep the user's order (each value gets explored); speed knobs by prior.
        families.sort(key=lambda f: [rank(k, v) for k, v in f.items() if not self._learning(k)])
        self.families = [f for f in families if any(self.space.allowed({**f, "batch_size": b}) for b in self.batches)]

    @staticmethod
    def _learning(name: str) -> bool:
        knob = KNOBS.get(name)
        return knob is None or knob.changes_learning  # custom knobs may change the model too

    def _learning_part(self, family: Mapping[str, Any]) -> str:
        return config_key({k: v for k, v in family.items() if self._learning(k)})

    def family_trials(self, family: Mapping[str, Any], history: Sequence[Trial]) -> dict[int, Trial]:
        out = {}
        for t in history:
            if all(t.values.get(k) == v for k, v in family.items()):
                out[int(t.values.get("batch_size", self.space.base.batch_size))] = t
        return out

    def limit_bytes(self, measured: Iterable[Trial], margin: float | None = None) -> float | None:
        """The predicted peak a config may reach: the spec's budget, else the device's memory the
        probes recorded as theirs, less headroom and the margin (default: the strategy's)."""
        budget = self.budget_gb or recorded_budget_gb(t.measurement for t in measured)
        if not budget:
            return None
        return (budget - self.headroom_gb) * (1 - (self.margin if margin is None else margin)) * 1024**3

    @staticmethod
    def _slope(fits: dict[int, Trial]) -> float | None:
        """Peak bytes per extra sample, from the two largest fitting batches."""
        if len(fits) < 2:
            return None
        (b0, t0), (b1, t1) = sorted(fits.items())[-2:]
        return ((t1.measurement.peak_memory_bytes or 0) - (t0.measurement.peak_memory_bytes or 0)) / (b1 - b0)

    def _predicted_max_batch(self, fits: dict[int, Trial], sibling_slope: float | None = None,
                             margin: float | None = None) -> float:
        """Largest batch whose predicted peak stays under the budget (inf when unknown). With one
        point, the slope of sibling families (the other knobs changed) stands in for the line."""
        limit = self.limit_bytes(fits.values(), margin)
        slope = self._slope(fits) if len(fits) >= 2 else sibling_slope
        if limit is None or not fits or slope is None or slope <= 0:
            return float("inf")
        b1 = max(fits)
        return b1 + (limit - (fits[b1].measurement.peak_memory_bytes or 0)) / slope

    def _sibling_slope(self, family: Mapping[str, Any], history: Sequence[Trial]) -> float | None:
        slopes = []
        for other in self.families:
            if other != family:
                fits = {b: t for b, t in self.family_trials(other, history).items() if t.feasible}
                slope = self._slope(fits)
                if slope is not None and slope > 0:
                    slopes.append(slope)
        return statistics.median(slopes) if slopes else None

    def _dominated(self, family: Mapping[str, Any], mine: dict[int, Trial], history: Sequence[Trial]) -> bool:
        """After its first probe: is ``family`` slower at that batch than a rival with the same
        learning-relevant knobs (beyond the two probes' CIs and the saturation's tolerance), while
        using no less memory there, or than a rival that memory does not hold back (fitting a larger
        batch cannot make it win)? With two probes its own line says whether it can win
        (:meth:`_can_win`): a kernel with a large cost a step and a small one a sample loses at small
        batches and wins at large ones."""
        ok_mine = {b: t for b, t in mine.items() if t.objective is not None}
        if len(ok_mine) != 1:
            return False
        [(b, t)] = ok_mine.items()
        for other in self.families:
            if other == family or self._learning_part(other) != self._learning_part(family):
                continue
            theirs = self.family_trials(other, history).get(b)
            if theirs is None or theirs.objective is None or not theirs.feasible:
                continue
            noise = sum(x.measurement.step_time_ci95_rel or 0.0 for x in (t, theirs))
            slower = t.measured_objective * (1 + noise) < theirs.measured_objective * (1 - self.saturation)
            no_smaller = (t.measurement.peak_memory_bytes or 0) >= (theirs.measurement.peak_memory_bytes or 0) * 0.98
            if slower and (no_smaller or not self._memory_bound(other, history)):
                return True
        return False

    def _memory_bound(self, family: Mapping[str, Any], history: Sequence[Trial]) -> bool:
        """Does memory stop ``family`` below the largest batch (measured, or predicted)? If not, a
        leaner family cannot win by fitting a larger batch."""
        trials = self.family_trials(family, history)
        if any(not t.feasible for t in trials.values()):
            return True
        fits = {b: t for b, t in trials.items() if t.feasible}
        return self._predicted_max_batch(fits, self._sibling_slope(family, history)) < max(self.batches)

    def _can_win(self, fits: dict[int, Trial], batch: int, rival_best: float | None) -> bool:
        """Could a larger batch of this family beat ``rival_best``? Step time is about
        ``overhead + per_sample * batch``, so samples/s = b / (a + c*b) saturates at 1/c; fit a, c
        on the two largest fitting batches and predict ``batch`` (within ``saturation`` of the
        rival: the benefit of the doubt is the family's)."""
        if rival_best is None:
            return True
        (b0, t0), (b1, t1) = sorted(fits.items())[-2:]
        inv0, inv1 = 1 / t0.measured_objective, 1 / t1.measured_objective  # seconds per sample
        # 1/T(b) = a/b + c  ->  two equations in a, c
        a = (inv0 - inv1) / (1 / b0 - 1 / b1)
        c = inv1 - a / b1
        if c <= 0:
            return True  # grows without saturating: no basis to prune
        if a <= 0:  # a sample's time grows with the batch: the best measured is the most it reaches
            best = max(fits.values(), key=lambda t: t.measured_objective)
            noise = best.measurement.step_time_ci95_rel or 0.0
            return best.measured_objective * (1 + noise) > rival_best * (1 - self.saturation)
        return batch / (a + c * batch) > rival_best * (1 - self.saturation)

    def _next_batch(self, family: Mapping[str, Any], mine: dict[int, Trial],
                    rival_best: float | None = None, sibling_slope: float | None = None,
                    above: int = 0) -> int | None:
        """The family's next batch size, or None when it is done. ``above``: its batches up to this
        one are not worth a probe (a memory-only knob where the family without it fits them)."""
        allowed = [b for b in self.batches if b > above and self.space.allowed({**family, "batch_size": b})]
        if any(t.measurement.status in BROKEN for t in mine.values()):
            return None  # broken for a reason other than memory: do not spend more probes here
        bad = [b for b, t in mine.items() if not t.feasible]
        upper = min(bad) if bad else float("inf")
        fits = {b: t for b, t in mine.items() if t.feasible}
        open_ = [b for b in allowed if b < upper and b not in mine]
        if not fits:
            return min(open_) if open_ else None
        best_b = max(fits, key=lambda b: fits[b].objective or 0.0)
        largest = max(fits)
        if self._fell(fits):
            # Throughput fell at the larger batch: a peak may lie between. Worth a probe only if
            # this family could still beat the other families (its best is within 2% of theirs).
            if rival_best is not None and fits[best_b].measured_objective * (1 + self.saturation) < rival_best:
                return None
            between = [b for b in open_ if best_b < b < largest]
            return between[len(between) // 2] if between else None
        if self._saturated(fits):
            return None  # a larger batch is not faster
        jump = self._jump(family, mine, fits, upper, sibling_slope)
        if jump is not None:
            return jump
        if self.jumps and len(fits) == 2:
            # after a jump: the grid's step below it, where a speed that falls near the memory limit peaks
            lo, hi = sorted(fits)
            below = [b for b in allowed if lo < b < hi and b in self.batches and b not in mine]
            if below:
                return max(below)
        predicted = self._predicted_max_batch(fits, sibling_slope)
        candidates = [b for b in open_ if b > largest and b <= predicted]
        if not candidates:
            # The grid's next step does not fit (measured, or predicted): the largest batch that
            # fits lies between, at an integer the grid does not hold.
            b = self._integer_step(family, mine, fits, upper, sibling_slope)
            if b is None or (len(fits) >= 2 and not self._can_win(fits, b, rival_best)):
                return None
            return b
        # Judge the climb by the largest batch it can reach: past the grid's last fitting step the
        # integer search goes on up to the memory line's prediction.
        reach = max(self._reachable(family, candidates, predicted, upper))
        if len(fits) >= 2 and not self._can_win(fits, reach, rival_best):
            return None
        # One step up at a time (past a GPU's jump): a worker reuses its model for growing batches,
        # so the climb costs a measurement per step, not a model build; each step refines the memory
        # line, and the climb stops where throughput saturates or falls.
        return min(candidates)

    def _jump(self, family: Mapping[str, Any], mine: dict[int, Trial], fits: dict[int, Trial], upper: float,
              sibling_slope: float | None) -> int | None:
        """On a GPU, after a family's first fitting probe: the largest batch its memory line says fits
        within the margin, where that is past the grid's next step (else None: step as on a CPU). The
        line's slope is the probe's own step memory a sample (its ``step`` part over its batch: the
        activations, and what a step holds whatever the batch, so it errs toward a smaller batch),
        else a sibling family's. Timing each batch on the way costs a probe apiece (a GPU probe's
        burn-in and timed phases, 4-25 s on the recorded H100 race), and a larger batch that fits is
        rarely slower than a smaller one; where the jump's is (the race's liger+packing: 58 samples/s
        at 5, 64 at 4), the grid's step below it finds the peak (:meth:`_next_batch`), and a fall
        ends the family's climb as any fall does (a memory-only knob's family then cannot help it).
        The jump's speed is the bar the smaller batches are cut short at (``search.ranking.bar_for``)."""
        if not self.jumps or len(fits) != 1:
            return None
        [(b1, t)] = fits.items()
        step = t.measurement.memory_parts_bytes.get("step")
        slope = step / b1 if step else sibling_slope
        predicted = self._predicted_max_batch(fits, slope)
        if predicted == float("inf"):
            return None
        grid = [b for b in self.batches if b1 < b <= min(predicted, upper - 1)]
        reach = [b for b in self._reachable(family, grid, predicted, upper, low=b1)
                 if b not in mine and self.space.allowed({**family, "batch_size": b})]
        next_grid = min((b for b in self.batches if b > b1), default=None)
        if not reach or next_grid is None or max(reach) <= next_grid:
            return None
        return max(reach)

    def _reachable(self, family: Mapping[str, Any], grid: list[int], predicted: float, upper: float,
                   low: int = 0) -> list[int]:
        """The batches a climb can reach up to the memory line's ``predicted`` largest (and below the
        smallest that failed, ``upper``): the ``grid``'s steps, and past its last (else past ``low``)
        the integers the line allows (:func:`~trainfit.space.integers_between`)."""
        if predicted == float("inf"):
            return list(grid)
        past = max(grid, default=low)
        return [*grid, *integers_between(self.space, past, int(min(predicted, upper - 1)) + 1, self._processes(family))]

    def _integer_step(self, family: Mapping[str, Any], mine: dict[int, Trial], fits: dict[int, Trial],
                      upper: float, sibling_slope: float | None) -> int | None:
        """Past the grid, toward the largest batch that fits: between the largest fitting batch and
        the smallest that does not (measured, or else the grid's next step, which the line predicts
        will not fit within its margin: probed where it fits without, or where the line is a sibling
        family's), probe the memory line's prediction without the safety margin, then bisect on
        each OOM, until the two are adjacent (Lightning's binsearch; DeepSpeed probes around its
        predicted maximum). Integers only where the effective batch can be kept
        (:func:`~trainfit.space.integers_between`); None when none is left between."""
        largest = max(fits)
        next_grid = min((b for b in self.batches if b > largest), default=None)
        if upper == float("inf") and next_grid is None:
            return None  # the grid's largest batch fits: nothing above it is asked for
        top = int(upper) if upper != float("inf") else next_grid
        assert top is not None
        guess = self._predicted_max_batch(fits, sibling_slope, margin=0.0)
        between = [b for b in integers_between(self.space, largest, top, self._processes(family)) if b not in mine
                   and self.space.allowed({**family, "batch_size": b})]
        if upper == float("inf") and top not in mine and self.space.allowed({**family, "batch_size": top}):
            if guess >= top:
                return top  # the line puts the grid's next step within the budget, short only of the margin
            if len(fits) < 2:
                between.append(top)  # a sibling family's slope stood in for the line: it may be off here
        if not between:
            return None
        if largest < guess < top:
            return max((b for b in between if b <= guess), default=min(between))
        return between[(len(between) - 1) // 2]  # the line says nothing useful here: bisect

    def _processes(self, family: Mapping[str, Any]) -> int:
        """The processes a family's configs train on (each takes a batch a micro-batch)."""
        return self.space.params({**family, "batch_size": 1}).processes

    def _rival_best(self, family: Mapping[str, Any], history: Sequence[Trial]) -> float | None:
        """Best feasible objective of the *other* families with the same learning-relevant knobs."""
        part = self._learning_part(family)
        mine = self.family_trials(family, history).values()
        scores = [t.objective for t in history if t.feasible and t.objective is not None and t not in mine
                  and self._learning_part({k: t.values.get(k) for k in family}) == part]
        return max(scores, default=None)

    def propose(self, history: Sequence[Trial], busy: Collection[str] = ()) -> dict[str, Any] | None:
        """The next config: the first family in order with a batch worth probing, but where that is
        a family with a memory-only knob value that needs another model, a later such family that
        runs on the model probed last (switched in place, ``Knob.switched``) goes first: no build."""
        climbing = {config_key({k: v for k, v in json.loads(key).items() if k != "batch_size"}) for key in busy}
        unsupported = unsupported_values(history)
        kept = self._model_part(history[-1].values) if history else None
        first = None
        for family in self.families:
            config = self._proposal(family, history, climbing, unsupported)
            if config is None:
                continue
            memory_only = self.lean(family) is not None
            if (first is None and not memory_only) or (memory_only and self._model_part(family) == kept):
                return config
            first = first or config
        return first

    def _model_part(self, values: Mapping[str, Any]) -> str:
        """What of ``values`` a built model depends on, over the searched knobs but the batch size."""
        names = self.families[0].keys() if self.families else ()
        return config_key(model_values({k: values.get(k) for k in names}, switched=True))

    def _proposal(self, family: Mapping[str, Any], history: Sequence[Trial], climbing: Collection[str],
                  unsupported: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
        """``family``'s next config, or None when it has none worth probing now."""
        if config_key(family) in climbing:
            return None  # another run is probing this family: its next step waits for that result
        if not can_run(family, unsupported):
            return None  # a knob value of it cannot run on this machine, whatever the batch
        lean = self.lean(family)
        if lean is not None and config_key(lean) in climbing:
            return None  # where the family without the memory-only knob stops is not known yet
        above = self.lean_limit(family, history)
        if above is None:
            return None
        if self.outgrown_layout(family, history) is not None:
            return None  # its weights and optimizer state alone cannot fit, by another layout's parts
        mine = self.family_trials(family, history)
        if self._dominated(family, mine, history):
            return None
        b = self._next_batch(family, mine, self._rival_best(family, history),
                             self._sibling_slope(family, history), above=above)
        if b is None:
            return None
        return {**family, "batch_size": b} if "batch_size" in self.space.names else dict(family)

    def outgrown_layout(self, family: Mapping[str, Any], history: Sequence[Trial]) -> tuple[float, Trial] | None:
        """A measured config of another process layout (the same but for how processes share the
        training) by whose memory parts ``family``'s weights and optimizer state alone, a lower bound
        of its peak, exceed the budget: those bytes and that trial (:mod:`trainfit.search.layouts`);
        None where none does, or ``family`` has measurements of its own, which speak for it."""
        if self.family_trials(family, history):
            return None
        target = self.space.params({**family, "batch_size": self.batches[0]})
        for t in history:
            if not same_but_layout(t.values, family):
                continue
            need = state_bytes_as(self.space.params(t.values), t.measurement.memory_parts_bytes, target)
            limit = self.limit_bytes([t], margin=0.0)
            if need is not None and limit is not None and need > limit:
                return need, t
        return None

    def lean(self, family: Mapping[str, Any]) -> dict[str, Any] | None:
        """The same family without its memory-only knob values (:data:`MEMORY_ONLY`), if it is
        searched too; None for a family that has none."""
        lean = {k: (not v if isinstance(v, bool) else v) if memory_only(k, v) else v for k, v in family.items()}
        return lean if lean != dict(family) and lean in self.families else None

    def lean_limit(self, family: Mapping[str, Any], history: Sequence[Trial]) -> int | None:
        """The batch up to which ``family`` is not worth a probe: 0 for a family without a memory-
        only knob value; else the largest batch its lean family fits (those fit without the knob,
        which only costs speed there); None when the lean family's climb did not end at its memory
        limit (it fits every batch worth probing, or a larger batch stopped being faster before
        memory ran out: the knob cannot help), or is not measured yet."""
        lean = self.lean(family)
        if lean is None or "batch_size" not in self.space.names:
            return 0
        trials = self.family_trials(lean, history)
        if any(t.measurement.status in BROKEN for t in trials.values()):
            return 0  # the lean family is broken for another reason: the knob's family stands alone
        if not trials:  # a lean family that cannot run here, or cannot fit at all: the knob's stands alone
            if not can_run(lean, unsupported_values(history)) or self.outgrown_layout(lean, history) is not None:
                return 0
            return None
        if not self._stopped_by_memory(lean, trials, history):
            return None
        return max((b for b, t in trials.items() if t.feasible), default=0)

    def _stopped_by_memory(self, family: Mapping[str, Any], trials: dict[int, Trial], history: Sequence[Trial]) -> bool:
        """Did ``family``'s climb end at its memory limit: a batch that does not fit (measured), or
        the grid's next step above its largest fitting batch predicted not to fit?"""
        if any(not t.feasible for t in trials.values()):
            return True
        fits = {b: t for b, t in trials.items() if t.objective is not None}
        if fits and self._saturated(fits):
            return False  # its own climb stopped gaining: a larger batch (what the knob buys) cannot help
        # Stopped by a rival (dominated, or unable to win within its memory): memory is what holds it
        # back wherever it cannot reach the grid's largest batch.
        return self._memory_bound(family, history)

    @staticmethod
    def _fell(fits: dict[int, Trial]) -> bool:
        """Is the largest fitting batch slower than the fastest one by more than the two probes' 95%
        CIs (a fall within them is noise, which does not end a climb)?"""
        largest = max(fits)
        best = max(fits, key=lambda b: fits[b].objective or 0.0)
        if best == largest:
            return False
        noise = sum(fits[b].measurement.step_time_ci95_rel or 0.0 for b in (best, largest))
        return fits[largest].measured_objective * (1 + noise) < fits[best].measured_objective

    def _saturated(self, fits: dict[int, Trial]) -> bool:
        """Did a larger batch of these fitting trials stop being faster (fell, or gained less than
        ``saturation`` a doubling of the batch even at the upper end of the measured gain: a gain
        hidden by measurement noise is worth one more, reused so cheap, step)? Judged over a
        doubling where the trials span one (16 against 8, not 15: the integer steps past the grid
        gain little each even far from saturation, and little noise hides a flat line), else per
        doubling over the step there is."""
        largest = max(fits)
        if self._fell(fits):
            return True
        if len(fits) < 2:
            return False
        below = max((b for b in fits if b <= largest / 2), default=min(fits))
        gain = fits[largest].measured_objective / max(fits[below].measured_objective, 1e-12) - 1
        noise = sum(fits[b].measurement.step_time_ci95_rel or 0.0 for b in (below, largest))
        return gain + noise < self.saturation * math.log2(largest / below)


def memory_only(knob: str, value: Any) -> bool:
    """Is ``value`` of ``knob`` one that only trades speed for memory (:data:`MEMORY_ONLY`)?"""
    return knob in MEMORY_ONLY and MEMORY_ONLY[knob] == value and type(MEMORY_ONLY[knob]) is type(value)
