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


def loaded_steps(rows: Rows, params: Params, collate: Callable[[list[Any]], Any],
                 device: Any) -> Iterator[tuple[int, list[Any]]]:
    """Each optimizer step of the rows ``rows()`` reads: the rows it holds and its micro-batches'
    inputs, on ``device``."""
    if params.num_workers == 0:
        for step in steps_of(rows(), params.batch_size, params.gradient_accumulation_steps):
            yield sum(len(m) for m in step), [to_device(collate(m), device) for m in step]
        return
    import torch

    pinned = device.type == "cuda" and params.pin_memory
    # Its own generator: the workers' seeds are drawn from it, not from torch's global one, which
    # the model's dropout and noise draw from: the run's random numbers stay those of num_workers 0.
    loader = torch.utils.data.DataLoader(_shares(rows, params, collate), batch_size=None, num_workers=params.num_workers,
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


def _shares(rows: Rows, params: Params, collate: Callable[[list[Any]], Any]) -> Any:
    """The loader's dataset: in each worker, its share of the micro-batches as ``(step, rows, inputs)``."""
    import torch

    class Shares(torch.utils.data.IterableDataset):
        def __iter__(self) -> Iterator[tuple[int, int, Any]]:
            info = torch.utils.data.get_worker_info()
            workers, me = (1, 0) if info is None else (info.num_workers, info.id)
            steps = steps_of(rows(), params.batch_size, params.gradient_accumulation_steps)
            micro = ((s, m) for s, step in enumerate(steps) for m in step)
            for k, (s, m) in enumerate(micro):
                if k % workers == me:
                    yield s, len(m), collate(m)

    return Shares()
