"""Custom factories for tests: a working one with a custom knob, and ones that crash, hang or fail."""

from __future__ import annotations

import os
import sys
import time

import torch

import trainfit


class Tiny(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, width)
        self.out = torch.nn.Linear(width, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.proj(x))).pow(2).mean()


def scaled(params: trainfit.Params, device: torch.device) -> trainfit.CustomWorkload:
    """`width_mul` is a custom knob: it multiplies the hidden width (and so FLOPs and memory)."""
    width = 16 * int(params.extra["width_mul"])
    model = Tiny(width).to(device)
    n = sum(p.numel() for p in model.parameters())
    return trainfit.CustomWorkload(
        model=model,
        make_batch=lambda lengths, pad_to: torch.randn(len(lengths), pad_to, 8, device=device),
        loss=lambda m, x: m(x),
        flops_per_sample=lambda length: 6.0 * n * length,
    )


def learnable(params: trainfit.Params, device: torch.device) -> trainfit.CustomWorkload:
    """`scaled` that also trains on real rows: each row's `frames` (n x 8 numbers), zero-padded to
    the batch's longest. `sleep_s` (a custom knob) lengthens each micro-batch, as a larger model's
    would, so a test can interrupt a run mid-way; `collate_sleep_s` lengthens each collate, as a
    loader decoding audio would; `hold_mb` makes the model hold that much memory."""
    made = scaled(params, device)
    if params.extra.get("hold_mb"):  # a custom knob: memory the model holds (its pages written, so resident)
        made.model.register_buffer("held", torch.ones(int(params.extra["hold_mb"]) * 2**18, device=device))
    pause = float(params.extra.get("sleep_s", 0.0))
    nan_after = params.extra.get("nan_after")  # a custom knob: the loss is NaN from this call on
    times = float(params.extra.get("loss_times", 1.0))  # a custom knob: a large, finite loss (fp16 gradients overflow)
    loss = made.loss
    calls = [0]

    dropout = float(params.extra.get("dropout", 0.0))  # a custom knob: random numbers drawn at every step

    def slow_loss(m: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        time.sleep(pause)
        x = torch.nn.functional.dropout(x, dropout) if dropout else x
        calls[0] += 1
        return loss(m, x).float() * times * (float("nan") if nan_after is not None and calls[0] > nan_after else 1.0)

    made.loss = slow_loss

    collate_pause = float(params.extra.get("collate_sleep_s", 0.0))  # a custom knob: a slow input pipeline

    def collate(rows: list[dict]) -> torch.Tensor:
        time.sleep(collate_pause)
        longest = max(len(r["frames"]) for r in rows)
        x = torch.zeros(len(rows), longest, 8)
        for i, r in enumerate(rows):
            x[i, : len(r["frames"])] = torch.tensor(r["frames"])
        return x.to(params.extra.get("collate_device", "cpu"))  # on the CPU (a custom knob: elsewhere): trainfit moves it

    made.collate = collate
    return made


def crash(params: trainfit.Params, device: torch.device) -> trainfit.CustomWorkload:
    os.abort()


def hang(params: trainfit.Params, device: torch.device) -> trainfit.CustomWorkload:
    time.sleep(3600)
    raise AssertionError("unreachable")


def broken(params: trainfit.Params, device: torch.device) -> trainfit.CustomWorkload:
    raise ValueError("the factory could not read its config")


def environment(params: trainfit.Params, device: torch.device) -> trainfit.CustomWorkload:
    """Fails on purpose, naming what the worker's environment holds."""
    names = ("TOKENIZERS_PARALLELISM", "PYTHONUNBUFFERED", "ARROW_DEFAULT_MEMORY_POOL")
    raise ValueError(" ".join(f"{k}={os.environ.get(k)}" for k in names))


def bare_memory_error(params: trainfit.Params, device: torch.device) -> trainfit.CustomWorkload:
    """An allocation failure with no message, as Python raises when a cap is hit mid-import."""
    raise MemoryError()


def rank_fails(params: trainfit.Params, device: torch.device) -> trainfit.CustomWorkload:
    """`scaled`, except on rank 1 of a multi-process probe, which does what `rank_failure` says:
    `abort` (a crash), `oom` (torch's CPU allocator refusing), or `hang`."""
    if os.environ.get("RANK") == "1":
        failure = params.extra["rank_failure"]
        if failure == "abort":
            print("rank 1 aborts now", file=sys.stderr, flush=True)
            os.abort()
        if failure == "oom":
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] . DefaultCPUAllocator: can't allocate memory: "
                               "you tried to allocate 1099511627776 bytes. Error code 12 (Cannot allocate memory)")
        time.sleep(3600)
    return scaled(params, device)
