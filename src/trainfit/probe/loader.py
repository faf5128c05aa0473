"""The timed steps' batches through a real input pipeline (``probe.data: real``): the dataset's rows
of each timed shape (probe/real_rows.py) made into inputs by a torch ``DataLoader`` with the
config's loader knobs (``num_workers``, ``pin_memory``, ``persistent_workers``,
``prefetch_factor``), the workload's collate running where the trainer's does (in the loader's
workers when there are some), each micro-batch loaded anew, as an epoch loads every batch.

The time a step waits for its micro-batches (from asking the loader to having them on the device)
is what the model's step cannot hide: with workers, what they have not prepared while the last
step ran; without, the whole collate. The probe times the step apart from that wait and keeps both
(``data_wait_s``): the step's cost fit stays the model's, and the epoch's speed adds the wait.

Imports are light (no torch at the top), as the worker's are."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from trainfit.devices import synchronize
from trainfit.errors import TrainfitError
from trainfit.workloads.base import Batch, to_device

if TYPE_CHECKING:
    from trainfit.probe.request import ProbeRequest


def synthetic_instead(mode: str, why: str, fix: str, notes: list[str]) -> None:
    """The dataset's rows cannot be the timed steps' inputs, for ``why``: under ``probe.data: real``
    an error with ``fix``; under ``auto`` a note, the probe going on with synthetic inputs."""
    if mode == "real":
        raise TrainfitError(f"probe.data: real, but {why}", f"{fix}, or set probe.data: synthetic")
    notes.append(f"the timed steps ran on synthetic inputs: {why} (probe.data: auto)")


def tensors_on_cpu(inputs: Any) -> bool:
    """Whether every tensor in ``inputs`` (in dicts, lists and tuples, at any depth) is on the CPU."""
    if hasattr(inputs, "device") and hasattr(inputs, "is_pinned"):
        return bool(inputs.device.type == "cpu")
    if isinstance(inputs, dict):
        return all(tensors_on_cpu(v) for v in inputs.values())
    if isinstance(inputs, (list, tuple)):
        return all(tensors_on_cpu(v) for v in inputs)
    return True


class _Shapes:
    """The loader's dataset: item ``k`` is the ``k``-th timed micro-batch, collated from its rows."""

    def __init__(self, workload: Any, rows: Sequence[Sequence[Any]], pool: Sequence[Batch]) -> None:
        self.workload, self.rows, self.pool = workload, rows, pool

    def __len__(self) -> int:
        return len(self.pool)

    def __getitem__(self, k: int) -> Any:
        return self.workload.collate_rows(self.rows[k], self.pool[k].padded_len, self.pool[k].packed)


class _Forever:
    """The loader's sampler: the timed shapes in turn, each ``accum`` times (a step's micro-batches), forever."""

    def __init__(self, cycle: int, accum: int) -> None:
        self.cycle, self.accum = cycle, accum

    def __iter__(self) -> Iterator[int]:
        return itertools.cycle([k for k in range(self.cycle) for _ in range(self.accum)])


class LoaderBatches:
    """What :class:`~trainfit.probe.phases.TypicalBatches` gives the timed phase, loaded for real:
    the shapes' pool (their lengths), and each step's micro-batches from the loader, with the
    seconds the step waited for them (:attr:`last_wait`) and the loader's start (:attr:`start_s`)."""

    def __init__(self, req: ProbeRequest, workload: Any, pool: list[Batch]) -> None:
        import torch

        assert req.timing_rows is not None
        params = req.params
        self.accum = params.gradient_accumulation_steps
        self.pool = pool
        self.cycle = len(pool)
        self.cursor = 0
        self.last_wait = 0.0
        self.start_s: float | None = None
        cuda = workload.device is not None and workload.device.type == "cuda"
        workers = params.num_workers
        self.device, self.non_blocking = workload.device, cuda and params.pin_memory
        shapes: Any = _Shapes(workload, req.timing_rows, pool)  # a map-style dataset: __getitem__ and __len__
        self.loader: Any = torch.utils.data.DataLoader(
            shapes, batch_size=None, sampler=_Forever(self.cycle, self.accum),
            num_workers=workers, pin_memory=self.non_blocking, persistent_workers=params.persistent_workers and workers > 0,
            prefetch_factor=params.prefetch_factor if workers > 0 else None,
            generator=torch.Generator().manual_seed(req.probe.seed))  # not torch's global one, the model's
        self.iterator: Iterator[Any] | None = None

    def next_step(self) -> tuple[int, list[Batch]]:
        """Which shape the next optimizer step is, and its micro-batches, loaded (the wait kept)."""
        shape = self.cursor % self.cycle
        self.cursor += 1
        t = time.perf_counter()
        if self.iterator is None:
            self.iterator = iter(self.loader)
        meta = self.pool[shape]
        micro = [Batch(inputs=to_device(next(self.iterator), self.device, self.non_blocking), seq_lens=meta.seq_lens,
                       padded_len=meta.padded_len, packed=meta.packed) for _ in range(self.accum)]
        synchronize(self.device)  # a pinned copy is asynchronous: the wait ends when the inputs are there
        self.last_wait = time.perf_counter() - t
        if self.start_s is None:
            self.start_s = self.last_wait  # the first step's wait: the workers' start and first batches
        return shape, micro

    def close(self) -> None:
        """Stop the loader's workers (a kept model's next probe makes a loader of its own)."""
        self.iterator = None
        self.loader = None  # with persistent workers, the loader holds them
