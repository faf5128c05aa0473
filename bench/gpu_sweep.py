"""GPU figures of issue 2: a ~1.1B Llama-shaped random-init model (TinyLlama-1.1B's shape), bf16,
SDPA, sequence 2048 (fixed padding), LoRA r=16 and full fine-tuning, batch sizes 1..16:
samples/s, MFU, peak reserved memory, probe wall time; and whether the peak under
`set_per_process_memory_fraction` (budget.memory_gb) matches an unconstrained run. The loss is
computed as `trl sft` does (TRL's fused LM head, `loss: auto`); mode `lora_r16_full_logits`
measures LoRA with the model's own loss over the full logits (what transformers' Trainer runs).

    python bench/gpu_sweep.py                 # on a CUDA machine
    python bench/gpu_sweep.py --modes lora_r16 --results sweep.json   # then --modes full, same file:
                                              # each call fits a time limit; a cut-off call resumes
    python bench/gpu_sweep.py --tiny --cpu    # smoke run of this script on a CPU
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Results, dump  # noqa: E402

LLAMA_1B = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
            "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000,
            "max_position_embeddings": 2048}
LLAMA_1B_OVERRIDES = [f"model.config.{k}={v}" for k, v in LLAMA_1B.items() if k != "model_type"]
"""The same shape as ``--set`` overrides of a Llama spec (the bundled example's, in other benchmarks)."""
LORA = ["lora_r=16", "lora_target_modules=all-linear"]
MODES = {"lora_r16": LORA, "full": [],
         # The model's own loss over the full logits (transformers Trainer), against lora_r16's TRL fused head.
         "lora_r16_full_logits": [*LORA, "loss=model", "tune.command_template=python train.py"]}
TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 2048}


def spec_path(config: dict, device: str, seq: int) -> Path:
    doc = {"model": {"config": config},
           "params": {"max_length": seq, "padding": "max_length", "precision": "bf16", "attention": "sdpa"},
           "probe": {"device": device, "max_seconds": 20, "timeout_s": 600}}
    path = Path(tempfile.mkdtemp()) / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def main() -> None:
    from trainfit.probe import run_probe
    from trainfit.spec import load_spec

    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--modes", default="lora_r16,full", help=f"any of {', '.join(MODES)}")
    ap.add_argument("--results", type=Path, help="keep results here as they come; a second call resumes")
    args = ap.parse_args()
    seq = 256 if args.tiny else 2048
    path = spec_path(TINY if args.tiny else LLAMA_1B, "cpu" if args.cpu else "cuda", seq)
    results = Results(args.results)
    for mode in args.modes.split(","):
        for b in map(int, args.batches.split(",")):
            row = results.get(f"{mode}/{b}")
            if row is None:
                m = run_probe(load_spec(path, [f"batch_size={b}", *MODES[mode]]))
                row = results.put(f"{mode}/{b}", {
                    "mode": mode, "batch_size": b, "status": m.status, "samples_per_second": m.samples_per_second,
                    "tokens_per_second": m.tokens_per_second, "mfu": m.mfu, "hfu": m.hfu,
                    "peak_reserved_gb": m.peak_memory_gb,
                    "peak_allocated_gb": None if m.peak_allocated_bytes is None else m.peak_allocated_bytes / 1024**3,
                    "memory_parts_gb": {k: v / 1024**3 for k, v in m.memory_parts_bytes.items()},
                    "alloc_retries": m.alloc_retries, "stable": m.stable, "probe_wall_s": m.wall_time_s,
                    "phases_s": m.phases_s, "message": (m.message or "")[:300] or None})
                print(row, file=sys.stderr, flush=True)
            if row["status"] == "oom":
                break
    rows = [v for k, v in results.data.items() if "/" in k]
    # The cap: the largest LoRA config that ran, again under a budget just above its own peak.
    fits = [r for r in rows if r["mode"] == "lora_r16" and r["status"] == "ok"]
    cap_check = results.get("cap")
    if fits and cap_check is None:
        top = fits[-1]
        budget = round(top["peak_reserved_gb"] * 1.15 + 0.5, 1)
        m = run_probe(load_spec(path, [f"batch_size={top['batch_size']}", *LORA,
                                       f"budget.memory_gb={budget}", "budget.headroom_gb=0.1"]))
        cap_check = results.put("cap", {"batch_size": top["batch_size"], "memory_gb_cap": budget, "status": m.status,
                                        "peak_uncapped_gb": top["peak_reserved_gb"],
                                        "peak_capped_gb": m.peak_memory_gb})
    dump("gpu_sweep", {"model": "tiny" if args.tiny else "llama-1.1B-shape", "seq": seq, "rows": rows,
                       "memory_fraction_check": cap_check})


if __name__ == "__main__":
    main()
