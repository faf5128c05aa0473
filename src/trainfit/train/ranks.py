"""A factory model trained on several processes by ``trainfit train`` (``nproc_per_node`` > 1 on one
machine, ``parallel: ddp``), as its probe measured it: the model under DDP (``probe.ranks.distribute``),
each rank its share of every micro-batch.

``trainfit train`` itself is rank 0. It starts the other ranks as child processes
(``python -m trainfit.train.rank_child JOB``), joins their process group (gloo on a CPU, NCCL on GPUs) and
trains as one process does: it alone owns the checkpoints' marks, the monitor, the log and the
result. What its callbacks decide (a save, a stop, an evaluation) every rank does, told by a
broadcast (:func:`agree`). Every rank's loss is averaged, so a loss that is not finite stops all.
A checkpoint holds rank 0's weights and optimizer (DDP keeps them the same on every rank) and each
rank's random state (``rng_state_RANK.pth``); it is marked complete after every rank wrote its own.

The other ranks ignore Ctrl-C and SIGTERM: rank 0 hears them and stops everyone at the step's end,
with a save. A rank that dies (``kill -9``) ends the run: rank 0's next collective fails, and it
says which rank ended and the command that resumes from the last complete checkpoint. A rank whose
parent (rank 0) dies exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainfit.errors import TrainfitError


@dataclass(frozen=True)
class Rank:
    """This process's place in the run: its rank and how many train."""

    rank: int = 0
    world: int = 1


def this_rank() -> Rank:
    """This process's rank where a process group is up, else the one process of a run."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return Rank(dist.get_rank(), dist.get_world_size())
    return Rank()


def agree(control: Any, device: Any) -> None:
    """Every rank does what rank 0's callbacks decided: its save, stop and evaluation flags, broadcast."""
    me = this_rank()
    if me.world == 1:
        return
    import torch
    import torch.distributed as dist

    flags = ("should_save", "should_training_stop", "should_evaluate")
    t = torch.tensor([int(bool(getattr(control, f, False))) for f in flags], device=_collective_device(device))
    dist.broadcast(t, src=0)
    for f, value in zip(flags, t.tolist()):
        setattr(control, f, bool(value))


def mean_loss(loss: float, device: Any) -> float:
    """``loss`` averaged over the ranks (each trained its own share): the run's loss, as every rank logs it."""
    me = this_rank()
    if me.world == 1:
        return loss
    import torch
    import torch.distributed as dist

    t = torch.tensor([loss], dtype=torch.float64, device=_collective_device(device))
    dist.all_reduce(t)
    return float(t.item()) / me.world


def barrier() -> None:
    """Wait for every rank (a checkpoint is marked complete once all wrote their parts)."""
    if this_rank().world > 1:
        import torch.distributed as dist

        dist.barrier()


def _collective_device(device: Any) -> Any:
    return device if getattr(device, "type", "cpu") == "cuda" else "cpu"


def rank_device(device_name: str) -> str:
    """The device of this rank: on GPUs, its own (``cuda:RANK``); a CPU's for every rank."""
    me = this_rank()
    return f"cuda:{me.rank}" if me.world > 1 and device_name.startswith("cuda") else device_name  # rank r: GPU r


@contextlib.contextmanager
def ranks(world: int, job: dict[str, Any], scratch: Path, device_name: str) -> Iterator[None]:
    """Rank 0 (this process) of a run of ``world`` processes: the others started with ``job`` (what
    :func:`rank_main` trains), the process group joined, left at the end and the others waited for;
    a rank that ended early is said, with the run's resume command (``job["again"]``)."""
    if world == 1:
        yield
        return
    import torch.distributed as dist

    _check_devices(world, device_name)
    port = _free_port()
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world)}
    scratch.mkdir(parents=True, exist_ok=True)
    path = scratch / "ranks-job.json"
    path.write_text(json.dumps({**job, "parent": os.getpid()}))
    children = [subprocess.Popen([sys.executable, "-m", "trainfit.train.rank_child", str(path)],
                                 env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(1, world)]
    before = {k: os.environ.get(k) for k in GROUP_VARIABLES}
    try:
        os.environ.update({k: env[k] for k in GROUP_VARIABLES})
        _joined(children, world, device_name, job["again"])
        try:
            yield
        except (RuntimeError, OSError) as err:
            ended = _ended(children)
            if not ended:
                raise
            raise TrainfitError(f"rank {ended[0][0]} of {world} ended ({ended[0][1]}), so the run stopped: {err}",
                                f"resume from its last complete checkpoint: {job['again']}") from err
        finally:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
    finally:
        # This process's variables as they were: a command it starts later (a trainer's own run, a test's
        # next one) would take WORLD_SIZE for its own and wait for ranks that never come.
        for k, value in before.items():
            if value is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = value
        deadline = time.monotonic() + 60  # one for all: they end together, after rank 0
        for child in children:
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


GROUP_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE")
"""What rank 0 sets in its own environment while its group is up (torch's ``env://`` reads them)."""


def _joined(children: list[subprocess.Popen[bytes]], world: int, device_name: str, again: str) -> None:
    """Rank 0 joins the group, watching the others meanwhile: one that ends before it joins (a bad
    input, a missing device) would leave rank 0 waiting for the group's whole timeout."""
    import torch.distributed as dist

    failed: list[BaseException] = []

    def join() -> None:
        try:
            dist.init_process_group(_backend(device_name), rank=0, world_size=world)
        except BaseException as err:  # said below, by the thread that waits
            failed.append(err)

    joining = threading.Thread(target=join, daemon=True)  # left waiting where a rank never comes
    joining.start()
    while joining.is_alive():
        joining.join(0.2)
        if joining.is_alive() and (ended := _ended(children, wait=0.0)):
            raise TrainfitError(f"rank {ended[0][0]} of {world} ended ({ended[0][1]}) before the ranks joined, so "
                                "the run did not start", f"see its lines above, fix the cause, then: {again}")
    if failed:
        raise TrainfitError(f"the ranks could not join: {failed[0]}", f"fix the cause, then: {again}")


def _check_devices(world: int, device_name: str) -> None:
    """On GPUs, a rank a device: more ranks than this machine's GPUs are refused before any starts."""
    if not device_name.startswith("cuda"):
        return
    import torch

    if torch.cuda.device_count() < world:
        raise TrainfitError(f"this config trains on {world} GPUs, and this machine has {torch.cuda.device_count()}",
                            "train it on a machine with as many, or plan a config of fewer processes")


def _ended(children: list[subprocess.Popen[bytes]], wait: float = 0.5) -> list[tuple[int, str]]:
    """The ranks that ended, each with how (a signal's name, or an exit status); ``wait``: for the other
    side of a broken collective, its exit being recorded."""
    time.sleep(wait)
    out = []
    for r, child in enumerate(children, 1):
        code = child.poll()
        if code is not None and code != 0:
            out.append((r, signal.Signals(-code).name if code < 0 else f"exit status {code}"))
    return out


def _backend(device_name: str) -> str:
    return "nccl" if device_name.startswith("cuda") else "gloo"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _watch_parent(parent: int) -> None:
    """Exit when rank 0 is gone (killed: its collectives would never come)."""
    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True).start()


def rank_main(job_path: str) -> int:
    """A rank other than 0 (see the module): join the group and train its share, deciding nothing."""
    import torch.distributed as dist

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)  # rank 0 hears them and stops everyone with a save
    job = json.loads(Path(job_path).read_text())
    _watch_parent(int(job["parent"]))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(_backend(job["device"]), rank=rank, world_size=world)
    try:
        # local: the training package imports this module (rank 0's side)
        from trainfit.train import train_rank

        train_rank(job)
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    return 0

