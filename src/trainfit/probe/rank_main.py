"""One rank of a multi-process probe (``probe/ranks.py``), as torchrun starts it:
``python -m trainfit.probe.rank_main REQUEST FOLDER``. It joins the process group (gloo on a CPU,
NCCL on GPUs, a GPU a rank), runs the worker's probe of the request on its device and writes its
result to ``FOLDER/rank-K.json``; it exits non-zero when its probe failed, so torchrun ends the
other ranks."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from trainfit.files import write_atomically
from trainfit.probe.events import open_channel
from trainfit.probe.ranks import RANK_FILE
from trainfit.probe.request import ProbeRequest
from trainfit.probe.worker import ModelCache, probe


def main(argv: list[str]) -> int:
    started = time.time()
    import torch.distributed as dist

    request, folder = Path(argv[0]), Path(argv[1])
    req = ProbeRequest.from_json(request.read_text())
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    if req.device.startswith("cuda"):
        req = replace(req, device=f"cuda:{local}")
    # FSDP's CPU offload keeps the shards on the host, where clipping reduces over them: gloo beside NCCL,
    # as accelerate's state sets it up for FSDP_OFFLOAD_PARAMS.
    backend = "gloo" if not req.device.startswith("cuda") else \
        "cuda:nccl,cpu:gloo" if req.params.fsdp_cpu_offload else "nccl"
    dist.init_process_group(backend)
    open_channel(os.open(os.devnull, os.O_WRONLY))  # the worker's events channel is not a rank's
    out = {**probe(req, ModelCache(), spawned_at=started), "rank": rank}
    write_atomically(folder / RANK_FILE.format(rank=rank), json.dumps(out))
    if out.get("status", "ok") != "ok":
        os._exit(1)  # at once: a process group's teardown may wait on the peers this rank left in a collective
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
