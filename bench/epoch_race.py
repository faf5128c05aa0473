"""Issue 30's GPU figures: trainfit's pick against Hugging Face's ``auto_find_batch_size``, each
training one whole epoch in the same Trainer under one memory cap.

The case (our own, not the issue's): a ~0.5B Qwen2-shaped causal LM, random init (hidden 896, 24
layers, 14 heads / 2 KV heads, a 151,936-token vocabulary, so the logits hold most of the
activation memory), LoRA r=16 on the attention projections, bf16, SDPA; generated long-tailed
samples (median ~max_length/4, a tail clipped at max_length 2048); a 24 GiB cap (a 3090/4090-class
card), ``budget.memory_gb`` for trainfit and ``torch.cuda.set_per_process_memory_fraction`` for the
Trainer runs.

1. ``trainfit tune`` over batch sizes 1-64 (``auto`` reaches the integers between the powers of two)
   x gradient checkpointing: its wall time, its pick and its epoch estimate (``tune.epochs: 1``).
   Its ``tune.command_template`` is the Trainer run of step 3 (``--trainer``) with ``--max_steps
   {max_steps}``, so on a GPU tune times 30 real Trainer steps of its pick by default and ranks and
   estimates with the Trainer's own cost (``--calibrate N`` sets the steps; a CPU needs it).
2. The Hugging Face Trainer with ``auto_find_batch_size=True`` from batch 64: one epoch; its wall
   time includes the OOM restarts.
3. The same Trainer with trainfit's pick: one epoch; then again with length-grouped batches.
Each Trainer run is a process of its own (a fresh CUDA context and cap). Reported: each epoch's
wall time, the pick's over the peer's (the goal: at most 0.5), tune + epoch over the peer's whole
path (goal: at most 0.6), and the estimate's error against the pick's real epoch (goal: 10%).
Every result is kept in ``--work``'s results.json as it comes: the same command resumes.

    python bench/epoch_race.py                        # on a CUDA machine (about 8 minutes on an H100)
    python bench/epoch_race.py --tiny --cpu           # a rehearsal on a CPU with a tiny model
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Results, dump  # noqa: E402
from gpu_sweep import TINY  # noqa: E402
from trainfit.tune.options import TuneOptions

QWEN_05B = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
            "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
            "max_position_embeddings": 4096, "tie_word_embeddings": True}
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
RESULT = "@@result "


def write_lengths(path: Path, n: int, max_len: int, seed: int = 0) -> None:
    """Log-normal sample lengths: median ~max_len/4, ~3% clipped at max_len."""
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(n):
            f.write(json.dumps({"length": max(8, min(max_len, int(rng.lognormvariate(0, 0.75) * max_len / 4)))}) + "\n")


def run_tune(args: argparse.Namespace, data: Path, out: Path) -> dict[str, Any]:
    from trainfit.search.events import TrialEnd
    from trainfit.spec import build_spec
    from trainfit.tune import tune

    doc = {"model": {"config": args.config}, "data": {"path": str(data), "length_field": "length"},
           # The pick trains in the Hugging Face Trainer, whose loss is the model's own over the full logits.
           "params": {"max_length": args.seq, "attention": "sdpa", "precision": args.precision, "loss": "model",
                      "lora_r": 16, "lora_alpha": 32, "lora_target_modules": ATTENTION},
           # The Trainer run below, as a command a calibration can stop by {max_steps}: the default on a GPU.
           "tune": {"command_template": trainer_template(args, data, out), "epochs": 1},
           "budget": {"memory_gb": args.budget_gb, "headroom_gb": args.headroom_gb},
           "probe": {"device": "cpu" if args.cpu else "cuda"},
           "search": {"batch_size": [1, 2, 4, 8, 16, 32, 64], "gradient_checkpointing": [False, True],
                      # Liger's fused linear cross-entropy, as the Trainer's use_liger_kernel applies it (CUDA only)
                      **({"loss": ["model", "liger"]} if args.liger else {}),
                      # TRL's packing: fewer, fuller padding-free steps (a step then holds more samples)
                      **({"packing": [False, True]} if args.packing else {})}}
    spec = build_spec(doc, base_dir=Path.cwd())
    start = time.perf_counter()
    res = tune(spec, TuneOptions(
        output=out, resume=(out / "study.journal").exists(),
        on_event=lambda e: isinstance(e, TrialEnd) and print(
            f"  trial {e.index}: {e.values} -> {e.measurement.status} {e.measurement.samples_per_second}",
            file=sys.stderr, flush=True),
        calibrate_steps=args.calibrate, calibration_optional=args.calibrate is None,  # None: tune's default
        on_calibration=lambda line: print(f"  calibration: {line}", file=sys.stderr, flush=True)))
    best = res.summary.best_config
    assert best is not None, "trainfit found no config that fits"
    return {"tune_wall_s": time.perf_counter() - start, "probe_time_s": res.summary.probe_time_s,
            "probes": len(res.trials), "oom_probes": sum(t.measurement.status == "oom" for t in res.trials),
            "pick": best.config, "estimated_epoch_s": (best.estimated_full_runtime_hours or 0) * 3600,
            "probe_samples_per_second": best.samples_per_second,
            "pruned": [p.to_json() for p in res.summary.pruned], "stop_reason": res.stop_reason,
            "trainer_cost": portable(res.summary.trainer_cost.to_json(), out.parent) if res.summary.trainer_cost else None}


def portable(cost: dict[str, Any], work: Path) -> dict[str, Any]:
    """The trainer cost as a result file keeps it: its command without this machine's paths (the
    Python, the checkout, the work folder)."""
    command = str(cost["calibration"]["command"])
    for path, name in ((sys.executable, "python"), (str(Path(__file__).resolve().parent.parent), "."),
                       (str(work), "WORK")):
        command = command.replace(path, name)
    return {**cost, "calibration": {**cost["calibration"], "command": command}}


TRAINER_FLAGS = {"per_device_train_batch_size": int, "gradient_accumulation_steps": int, "max_steps": int,
                 "gradient_checkpointing": lambda v: v == "true", "use_liger_kernel": lambda v: v == "true",
                 "packing": lambda v: v == "true"}
"""What the Trainer run takes on its command line (``--trainer``), as the template fills it."""


def trainer_template(args: argparse.Namespace, data: Path, out: Path) -> str:
    """The command that trains a config in the Hugging Face Trainer, as ``tune.command_template``."""
    job = out.parent / "trainer-job.json"  # the run's fixed part (a file: JSON braces would read as placeholders)
    job.write_text(json.dumps({"config": args.config, "data": str(data), "cpu": args.cpu, "budget_gb": args.budget_gb,
                               "bf16": args.precision == "bf16", "out": str(out.parent / "template-run"),
                               "tqdm": True, "max_length": args.seq}))
    flags = " ".join(f"--{name} {{{knob}}}" for name, knob in (
        ("per_device_train_batch_size", "batch_size"), ("gradient_accumulation_steps", "gradient_accumulation_steps"),
        ("gradient_checkpointing", "gradient_checkpointing"), ("use_liger_kernel", "use_liger_kernel"),
        ("packing", "packing"), ("max_steps", "max_steps")))
    return f"{shlex.quote(sys.executable)} {shlex.quote(__file__)} --trainer {shlex.quote(str(job))} {flags}"


def trainer_command(argv: list[str]) -> None:
    """``--trainer JOB --flag value ...``: one Trainer run (``tune``'s template, run by its calibration)."""
    job = json.loads(Path(argv[0]).read_text())
    pairs = dict(zip(argv[1::2], argv[2::2], strict=True))
    job["args"] = {name.removeprefix("--"): TRAINER_FLAGS[name.removeprefix("--")](value) for name, value in pairs.items()}
    result = epoch_run(job)
    print(RESULT + json.dumps(result), flush=True)
    sys.exit(0 if result["status"] == "ok" else 1)


def epoch_run(job: dict[str, Any]) -> dict[str, Any]:
    """One epoch in the Hugging Face Trainer, in a process of its own."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments

    cuda = torch.cuda.is_available() and not job["cpu"]
    if cuda:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, job["budget_gb"] * 1024**3 / total), 0)
    cfg = dict(job["config"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg),
                                             attn_implementation="sdpa", dtype=torch.bfloat16 if job["bf16"] else None)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=ATTENTION, task_type="CAUSAL_LM"))
    vocab = job["config"]["vocab_size"]
    rng = torch.Generator().manual_seed(0)
    lengths = [json.loads(line)["length"] for line in Path(job["data"]).read_text().splitlines()]
    dataset = [{"input_ids": torch.randint(vocab, (n,), generator=rng)} for n in lengths]

    def collate(rows: list[dict[str, Any]]) -> dict[str, Any]:
        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r["input_ids"])] = r["input_ids"]
            mask[i, :len(r["input_ids"])] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}

    class Attempt(TrainerCallback):
        """The last attempt's start: auto_find_batch_size restarts training after each OOM."""

        started = 0.0

        def on_train_begin(self, *a: Any, **k: Any) -> None:
            self.started = time.perf_counter()

    attempt = Attempt()
    extra = dict(job["args"])
    if extra.pop("packing", False):  # TRL's packing and padding-free collator, as `trl sft --packing` trains
        from datasets import Dataset
        from trl.data_utils import pack_dataset
        from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

        dataset = pack_dataset(Dataset.from_dict({"input_ids": [r["input_ids"].tolist() for r in dataset]}),
                               job["max_length"], "bfd")
        collate = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
        extra["remove_unused_columns"] = False  # the collator reads each packed row's seq_lengths
    if extra.pop("group_by_length", False):  # transformers 5.2x names it a sampling strategy
        fields = TrainingArguments.__dataclass_fields__
        extra.update({"train_sampling_strategy": "group_by_length"} if "train_sampling_strategy" in fields
                     else {"group_by_length": True})
    targs = TrainingArguments(output_dir=job["out"], num_train_epochs=1, report_to="none", save_strategy="no",
                              logging_strategy="no", disable_tqdm=not job.get("tqdm"), use_cpu=not cuda,
                              bf16=job["bf16"],
                              gradient_checkpointing_kwargs={"use_reentrant": False}, **extra)
    trainer = Trainer(model=model, args=targs, train_dataset=dataset, data_collator=collate, callbacks=[attempt])
    start = time.perf_counter()
    try:
        trainer.train()
    except torch.OutOfMemoryError as err:
        return {"args": job["args"], "status": "oom", "message": str(err).splitlines()[0][:200]}
    end = time.perf_counter()
    return {"args": job["args"], "status": "ok", "train_batch_size": trainer._train_batch_size,
            "wall_s": end - start, "last_attempt_s": end - attempt.started, "samples": len(lengths),
            "peak_reserved_gb": torch.cuda.max_memory_reserved() / 1024**3 if cuda else None}


def spawn(job: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--job", json.dumps(job)], capture_output=True, text=True,
                          check=False)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT):])
    return {"args": job["args"], "status": "error", "message": proc.stderr[-1500:]}


def same_as_last_attempt(picked: dict[str, Any], peer: dict[str, Any]) -> bool:
    """Did auto_find_batch_size's last attempt train the pick's very config (then its epoch is the pick's)?"""
    return (peer.get("status") == "ok" and peer.get("train_batch_size") == picked["per_device_train_batch_size"]
            and picked["gradient_accumulation_steps"] == 1 and not picked["gradient_checkpointing"]
            and not picked.get("use_liger_kernel") and not picked.get("packing"))


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget-gb", type=float, default=24.0)
    ap.add_argument("--headroom-gb", type=float, default=1.0)
    ap.add_argument("--samples", type=int, default=3000, help="the epoch's samples (default: a few minutes on an H100)")
    ap.add_argument("--tiny", action="store_true", help="a tiny Llama and max_length 256, for a CPU rehearsal")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--liger", action="store_true",
                    help="let trainfit search loss: liger (the Trainer's use_liger_kernel; needs liger-kernel and CUDA)")
    ap.add_argument("--packing", action="store_true", help="let trainfit search packing: [false, true] (TRL's)")
    ap.add_argument("--calibrate", type=int, metavar="N",
                    help="real Trainer steps tune times for the trainer's cost (default: tune's: 30 on a GPU, none on a CPU)")
    ap.add_argument("--work", type=Path, help="results and runs here; the same command again resumes")
    ap.add_argument("--job", help=argparse.SUPPRESS)
    if sys.argv[1:2] == ["--trainer"]:
        trainer_command(sys.argv[2:])
        return
    args = ap.parse_args()
    if args.job:
        print(RESULT + json.dumps(epoch_run(json.loads(args.job))), flush=True)
        return
    args.config, args.seq = (TINY, 256) if args.tiny else (QWEN_05B, 2048)
    args.precision = "fp32" if args.cpu else "bf16"
    work = args.work or Path(tempfile.mkdtemp(prefix="epoch-race-"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / "lengths.jsonl"
    write_lengths(data, args.samples, args.seq)
    results = Results(work / "results.json")
    found = results.get("trainfit") or results.put("trainfit", run_tune(args, data, work / "tune"))
    print(f"  trainfit: {found}", file=sys.stderr, flush=True)
    pick = found["pick"]
    base = {"config": args.config, "data": str(data), "cpu": args.cpu, "budget_gb": args.budget_gb,
            "bf16": args.precision == "bf16", "out": str(work / "hf"), "max_length": args.seq}
    runs = {}
    picked = {"per_device_train_batch_size": pick["batch_size"],
              "gradient_accumulation_steps": pick["gradient_accumulation_steps"],
              "gradient_checkpointing": pick["gradient_checkpointing"],
              **({"use_liger_kernel": True} if pick.get("loss") == "liger" else {}),
              **({"packing": True} if pick.get("packing") else {})}
    # The third run asks what length grouping (not yet a knob trainfit turns) would add to the pick.
    for name, targs in (("hf_auto_find_batch_size", {"per_device_train_batch_size": 64, "auto_find_batch_size": True}),
                        ("trainfit_pick", picked), ("trainfit_pick_grouped", {**picked, "group_by_length": True})):
        key = f"{name} {json.dumps(targs, sort_keys=True)}"
        if name == "trainfit_pick" and same_as_last_attempt(picked, runs["hf_auto_find_batch_size"]):
            runs[name] = {**runs["hf_auto_find_batch_size"], "args": targs, "peak_reserved_gb": None, "wall_s": runs[
                "hf_auto_find_batch_size"]["last_attempt_s"], "note": "the config of HF's last attempt: its epoch, in a "
                "process its OOM restarts had warmed (its peak is theirs: not kept)"}
            continue
        runs[name] = results.get(key) or results.put(key, spawn({**base, "args": targs}))
        print(f"  {name}: {runs[name]}", file=sys.stderr, flush=True)
    mine, peer = runs["trainfit_pick"], runs["hf_auto_find_batch_size"]
    real = mine.get("last_attempt_s")
    dump("epoch_race", {
        "model": "tiny" if args.tiny else "qwen2-0.5B-shape", "max_length": args.seq, "samples": args.samples,
        "budget_gb": args.budget_gb, "trainfit": found, "hf_trainer": runs,
        "epoch_over_peer": ratio(mine.get("wall_s"), peer.get("wall_s")),
        "grouped_epoch_over_peer": ratio(runs["trainfit_pick_grouped"].get("wall_s"), peer.get("wall_s")),
        "tune_and_epoch_over_peer": ratio(found["tune_wall_s"] + (mine.get("wall_s") or 0), peer.get("wall_s")),
        "estimate_error": ratio(found["estimated_epoch_s"], real) and found["estimated_epoch_s"] / real - 1})


if __name__ == "__main__":
    main()
