"""An evaluation pass, priced by measurement: the eval set's batches as the trainer forms them (in
file order, at the eval batch size, padded as the config pads), a few of them timed forward-only
on the chosen config (the model in eval mode, no gradients, the config's precision), the cost
fitted over their padded lengths as the probe fits a step's (:mod:`trainfit.probe.estimate`) and
summed over the pass."""

from __future__ import annotations

import functools
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainfit.data.analyze import recipe_for_spec
from trainfit.data.batching import simulate_epoch
from trainfit.data.lengths import count_lengths
from trainfit.data.readers import detect_format
from trainfit.data_paths import data_files
from trainfit.devices import resolve_device_name, synchronize, torch_threads
from trainfit.errors import TrainfitError
from trainfit.json_record import Record
from trainfit.probe.estimate import fit_error, fit_step_cost, timing_picks
from trainfit.probe.memory import is_oom
from trainfit.probe.timing import relative_ci95
from trainfit.workloads import build_workload
from trainfit.workloads.step import TrainStep

if TYPE_CHECKING:
    from trainfit.params import Params
    from trainfit.spec import Spec

ROUNDS = (5, 15)
"""Each timed shape runs at least 5 and at most 15 times (after one untimed warm-up)."""


@functools.cache
def evaluates_after_last_step() -> bool:
    """Does the installed transformers' trainer evaluate after the last step when that step is
    no multiple of ``eval_steps``? (Newer releases do, older ones did not.) Asked of its own
    ``DefaultFlowCallback``: the last of 15 steps with ``eval_steps`` 10."""
    from types import SimpleNamespace

    from transformers.trainer_callback import DefaultFlowCallback, TrainerControl, TrainerState
    from transformers.trainer_utils import IntervalStrategy, SaveStrategy

    args: Any = SimpleNamespace(logging_first_step=False, logging_strategy=IntervalStrategy.NO,
                                eval_strategy=IntervalStrategy.STEPS, eval_delay=0, save_strategy=SaveStrategy.NO)
    state = TrainerState(global_step=15, max_steps=15, logging_steps=500, eval_steps=10, save_steps=500)
    control = DefaultFlowCallback().on_step_end(args, state, TrainerControl())
    return bool(control.should_evaluate)


@dataclass(frozen=True, kw_only=True)
class EvalSchedule(Record):
    """What a run evaluates on and how often: what a training loop needs to evaluate."""

    path: str
    """The eval set (same format and fields as the training data)."""
    every: int | None
    """Optimizer steps between passes (the trainer's ``eval_steps``); None: one at each epoch's end."""
    batch_size: int
    """Samples per eval batch (``per_device_eval_batch_size``)."""

    def passes(self, steps: int, epochs: float) -> int:
        """Passes in a run of ``steps`` optimizer steps over ``epochs`` epochs: at every
        ``every``-th step, and after the last where the installed transformers does so
        (:func:`evaluates_after_last_step`), else one at the end of each epoch, the last partial
        one too."""
        if not self.every:
            return math.ceil(epochs)
        return math.ceil(steps / self.every) if evaluates_after_last_step() else steps // self.every

    def due(self, step: int, max_steps: int) -> bool:
        """Whether a pass follows optimizer step ``step`` of ``max_steps`` (the ``steps`` strategy)."""
        if not self.every:
            return False
        return step % self.every == 0 or (step >= max_steps and evaluates_after_last_step())

    def trl_args(self) -> list[str]:
        """The ``trl sft`` flags that run these passes (the eval set comes as the dataset's test split)."""
        strategy = ["--eval_strategy", "steps", "--eval_steps", str(self.every)] if self.every else [
            "--eval_strategy", "epoch"]
        return [*strategy, "--per_device_eval_batch_size", str(self.batch_size), "--dataset_test_split", "test"]


@dataclass(frozen=True, kw_only=True)
class Evaluation(EvalSchedule):
    """The schedule and what one pass costs (``plan.json``'s ``evaluation``)."""

    samples: int
    batches: int
    padding_share: float
    pass_s: float
    """One pass's expected seconds: the fitted cost summed over its batches."""
    spread_rel: float
    """The 95% relative interval of the rounds' times (each round times every shape once) and the
    fit's largest miss, combined."""
    trial: int
    """The config the pass was timed on."""
    shapes: list[dict[str, Any]]
    """Each timed batch: ``rows``, ``padded_length``, ``seconds`` (the median of its runs)."""


def eval_set(path: str | Path) -> Path:
    """``--eval-data``, absolute (a plan or comparison is read from other folders), or a clear
    error when it does not exist."""
    path = Path(path)
    if not path.exists():
        raise TrainfitError(f"--eval-data {path} does not exist",
                            "give the eval set's file (the training data's format and fields)")
    return path.resolve()


def measure_eval_pass(spec: Spec, params: Params, *, path: str | Path, every: int | None, batch_size: int,
                      max_length: int | None, trial: int, threads: int | None = None,
                      budget_s: float = 10.0) -> Evaluation:
    """Time the eval pass of ``path`` for config ``params`` of ``spec``'s model (see the module).

    ``max_length``: where samples are truncated (the probe's truncation length); ``threads``: the
    CPU threads the probe used; ``budget_s``: roughly how long the timing may take, past the
    model's build and each shape's warm-up.

    Raises :class:`TrainfitError` for an eval set that cannot be read or holds no sample.
    """
    import numpy as np

    assert spec.data is not None
    if batch_size < 1:
        raise TrainfitError(f"eval batch size {batch_size}: at least 1 sample a batch", "e.g. --eval-batch-size 8")
    if every is not None and every < 1:
        raise TrainfitError(f"evaluating every {every} steps: give 1 or more, or 'epoch'", "e.g. --eval-every 500")
    table = count_lengths(path, recipe_for_spec(spec), fmt=spec.data.format, on_bad_row=spec.data.on_bad_row,
                          progress=False)
    lengths = table.valid
    if lengths.size == 0:
        raise TrainfitError(f"the eval set {path} holds no sample to evaluate on", "check --eval-data")
    fixed = params.padding == "max_length" and max_length is not None
    batches = simulate_epoch(lengths, batch_size, padding="max_length" if fixed else "longest", max_length=max_length,
                             pad_to_multiple_of=params.pad_to_multiple_of, shuffle=False)  # the same collator
    starts = np.concatenate([[0], np.cumsum(batches.rows)[:-1]])
    picks = timing_picks(batches.padded_length, longest=True)
    shapes = [(int(batches.rows[i]), int(batches.padded_length[i]),
               [int(min(n, max_length or n)) for n in lengths[batches.order[starts[i]:starts[i] + batches.rows[i]]]])
              for i in picks]
    try:
        seconds = _time_forward(spec, params, shapes, threads, budget_s)
    except (RuntimeError, MemoryError) as err:
        if not is_oom(err):
            raise
        raise TrainfitError(f"the eval pass ran out of memory at {batch_size} samples a batch "
                            f"(the longest padded to {max(length for _, length, _ in shapes)})",
                            "plan with a smaller --eval-batch-size") from None
    medians = [statistics.median(s) for s in seconds]
    per_full_batch = [s * batch_size / rows for s, (rows, _, _) in zip(medians, shapes, strict=True)]
    cost = fit_step_cost([length for _, length, _ in shapes], per_full_batch)
    pass_s = float(np.sum(np.asarray(cost(batches.padded_length.astype(float))) * batches.rows / batch_size))
    rounds = [sum(r) for r in zip(*seconds, strict=True)]  # one figure per round: an outlier step is diluted
    spread = math.hypot(relative_ci95(rounds), fit_error(cost, [x for _, x, _ in shapes], per_full_batch))
    return Evaluation(path=str(path), every=every, batch_size=batch_size, samples=int(lengths.size),
                      batches=batches.batches, padding_share=batches.padding_share, pass_s=pass_s, spread_rel=spread,
                      trial=trial, shapes=[{"rows": rows, "padded_length": length, "seconds": s}
                                           for (rows, length, _), s in zip(shapes, medians, strict=True)])


def _time_forward(spec: Spec, params: Params, shapes: list[tuple[int, int, list[int]]], threads: int | None,
                  budget_s: float) -> list[list[float]]:
    """Each shape's forward-only times, one list per shape, equally long (one warm-up first, then
    rounds over all shapes until the budget is spent, between :data:`ROUNDS`)."""
    import torch

    device = torch.device(resolve_device_name(spec.probe.device))
    with torch_threads(threads):
        torch.manual_seed(spec.probe.seed)
        workload = build_workload(spec, params, device)
        step = TrainStep(workload, params, device)  # compile and autocast as the run has them
        inputs = [workload.make_batch(lens, length).inputs for _, length, lens in shapes]
        for x in inputs:
            step.evaluate(x)  # warm-up: first-call allocations, a compile
        times: list[list[float]] = [[] for _ in inputs]
        began = time.perf_counter()
        rounds = 0
        while rounds < ROUNDS[0] or (rounds < ROUNDS[1] and time.perf_counter() - began < budget_s):
            for x, timed in zip(inputs, times, strict=True):
                synchronize(device)
                t0 = time.perf_counter()
                step.evaluate(x)
                synchronize(device)
                timed.append(time.perf_counter() - t0)
            rounds += 1
    return times


def trl_dataset(folder: Path, spec: Spec, eval_path: Path) -> Path:
    """``folder`` made into a dataset ``datasets.load_dataset(folder)`` reads as two splits: links
    named ``train-NNNNN`` to the spec's data files (in order) and ``test-NNNNN`` to the eval set's.
    ``trl sft --dataset_name folder`` then trains on the one and evaluates on the other (TRL's
    dataset mixture config concatenates its files into one split, so it cannot say which is which)."""
    assert spec.data is not None
    train = [Path(f).resolve() for f in data_files(spec.data.path)]
    test = [Path(f).resolve() for f in data_files(str(eval_path))]
    kinds = {detect_format(Path(spec.data.path), spec.data.format), detect_format(eval_path, spec.data.format)}
    suffixes = {f.suffix for f in [*train, *test]}
    if len(kinds) > 1 or len(suffixes) > 1:
        raise TrainfitError(f"the eval set {eval_path} is not in the training data's format ({spec.data.path})",
                            "give an eval set in the same format, with the same file suffix")
    if folder.exists():
        for old in folder.iterdir():
            old.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    for split, files in (("train", train), ("test", test)):
        for i, source in enumerate(files):
            (folder / f"{split}-{i:05d}{source.suffix}").symlink_to(source)
    return folder
