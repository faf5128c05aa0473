"""Helpers shared by the benchmarks: the environment line every result records."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from trainfit.devices import cpu_name, versions


def environment() -> dict[str, object]:
    import torch

    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else cpu_name(),
            "torch_threads": torch.get_num_threads(), "versions": versions()}


def dump(name: str, result: dict[str, object]) -> None:
    out = {"benchmark": name, "environment": environment(), **result}
    print(json.dumps(out, indent=2, default=str))
