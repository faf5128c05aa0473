"""What a comparison's curves say about the next round: rules over the measured runs, each
suggestion with its evidence and, where it proposes a config, that config for the next
``configs.yaml``. Pure functions of the runs and the configs as written."""

from __future__ import annotations

import math
import statistics
from typing import Any

from trainfit.compare.configs import TRAINING_KEYS
from trainfit.compare.curves import (
    MIN_TAIL,
    eval_gap_noise,
    final_loss,
    last_tenth,
    loss_drop,
    loss_noise,
    same_result,
    train_losses,
)
from trainfit.compare.moves import edge_moves
from trainfit.compare.runs import ConfigRun, Suggestion

SLOWER = 0.9
"""A config at less than 0.9x another's speed is slower."""
STILL_FALLING = 0.05
"""A train loss still falls when its last quarter's mean is below its third quarter's by 5% of the
run's own drop so far; an eval loss, when it fell at each of the last two passes."""
SAME_WORK_APART = 0.8
"""Two configs that train the same shapes (they differ only in training values, which cost no
time) and ran with the slower under 0.8x the faster: the machine's speed changed between them."""

def _gap_noise(best: ConfigRun, second: ConfigRun) -> tuple[float | None, str]:
    """The noise the gap between two final losses is weighed against, and what it is (a template
    for the figure: ``{noise}``), or, where None, why it is not known."""
    if best.evals:
        noise, passes = eval_gap_noise(best, second)
        if noise is None:
            return None, (f"each final eval loss is one pass; {passes} common pass(es) are too few to measure how their "
                          f"difference scatters (at least {MIN_TAIL})")
        return noise, f"the scatter of the two curves' difference ({{noise}}, over their last {passes} passes about its trend)"
    mine, theirs = loss_noise(best), loss_noise(second)
    if mine is None or theirs is None:
        return None, (f"each final train loss is the mean of its last {len(last_tenth(best))} logged loss(es), too few "
                      f"to measure their scatter (at least {MIN_TAIL})")
    return ((mine ** 2 + theirs ** 2) ** 0.5,
            "their combined standard error ({noise}, each from its last tenth's scatter about its trend)")


def _too_close(order: list[str], runs: dict[str, ConfigRun], given: dict[str, dict[str, Any]],
               steps: int | None) -> list[Suggestion]:
    """The best and the runner-up, where their final losses do not tell them apart: within twice
    the noise of their gap (:func:`_gap_noise`), or too few losses to know it and (for eval
    losses) the same result (:func:`same_result`). Both go to the next round, and where the runner-up trained
    faster, that is said: at equal loss it is the better config."""
    if len(order) < 2 or bool(runs[order[0]].evals) != bool(runs[order[1]].evals):
        return []  # an eval loss and a train loss: ranked apart, not weighed against each other
    best, second = order[0], order[1]
    a, b = final_loss(runs[best]), final_loss(runs[second])
    assert a is not None and b is not None  # ranked runs have a final loss
    evals = bool(runs[best].evals)
    noise, basis = _gap_noise(runs[best], runs[second])
    longer = f"train longer (e.g. --steps {2 * steps})" if steps else "train longer"
    how = (f"evaluate more often (--eval-every N) or {longer} to tell them apart" if evals else
           f"{longer} or evaluate on held-out data (--eval-data, or --holdout N) to tell them apart")
    both = {best: dict(given[best]), second: dict(given[second])}
    losses = f"final {'eval' if evals else 'train'} losses {a:.4g} and {b:.4g}"
    if noise is None:
        if evals and not same_result(runs[best], runs[second]):
            return []  # an eval loss on a shared set, apart past the runs' own window: no scatter needed to tell
        return [Suggestion(says=f"too few {'evaluations' if evals else 'steps'} to tell {best} from {second}: {how}"
                                + _faster(runs[best], runs[second], second),
                           evidence=f"{losses}; {basis}", configs=both)]
    if b - a > 2 * noise:
        return []
    return [Suggestion(says=f"{best} and {second} are within the noise of their losses: {how}"
                            + _faster(runs[best], runs[second], second),
                       evidence=f"{losses} differ by {b - a:.3g}, within twice " + basis.format(noise=f"{noise:.3g}"),
                       configs=both)]


def _faster(best: ConfigRun, second: ConfigRun, name: str) -> str:
    """``; at equal loss NAME is the better: it trained at 1.5x the speed`` where the runner-up
    was faster than :data:`SLOWER` allows (else nothing)."""
    if not best.samples_per_second or not second.samples_per_second:
        return ""
    if best.samples_per_second >= SLOWER * second.samples_per_second:
        return ""
    return (f"; at equal loss {name} is the better: it trained at {second.samples_per_second / best.samples_per_second:.2f}x"
            " the speed")


def still_falling(run: ConfigRun) -> bool:
    """Its eval loss fell at each of its last two passes, or its train loss's last quarter is below
    its third quarter by :data:`STILL_FALLING` of what the run learned so far."""
    if _evals_falling(run):
        return True
    losses = train_losses(run)
    if len(losses) < 8:
        return False
    q = len(losses) // 4
    fell = statistics.fmean(losses[-2 * q:-q]) - statistics.fmean(losses[-q:])
    return fell > 0 and fell >= STILL_FALLING * loss_drop(run)


def _evals_falling(run: ConfigRun) -> list[float]:
    """The last three eval losses where each is below the one before (the loss fell at each of the
    last two passes), else none."""
    evals = [x[2] for x in run.evals if x[2] is not None][-3:]
    return evals if len(evals) == 3 and evals[2] < evals[1] < evals[0] else []


def ranked(runs: dict[str, ConfigRun]) -> list[str]:
    """The configs that finished, best (lowest final loss) first: those with an eval loss before
    those without (a train loss is no rival of an eval loss: a run stopped before its first pass
    ranks after every run that had one)."""
    done = [name for name, r in runs.items() if r.status == "finished" and final_loss(r) is not None]
    return sorted(done, key=lambda name: (not runs[name].evals, final_loss(runs[name])))


def standing(given: dict[str, dict[str, Any]], runs: dict[str, ConfigRun]) -> list[str]:
    """The configs that finished, best first, as the suggestions rank them (``compare.json``'s
    ``ranking``: what ``plan --from-compare`` carries on)."""
    order = ranked(runs)
    return _best_first(order, _capacity(given, runs, order)[1]) if order else []


def _best_first(order: list[str], kept: dict[str, str]) -> list[str]:
    """``order`` with the best first: the lowest loss, or the smaller rank that matched it, as "keep"
    says, all the way down (r32 kept r16, which r8 matched: r8)."""
    best = order[0]
    while best in kept:
        best = kept[best]
    return [best, *(name for name in order if name != best)]


def suggest(given: dict[str, dict[str, Any]], runs: dict[str, ConfigRun], target_loss: float | None = None,
            steps: int | None = None, defaults: dict[str, Any] | None = None) -> list[Suggestion]:
    """The next round's suggestions (see the module) from the configs as written and their runs;
    ``defaults``: the spec's params, which a config inherits where it names no value."""
    order = ranked(runs)
    out = [s for name, run in runs.items() if run.status == "diverged" for s in [_diverged(name, given[name], run)]]
    out += [_does_not_fit(name, given[name], run, defaults or {}) for name, run in runs.items()
            if run.status in ("over_budget", "out_of_memory")]
    if order:
        capacity, kept = _capacity(given, runs, order)
        order = _best_first(order, kept)
        best = order[0]
        out += _learning_rate_edge(best, given, runs, order)
        out += edge_moves(best, given, runs, order, defaults or {})
        out += capacity
        if still_falling(runs[best]):
            out.append(Suggestion(says=f"train {best} longer" + (f" (e.g. --steps {2 * steps})" if steps else ""),
                                  evidence=f"its loss was still falling at the end: {_quarters(runs[best])}"))
        out.insert(0, Suggestion(says=f"{best} is the best so far", evidence=_standing(order, runs),
                                 configs={best: dict(given[best])}))
        out += _unequal_samples(order, runs)
        out[1:1] = _too_close(order, runs, given, steps)
    out += _machine_changed(given, runs)
    if target_loss is not None and not any(reached(r, target_loss) for r in runs.values()):
        best_loss = min((x for r in runs.values() if (x := final_loss(r)) is not None), default=None)
        out.append(Suggestion(says=f"no config reached the target loss {target_loss:g}",
                              evidence=f"the lowest final loss was {best_loss:.4g}" if best_loss is not None
                              else "no config finished"))
    return out


def reached(run: ConfigRun, target: float) -> list[float] | None:
    """``[step, seconds, samples]`` where the run's loss first reached ``target`` (its eval loss when
    it has evaluations, else its train loss); None when it never did."""
    points = run.evals or run.losses
    hit = next((p for p in points if p[2] is not None and p[2] <= target), None)
    return None if hit is None else [hit[0], hit[1], hit[0] * run.samples_per_step]


def _diverged(name: str, given: dict[str, Any], run: ConfigRun) -> Suggestion:
    lr = float(given.get("learning_rate", 2e-5))
    finite = train_losses(run)
    start = f"{statistics.fmean(finite[:5]):.4g}" if finite else "?"
    last = run.losses[-1][2] if run.losses else None
    return Suggestion(says=f"{name} diverged at step {run.diverged_at}: lower its learning rate or add warmup",
                      evidence=f"its loss went from {start} at the start to "
                               f"{'not a number' if last is None else f'{last:.4g}'} at step {run.diverged_at}",
                      configs={f"{name}_stable": {**given, "learning_rate": float(f"{lr / 3:.3g}"), **_more_warmup(given)}})


def _more_warmup(given: dict[str, Any]) -> dict[str, Any]:
    """A tenth of the run as warmup, or more than the config had: its ``warmup_steps`` (which win over a
    ratio, as in TRL) doubled, at least 10."""
    steps = given.get("warmup_steps")
    if isinstance(steps, int) and steps > 0:
        return {"warmup_steps": max(10, 2 * steps)}
    return {"warmup_ratio": max(0.1, 2 * float(given.get("warmup_ratio") or 0.0))}


def _does_not_fit(name: str, given: dict[str, Any], run: ConfigRun, defaults: dict[str, Any]) -> Suggestion:
    """A config over the memory budget: the same effective batch in half the micro-batch where its
    batch is above 1, else gradient checkpointing, else a smaller config; a budget below what a
    process needs to start: a larger budget."""
    evidence = run.error or run.status
    if "just to start" in evidence:
        return Suggestion(says=f"{name} could not start under the budget: raise budget.memory_gb", evidence=evidence)
    value = {**defaults, **given}.get
    batch = int(value("batch_size") or 1)
    if batch > 1:
        change = {"batch_size": batch // 2, "gradient_accumulation_steps": 2 * int(value("gradient_accumulation_steps")
                                                                                   or 1)}
        how = "halve its batch_size and double its gradient_accumulation_steps (the same effective batch)"
    elif not value("gradient_checkpointing"):
        change, how = {"gradient_checkpointing": True}, "turn on gradient_checkpointing"
    else:
        return Suggestion(says=f"{name} does not fit the memory budget: a shorter max_length or a smaller model",
                          evidence=evidence)
    return Suggestion(says=f"{name} does not fit the memory budget: {how}", evidence=evidence,
                      configs={f"{name}_fits": {**given, **change}})


def _learning_rate_edge(best: str, given: dict[str, dict[str, Any]], runs: dict[str, ConfigRun],
                        order: list[str]) -> list[Suggestion]:
    """The best config had the highest (lowest) learning rate tried: try past it, short of the
    lowest rate that diverged (a rate that diverged was tried too)."""
    rates = {name: float(given[name].get("learning_rate", 2e-5)) for name in order}
    if len(set(rates.values())) < 2:
        return []
    lr = rates[best]
    others = ", ".join(f"{n} ({rates[n]:g}): {final_loss(runs[n]):.4g}" for n in order[1:4])
    blew = min((float(given[n].get("learning_rate", 2e-5)) for n, r in runs.items() if r.status == "diverged"),
               default=math.inf)
    if lr == max(rates.values()) and still_falling(runs[best]) and blew > lr:
        higher = 2 * lr if blew > 2 * lr else math.sqrt(lr * blew)  # between the best and the lowest that diverged
        if float(f"{higher:.3g}") <= lr:
            return []  # the rate that diverged is as good as the best's: nothing between them to try
        below = f"; {blew:g} diverged" if math.isfinite(blew) else ""
        return [Suggestion(says=f"the highest learning rate tried ({lr:g}) was the best and its loss still fell: "
                                + (f"try 2x ({higher:g})" if higher == 2 * lr else
                                   f"try {higher:.3g} (short of {blew:g}, which diverged)"),
                           evidence=f"final loss {best} ({lr:g}): {final_loss(runs[best]):.4g}; {others}{below}",
                           configs={f"{best}_lr_{'x2' if higher == 2 * lr else 'up'}": {
                               **given[best], "learning_rate": float(f"{higher:.3g}")}})]
    if lr == min(rates.values()):
        return [Suggestion(says=f"the lowest learning rate tried ({lr:g}) was the best: try half of it ({lr / 2:g})",
                           evidence=f"final loss {best} ({lr:g}): {final_loss(runs[best]):.4g}; {others}",
                           configs={f"{best}_lr_half": {**given[best], "learning_rate": float(f"{lr / 2:.3g}")}})]
    return []


def _capacity(given: dict[str, dict[str, Any]], runs: dict[str, ConfigRun],
              order: list[str]) -> tuple[list[Suggestion], dict[str, str]]:
    """A larger LoRA rank that matched a smaller one's loss, slower: keep the smaller. Also which
    config each larger one gives way to: the smallest rank that matched it."""
    out: list[Suggestion] = []
    kept: dict[str, str] = {}
    for big in order:
        for small in order:
            r_big, r_small = given[big].get("lora_r"), given[small].get("lora_r")
            if not (isinstance(r_big, int) and isinstance(r_small, int) and r_big > r_small):
                continue
            loss_big, loss_small = final_loss(runs[big]), final_loss(runs[small])
            speed_big, speed_small = runs[big].samples_per_second, runs[small].samples_per_second
            if None in (loss_big, loss_small, speed_big, speed_small):
                continue
            ratio = speed_big / speed_small  # type: ignore[operator]
            if same_result(runs[big], runs[small]) and ratio < SLOWER:
                if big not in kept or r_small < given[kept[big]]["lora_r"]:
                    kept[big] = small  # the smallest rank that matches it
                out.append(Suggestion(says=f"r={r_big} ({big}) matched r={r_small} ({small}) at {ratio:.2f}x the "
                                           f"speed: keep {r_small}",
                                      evidence=f"final loss {loss_big:.4g} against {loss_small:.4g}; "
                                               f"{speed_big:.3g} against {speed_small:.3g} samples/s"))
    return out, kept


def _machine_changed(given: dict[str, dict[str, Any]], runs: dict[str, ConfigRun]) -> list[Suggestion]:
    """Configs that train the same shapes but ran at speeds :data:`SAME_WORK_APART` apart: the
    machine was busier for one of them, so the comparison's speeds (not its losses) say nothing."""
    speeds = {name: run.samples_per_second for name, run in runs.items() if run.samples_per_second}
    groups: dict[str, list[str]] = {}
    for name in speeds:
        shapes = {k: v for k, v in given[name].items() if k not in TRAINING_KEYS}
        groups.setdefault(repr(sorted(shapes.items())), []).append(name)
    out = []
    for names in groups.values():
        fast, slow = max(names, key=speeds.__getitem__), min(names, key=speeds.__getitem__)
        ratio = speeds[slow] / speeds[fast]
        if ratio < SAME_WORK_APART:
            out.append(Suggestion(
                says=f"{slow} and {fast} train the same shapes yet ran at {ratio:.2f}x each other's speed: the "
                     "machine's speed changed during the comparison, so its speeds (and the speed side of these "
                     "suggestions) do not hold, its losses do; measure speed with `trainfit tune`, or compare "
                     "again on a quiet machine",
                evidence=f"{speeds[slow]:.3g} against {speeds[fast]:.3g} samples/s; they differ only in "
                         f"{', '.join(_training_differences(given[slow], given[fast]))}"))
    return out


def _training_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k)) or ["nothing (the same config)"]


def _quarters(run: ConfigRun) -> str:
    """Why :func:`still_falling` says so: its last eval passes, else its train loss's last two quarters."""
    if falling := _evals_falling(run):
        return "eval loss " + " -> ".join(f"{x:.4g}" for x in falling) + " over its last passes"
    losses = train_losses(run)
    q = len(losses) // 4
    return (f"mean {statistics.fmean(losses[-2 * q:-q]):.4g} in the third quarter of its steps, "
            f"{statistics.fmean(losses[-q:]):.4g} in the last")


def _unequal_samples(order: list[str], runs: dict[str, ConfigRun]) -> list[Suggestion]:
    """Ranked configs whose optimizer steps train different numbers of samples: at equal steps, the
    larger effective batch has seen more data, and its lower loss may be only that."""
    per_step = {n: runs[n].samples_per_step for n in order if runs[n].samples_per_step}
    if len(set(per_step.values())) < 2:
        return []
    most, least = max(per_step, key=per_step.__getitem__), min(per_step, key=per_step.__getitem__)
    return [Suggestion(
        says=f"{most} and {least} trained {per_step[most]} and {per_step[least]} samples a step: at equal steps "
             f"{most} saw {per_step[most] / per_step[least]:.3g}x the data, so their losses compare data seen, not "
             "only the configs; compare them at equal samples (--target-loss: the samples each needed) or at "
             "the same effective batch",
        evidence=", ".join(f"{n}: {per_step[n]} samples a step, {runs[n].steps} steps" for n in order if n in per_step))]


def _standing(order: list[str], runs: dict[str, ConfigRun]) -> str:
    kinds = {bool(runs[n].evals) for n in order}
    if len(kinds) == 1:
        return f"final {'eval' if kinds.pop() else 'train'} loss: " + ", ".join(
            f"{n} {final_loss(runs[n]):.4g}" for n in order)
    return "final loss: " + ", ".join(
        f"{n} {final_loss(runs[n]):.4g} ({'eval' if runs[n].evals else 'train: no eval pass ran'})" for n in order)
