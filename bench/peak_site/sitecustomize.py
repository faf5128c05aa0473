"""Put this folder on PYTHONPATH and every Python process started under it prints its peak memory
as it exits (trl_fidelity.py runs the written `trl sft` command this way: `trl` starts `accelerate
launch`, which starts the training script in a child process, whose peak is the one to compare).

The line is ``TRAINFIT_PEAK {json}``: the command line, the process's peak RSS (VmHWM, its own
address space) and, where CUDA was used, the allocator's max reserved and allocated bytes.
"""

import atexit
import json
import sys


def _report() -> None:
    peak = {"argv": sys.argv[:1], "rss_bytes": None}
    try:
        with open("/proc/self/status") as f:
            peak["rss_bytes"] = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))
    except (OSError, StopIteration):
        pass
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        peak.update(cuda_reserved_bytes=torch.cuda.max_memory_reserved(),
                    cuda_allocated_bytes=torch.cuda.max_memory_allocated())
    print("TRAINFIT_PEAK " + json.dumps(peak), flush=True)


atexit.register(_report)
