"""A factory whose input pipeline decodes audio, for bench/input_pipeline.py: the tiny TTS model of
examples/tiny_tts.py trained on mel features its ``collate`` computes from each row's WAV file
(read in full, a short-time Fourier transform at 100 frames a second, a fixed mel-like projection),
as a speech model's data loader does on a CPU. The features are made in the loader's workers
(CPU tensors); trainfit moves them to the device."""

from __future__ import annotations

import sys
import wave
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from tiny_tts import N_MELS  # noqa: E402
from tiny_tts import make_workload as tiny_tts  # noqa: E402

import trainfit  # noqa: E402

RATE, HOP, FFT = 16_000, 160, 1024  # 100 frames a second


def features(path: str, repeats: int = 1) -> torch.Tensor:
    """Log-magnitude spectrogram frames of the file, projected to N_MELS bins: (frames, N_MELS).
    ``repeats`` computes the spectrogram that many times, standing in for a heavier pipeline
    (decoding a compressed file, resampling, augmenting) at the same model cost."""
    with wave.open(path, "rb") as f:
        audio = np.frombuffer(f.readframes(f.getnframes()), dtype=np.int16).astype(np.float32) / 32768
    for _ in range(repeats - 1):
        torch.stft(torch.from_numpy(audio), FFT, hop_length=HOP, window=torch.hann_window(FFT), return_complex=True)
    spec = torch.stft(torch.from_numpy(audio), FFT, hop_length=HOP, window=torch.hann_window(FFT),
                      return_complex=True, center=False).abs().T  # (frames, FFT // 2 + 1)
    bank = torch.Generator().manual_seed(0)
    projection = torch.rand(FFT // 2 + 1, N_MELS, generator=bank)
    return torch.log1p(spec @ projection)


def make_workload(params: trainfit.Params, device: torch.device) -> trainfit.CustomWorkload:
    """examples/tiny_tts.py's workload, its collate making the features from each row's file."""
    made = tiny_tts(params, device)
    root = Path(str(params.extra["audio_root"]))
    repeats = int(params.extra.get("decode_repeats", 1))

    def collate(rows: list[dict]) -> dict[str, torch.Tensor]:
        feats = [features(str(root / r["path"]), repeats)[: params.max_length] for r in rows]
        frames = [len(x) for x in feats]
        pad_to = params.padded_length(max(frames), params.max_length)
        mels = torch.zeros(len(rows), pad_to, N_MELS)
        for i, x in enumerate(feats):
            mels[i, : len(x)] = x
        pad_mask = torch.arange(pad_to).unsqueeze(0) >= torch.tensor(frames).unsqueeze(1)
        return {"mels": mels, "pad_mask": pad_mask}

    made.collate = collate
    return made
