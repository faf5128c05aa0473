"""How fast trainfit reads audio lengths (``data.audio_field``): each file's duration from its header,
against decoding each file in full (what a loader that reads the audio to measure it does).

    python bench/audio_lengths.py --files 400 --seconds 8

Writes FILES WAV files of SECONDS each (16 kHz mono 16-bit) into a temporary folder, counts their
lengths with ``count_lengths`` (no cache), then decodes every file's samples with the standard
library; prints files/s of each, best of ``--rounds``."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import wave
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import dump, write_wav  # noqa: E402

from trainfit.data import LengthRecipe, count_lengths  # noqa: E402


def write_wavs(folder: Path, files: int, seconds: float, rate: int = 16_000) -> Path:
    silence = b"\0\0" * int(seconds * rate)
    for i in range(files):
        write_wav(folder / f"{i}.wav", silence, rate)
    manifest = folder / "manifest.jsonl"
    manifest.write_text("".join(json.dumps({"path": f"{i}.wav"}) + "\n" for i in range(files)))
    return manifest


def decode_all(folder: Path, files: int) -> int:
    frames = 0
    for i in range(files):
        with wave.open(str(folder / f"{i}.wav"), "rb") as f:
            frames += len(f.readframes(f.getnframes())) // 2
    return frames


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=400)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        manifest = write_wavs(folder, args.files, args.seconds)
        header, decoded = [], []
        for _ in range(args.rounds):
            t = time.perf_counter()
            table = count_lengths(manifest, LengthRecipe(audio_field="path", length_scale=75), use_cache=False,
                                  progress=False)
            header.append(time.perf_counter() - t)
            t = time.perf_counter()
            decode_all(folder, args.files)
            decoded.append(time.perf_counter() - t)
        assert len(table.lengths) == args.files
    dump("audio_lengths", {"files": args.files, "seconds_each": args.seconds,
                           "header_files_per_s": round(args.files / min(header)),
                           "decode_files_per_s": round(args.files / min(decoded)),
                           "ratio": round(min(decoded) / min(header), 1)})


if __name__ == "__main__":
    main()
