"""GPU comparison of issue 4: the config `trainfit tune` finds vs the Hugging Face Trainer's
defaults and its `auto_find_batch_size`, under the same memory budget.

A ~1.1B Llama-shaped random-init model (TinyLlama-1.1B's shape), SDPA, a generated long-tailed
dataset of up to 2048 tokens per sample. Steps:
1. `trainfit tune` (auto) searches batch size x gradient checkpointing x precision under
   `--budget-gb` and reports its pick and how long the search took;
2. three Hugging Face Trainer runs, each in its own process capped with
   `torch.cuda.set_per_process_memory_fraction(budget / total)`: the defaults
   (per_device_train_batch_size=8, fp32, the default optimizer), the defaults plus
   `auto_find_batch_size=True`, and trainfit's pick translated to TrainingArguments;
   each trains `--steps` timed steps after `--warmup` steps and reports samples/s and peak memory.

    python bench/gpu_tune_compare.py [--budget-gb 40]     # on a CUDA machine
    python bench/gpu_tune_compare.py --work DIR --tune-budget-s 420   # resumable: run it again with
                                                          # the same DIR after a time limit cut it off
    python bench/gpu_tune_compare.py --tiny --cpu         # smoke run of this script on a CPU
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Results, dump  # noqa: E402
from gpu_sweep import LLAMA_1B, TINY  # noqa: E402
from trainfit.tune.options import TuneOptions
from trainfit.spec import with_tune

RESULT = "@@result "
OPTIM = {"adamw": "adamw_torch", "adamw_fused": "adamw_torch_fused", "adamw_8bit": "adamw_bnb_8bit"}


def write_lengths(path: Path, n: int, max_len: int, seed: int = 0) -> None:
    """Log-normal sample lengths (median ~max_len/4, a long tail clipped at max_len)."""
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(n):
            f.write(json.dumps({"length": max(8, min(max_len, int(rng.lognormvariate(0, 0.6) * max_len / 4)))}) + "\n")


def run_trainfit(config: dict, data: Path, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from trainfit.spec import build_spec
    from trainfit.tune import tune

    doc = {"model": {"config": config}, "data": {"path": str(data), "length_field": "length"},
           # The pick trains in the Hugging Face Trainer, whose loss is the model's own over the full logits.
           "params": {"max_length": args.seq, "attention": "sdpa", "optimizer": args.optimizer, "padding": "longest",
                      "loss": "model"},
           "tune": {"command_template": "hf-trainer --per_device_train_batch_size {batch_size}"},
           "budget": {"memory_gb": args.budget_gb, "headroom_gb": args.headroom_gb},
           "probe": {"device": "cpu" if args.cpu else "cuda", "max_seconds": args.probe_seconds},
           "search": {"batch_size": [1, 2, 4, 8, 16, 32, 64], "gradient_checkpointing": [False, True],
                      "precision": ["bf16", "fp32"] if not args.cpu else ["fp32"]}}
    from trainfit.search.events import TrialEnd

    spec = build_spec(doc, base_dir=Path.cwd())
    start = time.perf_counter()
    res = tune(with_tune(spec, time_budget_s=args.tune_budget_s), TuneOptions(
        output=out, resume=(out / "study.journal").exists(),
        on_event=lambda e: isinstance(e, TrialEnd) and print(
            f"  trainfit trial {e.index}: {e.values} -> {e.measurement.status} "
            f"{e.measurement.samples_per_second}", file=sys.stderr, flush=True), calibrate_steps=0))
    assert res.best is not None, "trainfit found no config that fits"
    best = res.best.measurement
    return {"search_wall_s_this_call": time.perf_counter() - start, "probe_time_s": res.summary.probe_time_s,
            "stop_reason": res.stop_reason, "probes": len(res.trials),
            "oom_probes": sum(t.measurement.status == "oom" for t in res.trials),
            "pick": best.config, "probe_samples_per_second": best.samples_per_second,
            "probe_peak_gb": best.peak_memory_gb}


def hf_run(job: dict[str, Any]) -> dict[str, Any]:
    """One Hugging Face Trainer run (in a child process of its own)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments

    cuda = torch.cuda.is_available() and not job["cpu"]
    if cuda and job["budget_gb"]:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, job["budget_gb"] * 1024**3 / total), 0)
    cfg = dict(job["config"])
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    rng = torch.Generator().manual_seed(0)
    lengths = [json.loads(line)["length"] for line in Path(job["data"]).read_text().splitlines()]
    dataset = [{"input_ids": torch.randint(config.vocab_size, (n,), generator=rng)} for n in lengths]

    def collate(rows: list[dict[str, Any]]) -> dict[str, Any]:
        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r["input_ids"])] = r["input_ids"]
            mask[i, :len(r["input_ids"])] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.marks: list[float] = []

        def on_train_begin(self, *a: Any, **k: Any) -> None:
            self.marks = []  # auto_find_batch_size restarts training after an OOM

        def on_step_end(self, *a: Any, **k: Any) -> None:
            if cuda:
                torch.cuda.synchronize()
            self.marks.append(time.perf_counter())

    clock = Clock()
    targs = TrainingArguments(output_dir=job["out"], max_steps=job["warmup"] + job["steps"], report_to="none",
                              save_strategy="no", logging_strategy="no", disable_tqdm=True, use_cpu=not cuda,
                              **job["args"])
    trainer = Trainer(model=model, args=targs, train_dataset=dataset, data_collator=collate, callbacks=[clock])
    out: dict[str, Any] = {"args": job["args"]}
    start = time.perf_counter()
    try:
        trainer.train()
    except torch.OutOfMemoryError as err:
        return {**out, "status": "oom", "message": str(err).splitlines()[0][:200]}
    timed = clock.marks[job["warmup"]:]
    batch = trainer._train_batch_size  # after auto_find_batch_size, the size it settled on
    samples = batch * targs.gradient_accumulation_steps * (len(timed) - 1)
    return {**out, "status": "ok", "train_batch_size": batch, "wall_s": time.perf_counter() - start,
            "samples_per_second": samples / (timed[-1] - timed[0]),
            "peak_reserved_gb": torch.cuda.max_memory_reserved() / 1024**3 if cuda else None}


def hf_args(pick: dict[str, Any]) -> dict[str, Any]:
    """TrainingArguments for a trainfit config (the knobs this comparison searches)."""
    return {"per_device_train_batch_size": pick["batch_size"],
            "gradient_accumulation_steps": pick["gradient_accumulation_steps"],
            "gradient_checkpointing": pick["gradient_checkpointing"], "bf16": pick["precision"] == "bf16",
            "fp16": pick["precision"] == "fp16", "optim": OPTIM[pick["optimizer"]]}


def spawn_hf(job: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--hf-job", json.dumps(job)], capture_output=True, text=True,
                          check=False)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT):])
    return {"args": job["args"], "status": "error", "message": proc.stderr[-1500:]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-gb", type=float, default=40.0)
    ap.add_argument("--headroom-gb", type=float, default=1.0)
    ap.add_argument("--optimizer", default="adamw_fused")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--probe-seconds", type=float, default=15.0)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--work", type=Path, help="keep the search and the runs here; the same command again resumes")
    ap.add_argument("--tune-budget-s", type=float, help="start no probe after this long (per call)")
    ap.add_argument("--hf-job", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hf_job:
        print(RESULT + json.dumps(hf_run(json.loads(args.hf_job))), flush=True)
        return
    if args.tiny:
        args.steps, args.warmup = min(args.steps, 6), min(args.warmup, 2)
        args.probe_seconds = min(args.probe_seconds, 2)
    args.seq = 256 if args.tiny else 2048
    config = TINY if args.tiny else LLAMA_1B
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-tune-compare-"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / "lengths.jsonl"
    write_lengths(data, 2000, args.seq)
    results = Results(work / "results.json")
    found = results.get("trainfit")
    if found is None or found["stop_reason"].startswith("time budget"):  # a search cut short goes on
        found = results.put("trainfit", run_trainfit(config, data, args, work / "tune"))
    if found["stop_reason"].startswith("time budget"):
        print(f"search cut short by --tune-budget-s: run the same command again to continue ({work})",
              file=sys.stderr)
        dump("gpu_tune_compare", {"status": "search_incomplete", "work": str(work), "trainfit": found})
        return
    base = {"config": config, "data": str(data), "cpu": args.cpu, "budget_gb": args.budget_gb,
            "warmup": args.warmup, "steps": args.steps, "out": str(work / "hf")}
    runs = {}
    for name, targs in (("hf_defaults", {}), ("hf_auto_find_batch_size", {"auto_find_batch_size": True}),
                        ("trainfit_pick", hf_args(found["pick"]))):
        key = f"{name} {json.dumps(targs, sort_keys=True)}"  # a resumed search may pick another config
        runs[name] = results.get(key) or results.put(key, spawn_hf({**base, "args": targs}))
        print(f"  {name}: {runs[name]}", file=sys.stderr, flush=True)
    pick = runs["trainfit_pick"].get("samples_per_second")
    ratios = {name: pick / r["samples_per_second"] if pick and r.get("samples_per_second") else None
              for name, r in runs.items() if name != "trainfit_pick"}
    dump("gpu_tune_compare", {"model": "tiny" if args.tiny else "llama-1.1B-shape", "seq": args.seq,
                              "budget_gb": args.budget_gb, "trainfit": found, "hf_trainer": runs,
                              "pick_samples_per_s_over": ratios})


if __name__ == "__main__":
    main()
