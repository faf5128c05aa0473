"""A factory run's batches as its probe timed them: the epoch's rows grouped into optimizer steps,
each micro-batch made into inputs by the factory's ``collate``, in a torch ``DataLoader``'s worker
processes with the config's loader knobs (``num_workers``, ``pin_memory``, ``prefetch_factor``)
or, at ``num_workers: 0``, in the training process between steps, as the probe measured it.

With workers, each reads the epoch's rows and collates every ``num_workers``-th micro-batch (its
share, by its id), and the loader hands them back in order (a ``DataLoader`` takes an iterable
dataset's batches from its workers in turn), so the run sees the same steps in the same order as
without. ``persistent_workers`` has no use here: each epoch's loader starts where the run is
(``skip``), a new one each epoch, as a resumed run starts mid-epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from trainfit.params import Params
from trainfit.train.ranks import Rank, this_rank
from trainfit.workloads.base import to_device

Rows = Callable[[], Iterator[dict[str, Any]]]


def steps_of(rows: Iterator[dict[str, Any]], batch_size: int, accumulation: int) -> Iterator[list[list[dict[str, Any]]]]:
    """Group rows into optimizer steps of up to ``accumulation`` micro-batches of up to ``batch_size``."""
    step: list[list[dict[str, Any]]] = []
    micro: list[dict[str, Any]] = []
    for row in rows:
        micro.append(row)
        if len(micro) == batch_size:
            step.append(micro)
            micro = []
            if len(step) == accumulation:
                yield step
                step = []
    if micro:
        step.append(micro)
    if step:
        yield step


def rank_steps(rows: Iterator[dict[str, Any]], params: Params,
               me: Rank = Rank()) -> Iterator[tuple[int, list[list[dict[str, Any]]]]]:
    """Each optimizer step of ``rows``: the rows it holds, every rank's (what the run's position
    counts), and rank ``me``'s share of each of its micro-batches (one process: all of them)."""
    for step in steps_of(rows, params.batch_size * me.world, params.gradient_accumulation_steps):
        yield sum(len(m) for m in step), [_share(m, me) for m in step]


def _share(micro: list[dict[str, Any]], me: Rank) -> list[dict[str, Any]]:
    """Rank ``me``'s rows of a micro-batch of every rank's: every ``world``-th. An epoch's last, short,
    is filled by its own rows again, as torch's ``DistributedSampler`` fills it, so that no rank has
    none (DDP steps every rank together)."""
    if me.world == 1:
        return micro
    whole = -(-len(micro) // me.world) * me.world
    return [micro[i % len(micro)] for i in range(whole)][me.rank::me.world]


def loaded_steps(rows: Rows, params: Params, collate: Callable[[list[Any]], Any],
                 device: Any) -> Iterator[tuple[int, list[Any]]]:
    """Each optimizer step of the rows ``rows()`` reads: the rows it holds (every rank's) and its
    micro-batches' inputs (this rank's share), on ``device``."""
    me = this_rank()
    if params.num_workers == 0:
        for count, step in rank_steps(rows(), params, me):
            yield count, [to_device(collate(m), device) for m in step]
        return
    import torch

    pinned = device.type == "cuda" and params.pin_memory
    # Its own generator: the workers' seeds are drawn from it, not from torch's global one, which
    # the model's dropout and noise draw from: the run's random numbers stay those of num_workers 0.
    loader = torch.utils.data.DataLoader(_shares(rows, params, collate, me), batch_size=None,
                                         num_workers=params.num_workers,
                                         pin_memory=pinned, prefetch_factor=params.prefetch_factor,
                                         generator=torch.Generator().manual_seed(0))
    current, held, inputs = -1, 0, list[Any]()
    for step, count, micro in loader:
        if step != current and inputs:
            yield held, inputs
            held, inputs = 0, []
        current, held = step, held + count
        inputs.append(to_device(micro, device, non_blocking=pinned))
    if inputs:
        yield held, inputs


def _shares(rows: Rows, params: Params, collate: Callable[[list[Any]], Any], me: Rank) -> Any:
    """The loader's dataset: in each worker, its share of rank ``me``'s micro-batches as ``(step, rows,
    inputs)`` (``rows``: the step's, every rank's, with its first micro-batch; 0 with the others)."""
    import torch

    class Shares(torch.utils.data.IterableDataset):
        def __iter__(self) -> Iterator[tuple[int, int, Any]]:
            info = torch.utils.data.get_worker_info()
            workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
            micro = ((s, count if i == 0 else 0, m) for s, (count, step) in enumerate(rank_steps(rows(), params, me))
                     for i, m in enumerate(step))
            for k, (s, count, m) in enumerate(micro):
                if k % workers == worker:
                    yield s, count, collate(m)

    return Shares()
