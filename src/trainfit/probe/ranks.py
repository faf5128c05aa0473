"""A probe of a config that trains on several processes (``nproc_per_node`` > 1): its ranks started
through torchrun (``torch.distributed.run``, standalone) by the worker, and their results made into
one measurement. torchrun puts each rank in a session of its own; they stay the worker's
descendants, which a timeout or the worker's end takes with it (the supervisor, a subreaper, ends
what is left), and torchrun ends the other ranks when one fails.

Each rank (``probe/rank_main.py``) runs the probe's phases on its own device with the model under
DDP or FSDP2 (:func:`distribute`), every rank on the worst-case batch (each rank of a real run may
draw the longest samples), the step times agreed between the ranks (the slowest rank's, so every
rank stops timing at the same step). Memory is per rank: the largest peak decides whether the config
fits. A rank that runs out of memory makes the config's status ``oom``.

Imports are light (no torch at the top), as the worker's are."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainfit.errors import TrainfitError, Unsupported

if TYPE_CHECKING:
    from trainfit.params import Params
    from trainfit.probe.request import ProbeRequest

RANK_FILE = "rank-{rank}.json"


def is_distributed() -> bool:
    """Whether this process is one rank of a multi-process probe."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def run_ranks(req: ProbeRequest, out: dict[str, Any], scratch: Path | None = None) -> None:
    """Start ``req``'s ranks through torchrun, wait for them, and put their merged result in ``out``.
    Their files go to a folder in ``scratch`` (the probe's own, which its runner owns: a probe killed
    mid-way leaves nothing in the system's temp folder)."""
    import torch

    # local: the workloads load in the worker's process only, after it answers its supervisor
    from trainfit.workloads.step import check_support

    n = req.params.nproc_per_node
    check_support(req.params, torch.device(req.device))  # a knob no rank can run: refused before torchrun starts
    _check_room(n, req.device)
    with tempfile.TemporaryDirectory(prefix="trainfit-ranks-", dir=scratch) as tmp:
        folder = Path(tmp)
        logs = (scratch or folder) / RANK_LOGS  # kept with the probe's folder where it has one: this run's alone
        shutil.rmtree(logs, ignore_errors=True)
        (folder / "request.json").write_text(req.to_json())
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               f"--nproc_per_node={n}", "--log-dir", str(logs), "--redirects", "3", "--tee", "3",
                               "-m", "trainfit.probe.rank_main", str(folder / "request.json"), str(folder)], check=False)
        ranks = [json.loads(p.read_text()) for p in sorted(folder.glob("rank-*.json"))]
        said = rank_output(logs, kept=scratch is not None)
    if not ranks:
        raise TrainfitError(f"torchrun ended (exit {done.returncode}) before any of its {n} ranks wrote a result", said)
    merge_ranks(ranks, n, out, said)


RANK_LOGS = "rank-logs"
"""The folder, in the probe's own, where torchrun keeps each rank's output (``RUN/attempt_0/RANK/stdout.log``
and ``stderr.log``); the probe's log holds it too, each line marked with its rank."""


def _check_room(n: int, device: str) -> None:
    """Refuse, before torchrun starts, ranks this machine cannot run side by side: more than its GPUs,
    or on a CPU more than two a core (each gloo rank waits its turn for a core, and the probe ran into its
    timeout, 15 minutes on, without a word)."""
    import torch

    if device.startswith("cuda"):
        if torch.cuda.device_count() < n:
            raise Unsupported(f"nproc_per_node={n} needs {n} GPUs, and this machine has {torch.cuda.device_count()}",
                              "probe on a machine with as many, or lower nproc_per_node", knob="nproc_per_node",
                              value=n)
        return
    cores = cpu_cores()
    if n > 2 * cores:
        raise Unsupported(f"nproc_per_node={n} starts {n} processes on this machine's {cores} CPU cores: each rank "
                          "would wait its turn for a core, and the probe would run into its timeout",
                          f"on a CPU, give nproc_per_node {2 * cores} at most (2 a core), or probe on a machine with "
                          f"{n} GPUs", knob="nproc_per_node", value=n)


def cpu_cores() -> int:
    """The CPU cores this process may run on: its affinity, and a container's quota (cgroup v2's
    ``cpu.max``) where it is lower."""
    import math
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


def rank_output(logs: Path, *, kept: bool) -> str:
    """What a failed multi-process probe says of its ranks' output: the last line each rank wrote to
    its stderr, and where each rank's output is (the probe's log otherwise: the folder is a temporary one)."""
    last = []
    for path in sorted(logs.glob("*/attempt_*/*/stderr.log"), key=lambda p: int(p.parent.name)):
        lines = path.read_text(errors="replace").strip().splitlines() if path.is_file() else []
        if lines:
            last.append(f"rank {path.parent.name}'s last line: {lines[-1].strip()}")
    where = f"each rank's output: {logs}/*/attempt_0/RANK/stderr.log" if kept else \
        "each rank's output is in the probe's log, its lines marked [RANK]"
    return "; ".join([*last, where])


def merge_ranks(ranks: list[dict[str, Any]], n: int, out: dict[str, Any], said: str = "") -> None:
    """One measurement of the ranks' results: a failing rank's (an OOM first), else rank 0's with
    the largest peak and each rank's (``rank_peak_memory_bytes``). ``said``: the ranks' output, for
    the error where a rank died without a result (:func:`rank_output`)."""
    failed = [r for r in ranks if r.get("status", "ok") != "ok"]
    if failed or len(ranks) < n:
        worst = next((r for r in failed if r["status"] == "oom"), failed[0] if failed else None)
        if worst is None:
            raise TrainfitError(f"only {len(ranks)} of the {n} ranks wrote a result: another one died",
                                said or "see the probe's log for its output")
        _take(worst, out)
        out["message"] = f"rank {worst['rank']} of {n}: {worst.get('message', '')}"
        return
    _take(min(ranks, key=lambda r: r["rank"]), out)
    peaks = [int(r.get("peak_memory_bytes") or 0) for r in ranks]
    largest = ranks[peaks.index(max(peaks))]
    out.update(peak_memory_bytes=max(peaks), rank_peak_memory_bytes=peaks,
               memory_parts_bytes=largest.get("memory_parts_bytes", {}), world_size=n)


def _take(rank: dict[str, Any], out: dict[str, Any]) -> None:
    """``rank``'s fields into ``out``, its notes after ``out``'s (each once); the config stays the request's."""
    out.update({k: v for k, v in rank.items() if k not in ("notes", "config", "rank")})
    out["notes"] += [note for note in rank.get("notes", []) if note not in out["notes"]]


def agreed(seconds: float) -> float:
    """The slowest rank's ``seconds`` (every rank gets the same), or ``seconds`` in a single process:
    every rank then decides alike when to stop timing."""
    if not is_distributed():
        return seconds
    import torch
    import torch.distributed as dist

    value = torch.tensor([seconds], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        value = value.cuda()
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


def distribute(model: Any, params: Params, device: Any) -> Any:
    """``model`` as its rank trains it: under DDP (a whole copy, gradients all-reduced in backward),
    or FSDP2 on the units accelerate's ``fsdp2_prepare_model`` (1.15, 1.16) shards under ``TRANSFORMER_BASED_WRAP``
    (:func:`shard_units`: the blocks, the input embedding, the final norm with the LM head kept gathered
    after forward, the root), so a rank's peak is the one ``accelerate launch --use_fsdp --fsdp_version 2``
    trains with. The model in a single process, unchanged."""
    if not is_distributed():
        return model
    if params.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if params.parallel == "fsdp":
        shard_units(model, fsdp_policies(params))
        return model
    raise TrainfitError(f"nproc_per_node={params.nproc_per_node} with parallel: none: the processes would train "
                        "apart", "set parallel: ddp or fsdp")


def shard_units(model: Any, policies: dict[str, Any]) -> None:
    """``fully_shard`` on ``model``'s units in place, as accelerate's ``fsdp2_prepare_model`` (1.15, 1.16)
    (accelerate/utils/fsdp_utils.py) makes them under ``TRANSFORMER_BASED_WRAP``, in its order:

    1. each module, children before parents (``get_module_children_bottom_up``), that is an instance of
       a class named in the model's own ``_no_split_modules`` (``fsdp2_prepare_auto_wrap_policy``;
       transformers gathers its submodels' there), with ``policies``;
    2. the input embedding (``get_input_embeddings``), unless the LM head shares its weight, with ``policies``;
    3. one unit of the final norm (``_find_final_norm``: the last direct child of the base model whose
       class name holds "Norm") and the LM head (``get_output_embeddings``), with the input embedding
       when the head shares its weight, kept gathered from forward to backward
       (``reshard_after_forward=False``, whatever ``policies`` say);
    4. the whole model, its ``reshard_after_forward`` left to torch (None: the root keeps what no unit
       took, e.g. GPT-2's position embedding, gathered from forward to backward).

    A factory model without those methods or names gets step 4, and step 3 with a "Norm" child. Frozen
    bitsandbytes 4-bit weights (``Params4bit`` of integer storage: QLoRA's base) are left out of every
    unit (``ignored_params``), whole on each rank, as accelerate leaves them."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    # bitsandbytes' frozen 4-bit weights (uint8 storage) stay whole on every rank, as accelerate leaves them
    # (its quantization state would not survive the conversion to a sharded DTensor).
    frozen_4bit = {p for p in model.parameters() if type(p).__name__ == "Params4bit" and not p.requires_grad
                   and not p.is_floating_point() and not p.is_complex()}
    if frozen_4bit:
        policies = {**policies, "ignored_params": frozen_4bit}
    is_block = _block_policy(model)
    for module in _bottom_up(model)[:-1]:
        if is_block(module) and not isinstance(module, FSDPModule):
            fully_shard(module, **policies)
    embed = getattr(model, "get_input_embeddings", lambda: None)()
    head = getattr(model, "get_output_embeddings", lambda: None)()
    weight = getattr(embed, "weight", None)
    tied = weight is not None and weight is getattr(head, "weight", None)
    if not tied and embed is not None and not isinstance(embed, FSDPModule):
        fully_shard(embed, **policies)
    # Tied: the embedding comes first, so the unit gathers at the forward's start, where it is used first;
    # the head stays in the unit, as torch refuses a parameter two units see.
    tail = [m for m in ((_final_norm(model), embed, head) if tied else (_final_norm(model), head))
            if m is not None and not isinstance(m, FSDPModule)]
    if tail:
        fully_shard(tail, **{**policies, "reshard_after_forward": False})
    if not isinstance(model, FSDPModule):
        fully_shard(model, **{**policies, "reshard_after_forward": None})


def _block_policy(model: Any) -> Callable[[Any], bool]:
    """Whether a module of ``model`` is a block FSDP shards on its own: the installed accelerate's
    ``fsdp2_prepare_auto_wrap_policy`` under ``TRANSFORMER_BASED_WRAP`` (the classes ``_no_split_modules``
    names, through a checkpoint wrapper), so the probe's units follow each release. Without accelerate,
    a copy of 1.16's (:func:`_block_classes`). A name that stops accelerate (1.15 stopped at any the
    model has no module of) is an error here too."""
    try:
        from accelerate.utils import FullyShardedDataParallelPlugin
        from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy
    except ImportError:
        blocks = _block_classes(model)
        return lambda module: bool(blocks) and isinstance(getattr(module, "_checkpoint_wrapped_module", module), blocks)
    with _no_fsdp_environment():
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
    try:
        policy = fsdp2_prepare_auto_wrap_policy(plugin, model)
    except ValueError as e:
        raise TrainfitError(f"the model's _no_split_modules stops accelerate's TRANSFORMER_BASED_WRAP: {e}",
                            "name only the model's own block classes in _no_split_modules") from None
    return policy or (lambda module: False)


def _block_classes(model: Any) -> tuple[type, ...]:
    """The classes named in ``model._no_split_modules`` that ``model`` has a module of, each the first
    module of that name's (accelerate 1.16's ``get_module_class_from_name``; a name the model does not
    instantiate is passed over, as 1.16 passes it)."""
    found: dict[str, type] = {}
    for module in model.modules():
        found.setdefault(type(module).__name__, type(module))
    names = list(getattr(model, "_no_split_modules", None) or ())
    return tuple(found[name] for name in names if name in found)


def _bottom_up(model: Any) -> list[Any]:
    """``model``'s modules in accelerate's ``get_module_children_bottom_up`` order (``model`` last): a
    depth-first walk's, children pushed on a stack in order, reversed."""
    stack: list[Any] = [model]
    ordered: list[Any] = []
    while stack:
        module = stack.pop()
        stack.extend(module.children())
        ordered.append(module)
    return ordered[::-1]


def _final_norm(model: Any) -> Any:
    """The final norm as accelerate's ``_find_final_norm`` finds it: the last direct child of the base
    model (``base_model_prefix``'s attribute, the model itself without one) whose class name holds
    "Norm"; None for none (peft's wrapper, whose prefix names the causal LM: its norm stays in the root)."""
    import torch

    prefix = getattr(model, "base_model_prefix", "")
    base = getattr(model, prefix, None) if prefix else model
    if not isinstance(base, torch.nn.Module):
        return None
    norms = [child for child in base.children() if "Norm" in type(child).__name__]
    return norms[-1] if norms else None


def fsdp_policies(params: Params) -> dict[str, Any]:
    """``fully_shard``'s settings for a config, as accelerate makes them from the run's flags:
    resharding after forward; with ``precision`` bf16 or fp16 (the trainer's ``--bf16``/``--fp16``,
    accelerate's mixed precision) the ``MixedPrecisionPolicy`` of ``mixed_precision_policy``;
    ``fsdp_cpu_offload`` (accelerate's ``--fsdp_offload_params``): ``CPUOffloadPolicy``."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    out: dict[str, Any] = {"reshard_after_forward": params.fsdp_reshard_after_forward}
    if params.precision in ("bf16", "fp16"):
        out["mp_policy"] = mixed_precision_policy(params.precision)
    if params.fsdp_cpu_offload:
        out["offload_policy"] = CPUOffloadPolicy()
    return out


def mixed_precision_policy(precision: str) -> Any:
    """The FSDP2 ``MixedPrecisionPolicy`` the run gets for ``precision`` (bf16 or fp16): the installed
    accelerate's own (its plugin's ``set_mixed_precision``), so the probe holds what the run holds
    whatever the release. Without accelerate (nothing it launches could run then), a copy of 1.16's:
    weights gathered and gradients reduced in that dtype, the outputs left as computed (1.15 and
    older also cast them, ``output_dtype``)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    try:
        from accelerate.utils import FullyShardedDataParallelPlugin
    except ImportError:
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
    with _no_fsdp_environment():
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    plugin.set_mixed_precision(precision)
    return plugin.mixed_precision_policy


@contextlib.contextmanager
def _no_fsdp_environment() -> Iterator[None]:
    """While accelerate's FSDP plugin is built here: without the ``FSDP_*`` variables of this shell, which
    it reads (``FSDP_TRANSFORMER_CLS_TO_WRAP`` over ``_no_split_modules``, say). What the probe copies is
    what the written command's flags make, whatever the shell that ran the probe held."""
    import os

    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("FSDP_")}
    try:
        yield
    finally:
        os.environ.update(saved)
