"""A tiny TTS-style acoustic model for trainfit's custom-factory workload.

Mel frames go through a small Transformer encoder; a diffusion head learns to predict the noise
added to each target frame, at ``ddpm_batch_mul`` noise levels per frame (as VibeVoice's
``ddpm_batch_mul``): more samples per frame, more memory and compute in the head.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import trainfit

N_MELS = 32


class TinyTTS(nn.Module):
    def __init__(self, d_model: int = 64, layers: int = 2, heads: int = 4, ddpm_batch_mul: int = 4) -> None:
        super().__init__()
        self.d_model, self.layers, self.ddpm_batch_mul = d_model, layers, ddpm_batch_mul
        self.inp = nn.Linear(N_MELS, d_model)
        self.encoder = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, batch_first=True)
            for _ in range(layers))
        self.head = nn.Sequential(nn.Linear(d_model + N_MELS + 1, 4 * d_model), nn.SiLU(),
                                  nn.Linear(4 * d_model, N_MELS))
        self.checkpointing = False

    def gradient_checkpointing_enable(self) -> None:
        self.checkpointing = True

    def forward(self, mels: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        h = self.inp(mels)
        for layer in self.encoder:
            if self.checkpointing:
                h = checkpoint(layer, h, None, pad_mask, use_reentrant=False)
            else:
                h = layer(h, src_key_padding_mask=pad_mask)
        # Diffusion loss: ddpm_batch_mul noisy copies of every real frame.
        real = ~pad_mask
        cond, target = h[real], mels[real]
        cond = cond.repeat(self.ddpm_batch_mul, 1)
        target = target.repeat(self.ddpm_batch_mul, 1)
        t = torch.rand(target.shape[0], 1, device=target.device, dtype=target.dtype)
        noise = torch.randn_like(target)
        noisy = torch.sqrt(1 - t) * target + torch.sqrt(t) * noise
        pred = self.head(torch.cat([cond, noisy, t], dim=-1))
        return nn.functional.mse_loss(pred.float(), noise.float())


def make_workload(params: trainfit.Params, device: torch.device) -> trainfit.CustomWorkload:
    mul = int(params.extra.get("ddpm_batch_mul", 4))
    model = TinyTTS(ddpm_batch_mul=mul).to(device)
    enc_params = sum(p.numel() for p in model.encoder.parameters()) + sum(p.numel() for p in model.inp.parameters())
    head_params = sum(p.numel() for p in model.head.parameters())

    def make_batch(lengths: list[int], pad_to: int) -> dict[str, torch.Tensor]:
        mels = torch.randn(len(lengths), pad_to, N_MELS)
        pad_mask = torch.arange(pad_to).unsqueeze(0) >= torch.tensor(lengths).unsqueeze(1)
        return {"mels": mels.to(device), "pad_mask": pad_mask.to(device)}

    def flops_per_sample(frames: int) -> float:
        # 6 FLOPs per parameter per frame (fwd+bwd) in the encoder and, ddpm_batch_mul times,
        # in the head; plus the attention matmuls (PaLM: 12 * layers * d_model * T per frame).
        return 6 * enc_params * frames + 12 * model.layers * model.d_model * frames**2 + 6 * head_params * frames * mul

    def collate(rows: list[dict]) -> dict[str, torch.Tensor]:
        # `trainfit train` feeds real rows here. The bundled speech.csv has durations and text, no
        # audio: each clip's mel frames stand in as noise seeded by its utt_id (a real collate loads
        # the clip's features); the lengths, the padding and the padding mask are the real ones.
        frames = [min(round(float(r["duration_s"]) * 100), params.max_length) for r in rows]
        pad_to = params.padded_length(max(frames), params.max_length)  # padding and pad_to_multiple_of, as probed
        mels = torch.zeros(len(rows), pad_to, N_MELS)
        for i, (r, n) in enumerate(zip(rows, frames, strict=True)):
            g = torch.Generator().manual_seed(int(str(r["utt_id"]).removeprefix("utt")))
            mels[i, :n] = torch.randn(n, N_MELS, generator=g)
        pad_mask = torch.arange(pad_to).unsqueeze(0) >= torch.tensor(frames).unsqueeze(1)
        return {"mels": mels, "pad_mask": pad_mask}  # on the CPU: trainfit moves them (loader workers can't use CUDA)

    return trainfit.CustomWorkload(
        model=model,
        make_batch=make_batch,
        collate=collate,
        loss=lambda m, inputs: m(**inputs),
        flops_per_sample=flops_per_sample,
    )
