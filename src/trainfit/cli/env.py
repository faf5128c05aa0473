"""``trainfit env``: what trainfit sees on this machine."""

from __future__ import annotations

import argparse
import json
from typing import Any

from trainfit.cli import COMMANDS
from trainfit.devices import describe_environment
from trainfit.format import table


def add_parser(sub: Any) -> None:
    p = sub.add_parser("env", help=COMMANDS["env"],
                       description="Show the devices, memory and versions a measurement would record.")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:

    info = describe_environment()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    rows = [("cpu", f"{info['cpu']} ({info['cpu_cores']} logical cores, native bf16: "
                    f"{'yes' if info['cpu_bf16_native'] else 'no'})"),
            ("ram", f"{info['ram_gb']} GiB")]
    gpus = info["gpus"]
    if not gpus:
        rows.append(("gpu", "none visible (probes run on CPU, whose peak FLOP/s are not on record: no MFU)"))
    for g in gpus:
        peak = f", peak bf16 {g['peak_bf16_tflops']:g} TFLOP/s" if g["peak_bf16_tflops"] else ", peak FLOP/s unknown"
        rows.append((f"gpu {g['index']}", f"{g['name']}, {g['memory_gb']} GiB, sm {g['capability']}, "
                                          f"bf16 {'yes' if g['bf16_supported'] else 'no'}{peak}"))
    for name, version in info["versions"].items():
        rows.append((name, version or "not installed"))
    print(table(rows))
    return 0
