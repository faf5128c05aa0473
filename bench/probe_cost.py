"""What a probe costs, this tree against another (issue 19: at most +30% over the probe before the
epoch estimate): `trainfit probe` on the bundled example at each batch size, default probe
settings, alternating the two trees so a drift of the machine hits both alike.

    git worktree add /tmp/before 3f7abc3     # the tree to compare with (here: before issue 19)
    python bench/probe_cost.py --other /tmp/before/src [--batches 1,2,4,8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import dump  # noqa: E402


def probe(src: Path, batch: int, extra: list[str]) -> dict[str, float]:
    """One `trainfit probe` run from the trainfit package under ``src``: wall time and phases."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "m.json"
        env = {**os.environ, "PYTHONPATH": str(src)}
        subprocess.run([sys.executable, "-m", "trainfit", "probe", str(ROOT / "examples" / "tiny-llama.yaml"),
                        "--set", f"batch_size={batch}", *(a for e in extra for a in ("--set", e)),
                        "--json", str(out), "--quiet"], env=env, check=True, capture_output=True)
        m = json.loads(out.read_text())
    return {"wall_s": m["wall_time_s"], "timed_s": m["phases_s"]["timed"], "burn_in_s": m["phases_s"]["burn_in"],
            "samples_per_second": m["samples_per_second"], "steps": m["steps_measured"], "stable": m["stable"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--other", type=Path, required=True, help="the src/ folder of the trainfit tree to compare")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--set", action="append", default=["probe.max_seconds=60"], dest="extra",
                    help="spec overrides for both trees (default: the probe's own max_seconds, 60)")
    args = ap.parse_args()
    trees = {"this": ROOT / "src", "other": args.other}
    runs: dict[str, dict[int, list[dict[str, float]]]] = {k: {} for k in trees}
    for r in range(args.rounds):
        for b in map(int, args.batches.split(",")):
            for name, src in (trees.items() if r % 2 == 0 else reversed(trees.items())):
                runs[name].setdefault(b, []).append(probe(src, b, args.extra))
                print(f"round {r + 1} batch {b} {name}: {runs[name][b][-1]}", file=sys.stderr, flush=True)
    table = {b: {name: {k: statistics.median(x[k] for x in runs[name][b]) for k in ("wall_s", "timed_s", "burn_in_s")}
                 for name in trees} for b in runs["this"]}
    for row in table.values():
        row["wall_ratio"] = row["this"]["wall_s"] / row["other"]["wall_s"]  # type: ignore[index]
    dump("probe_cost", {"other": str(args.other), "overrides": args.extra, "rounds": args.rounds, "batches": table,
                        "raw": runs})


if __name__ == "__main__":
    main()
