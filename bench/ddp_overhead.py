"""Issue 33's figure: what a multi-process probe adds to a step. The 2-rank DDP probe of the bundled
tiny Llama (no dataset: every sample max_length long, so both sides run the same shapes; the model's
own loss, fp32, gloo on this CPU) against a bare 2-rank DDP loop of the same model and batch (ids,
attention mask, labels): plain torch and transformers under torchrun, no trainfit in the loop (the model built from the same config,
``DistributedDataParallel``, AdamW, gradients clipped at 1.0 as the probe's step does). Each step's
seconds are the slower rank's on both sides. Pairs run back to back (probe, then bare), so the
machine's drift hits both alike; the goal is a median ratio <= 1.05.

    python bench/ddp_overhead.py [--rounds 5] [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import dump  # noqa: E402

EXAMPLE = ROOT / "examples" / "tiny-llama.yaml"
BATCH, LENGTH, RANKS = 4, 512, 2


def overrides(steps: int) -> list[str]:
    return [f"batch_size={BATCH}", "gradient_accumulation_steps=1", f"max_length={LENGTH}", "padding=max_length",
            "loss=model", "precision=fp32",
            f"nproc_per_node={RANKS}", "parallel=ddp", "probe.burn_in_steps=5", f"probe.min_steps={steps}",
            f"probe.max_steps={steps}", "probe.max_seconds=600", "probe.target_rel_ci=0.0000001"]


def spec_without_data() -> Path:
    import yaml

    doc = yaml.safe_load(EXAMPLE.read_text())
    for key in ("data", "tokenizer", "search"):
        doc.pop(key, None)
    doc["tune"] = {"command_template": "python train.py --batch_size {batch_size}"}  # a trainer of the full logits
    path = Path(tempfile.mkdtemp()) / "tiny-llama-nodata.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def probe_once(spec: Path, steps: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "m.json"
        cmd = [sys.executable, "-m", "trainfit", "probe", str(spec), "--quiet", "--json", str(out)]
        for o in overrides(steps):
            cmd += ["--set", o]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if not out.exists():
            raise SystemExit(f"the probe wrote no result (exit {done.returncode}):\n{done.stderr[-2000:]}")
        m = json.loads(out.read_text())
    assert m["status"] == "ok" and m["world_size"] == RANKS, m.get("message")
    return {"step_time_median_s": m["step_time_median_s"], "steps": m["steps_measured"],
            "communication_share": m.get("communication_share")}


def bare_once(spec: Path, steps: int) -> float:
    """The bare loop's median step (the slower rank's), under torchrun as the probe's ranks are."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bare.json"
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               f"--nproc_per_node={RANKS}", __file__, "--bare", str(spec), str(steps), str(out)],
                              capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"the bare loop failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
        return float(json.loads(out.read_text())["step_time_median_s"])


def bare_rank(spec_path: Path, steps: int, out: Path) -> None:
    """One rank of the bare loop: build, wrap, 7 untimed steps (the probe's 2 memory + 5 burn-in), then time."""
    import torch
    import torch.distributed as dist
    import yaml
    from torch.nn.parallel import DistributedDataParallel
    from transformers import AutoConfig, AutoModelForCausalLM

    dist.init_process_group("gloo")
    config = dict(yaml.safe_load(spec_path.read_text())["model"]["config"])
    model_type = config.pop("model_type")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **config), attn_implementation="sdpa")
    model.config.use_cache = False
    model = DistributedDataParallel(model.train())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, model.module.config.vocab_size, (BATCH, LENGTH))
    mask = torch.ones_like(ids)  # the batch as a trainer's collator gives it (and the probe times it)

    def step() -> None:
        model(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(7):
        step()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        out.write_text(json.dumps({"step_time_median_s": statistics.median(slowest.tolist())}))
    dist.destroy_process_group()


def main() -> None:
    if sys.argv[1:2] == ["--bare"]:
        bare_rank(Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60, help="timed steps on each side")
    args = ap.parse_args()
    spec = spec_without_data()
    probes, bares = [], []
    for r in range(args.rounds):
        probes.append(probe_once(spec, args.steps))
        bares.append(bare_once(spec, args.steps))
        print(f"round {r + 1}: probe {probes[-1]['step_time_median_s']:.4f} s, bare {bares[-1]:.4f} s",
              file=sys.stderr, flush=True)
    ratios = [p["step_time_median_s"] / b for p, b in zip(probes, bares)]
    dump("ddp_overhead", {
        "case": f"tiny Llama, {RANKS} ranks DDP (gloo, OMP_NUM_THREADS=1 each as torchrun sets), batch {BATCH} x "
                f"{LENGTH}, fp32, loss: model, {args.steps} timed steps a side",
        "cpu_count": os.cpu_count(),
        "probe_step_time_median_s": [round(p["step_time_median_s"], 5) for p in probes],
        "bare_step_time_median_s": [round(b, 5) for b in bares],
        "paired_ratios": [round(x, 4) for x in ratios], "ratio_median": statistics.median(ratios),
        "probe_communication_share": [p["communication_share"] for p in probes]})


if __name__ == "__main__":
    main()
