"""Helpers shared by the benchmarks: the environment line every result records."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trainfit.devices import cpu_name, versions


def environment() -> dict[str, object]:
    import torch

    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else cpu_name(),
            "torch_threads": torch.get_num_threads(), "versions": versions()}


def write_wav(path: Path, samples: bytes, rate: int = 16_000) -> None:
    """A mono 16-bit WAV file of ``samples`` (little-endian int16), through the standard library."""
    import wave

    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(samples)


def dump(name: str, result: dict[str, object]) -> None:
    out = {"benchmark": name, "environment": environment(), **result}
    print(json.dumps(out, indent=2, default=str))


class Results:
    """A long benchmark's results in a JSON file, saved as each one comes: the same command run
    again (after a time limit cut it off) skips what is done. ``path=None`` keeps them in memory."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.data: dict[str, Any] = json.loads(path.read_text()) if path and path.exists() else {}

    @classmethod
    def of_setup(cls, args: Any) -> Results:
        """``args.results`` for the run ``args`` describes (every option but ``rounds`` and
        ``results``): a file holding another setup's results is refused, not mixed in."""
        results = cls(args.results)
        setup = {k: v for k, v in vars(args).items() if k not in ("rounds", "results")}
        if results.get("setup") not in (None, setup):
            raise SystemExit(f"{args.results} holds results of another setup ({results.get('setup')}): "
                             "give another file")
        results.put("setup", setup)
        return results

    def get(self, key: str) -> Any:
        return self.data.get(key)

    def put(self, key: str, value: Any) -> Any:
        self.data[key] = value
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, indent=2, default=str))
            tmp.replace(self.path)
        return value
