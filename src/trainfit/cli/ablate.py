"""``trainfit ablate``: what each speed/memory technique buys, measured on your model and data."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainfit.ablate import AGAIN
from trainfit.ablate.outputs import (
    ABLATION_FILE,
    HEADER,
    PAGE_FILE,
    ablate_into,
    cells,
    refuse_if_held,
    rows_to_reuse,
    together_notes,
)
from trainfit.cli import COMMANDS
from trainfit.cli.common import add_spec_arguments, interrupted, spec_from_args, stats_from_args
from trainfit.errors import TrainfitError
from trainfit.format import fmt_num, table

if TYPE_CHECKING:
    from trainfit.ablate import Ablation, Row

EPILOG = """\
examples:
  trainfit ablate examples/tiny-llama.yaml
  trainfit ablate examples/tiny-tts.yaml --output runs/tts-ablation
  trainfit ablate my.yaml --set batch_size=8 --device cuda --output runs/abl --resume   # after an interruption

A baseline with every technique off (fp32, eager attention, no checkpointing, no TF32, no compile,
plain AdamW, padding to the batch's longest) is probed, then each technique alone on top of it,
then the baseline again (the machine's drift), then the techniques that helped, together (faster
beyond the interval or 5% less memory; not what changes what is learned). Each row is a real
probe: samples/s and its ratio to the baseline with a 95% interval, peak memory and its change,
the steps' own memory (activations, mostly) and MFU. A technique the device or the model cannot
run is listed as unavailable with the reason. The in-house guide's claimed figures are shown beside.
Writes OUTPUT/ablation.json (after each row: --resume reuses the rows measured) and ablation.html.
"""


ONLY_WORDS = ("checkpointing", "SDPA", "flash", "precision", "bf16", "fp16", "TF32", "AdamW", "fused", "8-bit",
              "padding", "compile", "LoRA", "QLoRA", "4-bit")
"""Words of the techniques' names that ``--only`` takes (a test checks each picks one)."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("ablate", help=COMMANDS["ablate"],
                       description="Probe a baseline with every technique off, each technique alone, and all "
                                   "together, on the spec's model and data.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                       allow_abbrev=False)  # the resume hint repeats the flags as typed: each in full
    add_spec_arguments(p)
    p.add_argument("--output", help="output folder (default: a new trainfit-runs/SPEC_NAME/ablate-TIMESTAMP)")
    p.add_argument("--only", metavar="WORDS", help="only the techniques whose names hold one of these comma-separated "
                                                   "words, e.g. --only checkpointing,precision. Words that pick "
                                                   "techniques: " + ", ".join(ONLY_WORDS))
    p.add_argument("--resume", action="store_true", help="reuse the rows --output's ablation.json already holds")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from datetime import datetime

    only = [w.strip() for w in (args.only or "").split(",") if w.strip()]
    if args.only is not None and not only:
        raise TrainfitError("--only names no technique (it is empty)",
                            "give words of the techniques' names, e.g. --only checkpointing,precision; or leave it out")
    spec = spec_from_args(args)
    out = Path(args.output) if args.output else \
        Path("trainfit-runs") / Path(args.spec).stem / datetime.now().strftime("ablate-%Y%m%d-%H%M%S")
    refuse_if_held(out)  # a folder a running ablation holds, or one that cannot be resumed or written over,
    rows_to_reuse(out, spec, args.resume)  # is refused before counting (ablate_into checks both again, holding it)
    stats = stats_from_args(args, spec)
    print(f"trainfit ablate: {spec.source} -> {out}")
    try:
        result = ablate_into(out, spec, resume=args.resume, only=only, stats=stats,
                             on_row=lambda row: print(f"  {row_line(row)}", flush=True),
                             on_note=lambda note: print(f"  note: {note}", flush=True))
    except KeyboardInterrupt as err:
        return interrupted(err, args.argv, out, f"the rows measured are kept in {out / ABLATION_FILE}")
    print()
    print(render(result))
    print(f"\nwrote {out / ABLATION_FILE}, {out / PAGE_FILE}")
    if result.rows[0].status != "ok":
        print("the baseline (every technique off) did not run, so nothing was compared: make it fit first, "
              "e.g. --set batch_size=1 or --memory-gb", file=sys.stderr)
        return 1
    return 0


def row_line(row: Row) -> str:

    if row.status != "ok":
        return f"{row.name}: {row.status.upper()}" + (f" ({row.reason})" if row.reason else "")
    ratio = f", x{row.speedup:.2f}" if row.speedup is not None else ""
    return f"{row.name}: {fmt_num(row.samples_per_second or 0)} samples/s{ratio}, peak {row.peak_gb or 0:.2f} GiB"


def render(result: Ablation) -> str:

    lines = [(f"ABLATION on {result.device} (each technique alone over the baseline, then the ones that helped "
              "together; ratios against the mean of the baseline's two probes)"),
             table([cells(r) for r in result.rows], HEADER)]
    if any(r.name == AGAIN and r.status == "ok" for r in result.rows):
        lines.append(f"the baseline's two probes differ by {result.drift:.1%} in speed (the machine's drift): every "
                     "interval includes it")
    if any(r.changes_learning for r in result.rows):
        lines.append("* changes what is learned (LoRA, a shorter max_length): not put together with the others")
    lines += together_notes(result)
    lines.append(f"claims: {result.claim_source}; measured here on your model, data and device")
    return "\n".join(lines)
