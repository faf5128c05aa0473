"""The parent side of a probe: prepare the request, run the child, turn any ending into a
Measurement. The caller survives whatever the child does."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainfit.data.stats import LengthStats, count_longer_than
from trainfit.params import Params
from trainfit.probe.measurement import Measurement
from trainfit.probe.worker import EVENT_PREFIX
from trainfit.spec import GiB, Spec

EventCallback = Callable[[dict[str, Any]], None]


def resolve_device_name(name: str) -> str:
    """``auto`` -> ``cuda:0`` or ``cpu`` (decided in the parent so the child's memory cap fits the device)."""
    import torch

    if name == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        from trainfit.step import Unsupported

        raise Unsupported(f"probe.device is {name} but no CUDA GPU is visible", "use probe.device: cpu or auto")
    return "cuda:0" if name == "cuda" else name


def build_request(spec: Spec, params: Params, stats: LengthStats | None, device: str) -> dict[str, Any]:
    """Everything the child needs, JSON-ready. Lengths are chosen here, from the data analysis:
    the worst case is the ``batch_size`` longest samples; typical batches draw from a uniform sample."""
    notes: list[str] = []
    truncated: int | None = None
    if stats is None:
        assert params.max_length is not None, "a spec without data has params.max_length (validated)"
        max_length = params.max_length
        worst = [max_length] * params.batch_size
        typical = [max_length]
        notes.append(f"no dataset: every sample is assumed to be max_length={max_length} long")
    else:
        max_length = params.max_length if params.max_length is not None else stats.max
        worst = stats.longest_lengths(params.batch_size)
        typical = stats.length_sample
        truncated, exact = count_longer_than(stats, max_length)
        if truncated:
            notes.append(f"{'' if exact else '~'}{truncated:,} of {stats.samples:,} samples "
                         f"({truncated / stats.samples:.2%}) are longer than max_length={max_length} "
                         "and are truncated")
    return {
        "model": json.loads(json.dumps(spec.to_dict()["model"])),
        "params": params.to_dict(),
        "probe": json.loads(json.dumps(spec.to_dict()["probe"])),
        "device": device,
        "max_length": max_length,
        "worst_lengths": worst,
        "typical_lengths": typical,
        "truncated_samples": truncated,
        "memory_cap_bytes": int(spec.budget.memory_gb * GiB) if spec.budget.memory_gb else None,
        "budget_memory_gb": spec.budget.memory_gb,
        "budget_headroom_gb": spec.budget.headroom_gb,
        "notes": notes,
    }


def _describe_exit(rc: int) -> tuple[str, str]:
    """(status, message) for a child that ended without writing a result."""
    if rc < 0:
        sig = signal.Signals(-rc)
        if sig == signal.SIGKILL:
            return "oom", "the probe was killed by SIGKILL, most likely by the operating system's OOM killer"
        return "error", f"the probe process died of {sig.name}"
    return "error", f"the probe process exited with code {rc} without a result"


def run_child(request: dict[str, Any], timeout_s: float, workdir: Path,
              on_event: EventCallback | None = None) -> Measurement:
    """Run ``trainfit.probe.worker`` on ``request`` in its own process group; never raises for
    anything the child does."""
    workdir.mkdir(parents=True, exist_ok=True)
    req_path, res_path, log_path = workdir / "request.json", workdir / "result.json", workdir / "probe.log"
    res_path.unlink(missing_ok=True)
    request = {**request, "spawned_at": time.time()}
    req_path.write_text(json.dumps(request))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainfit.probe.worker", str(req_path), str(res_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: a timeout kills compile workers too
    )
    tail: collections.deque[str] = collections.deque(maxlen=30)

    def pump() -> None:
        assert proc.stdout is not None
        with log_path.open("w") as log:
            for raw in proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                if line.startswith(EVENT_PREFIX):
                    if on_event is not None:
                        try:
                            on_event(json.loads(line[len(EVENT_PREFIX):]))
                        except (ValueError, Exception):  # a display problem never stops a probe
                            pass
                    continue
                log.write(line + "\n")
                tail.append(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    reader.join(timeout=5)
    wall = time.perf_counter() - start
    base = {"config": request["params"], "device": request["device"], "wall_time_s": wall,
            "memory_cap_bytes": request.get("memory_cap_bytes"),
            "budget_memory_gb": request.get("budget_memory_gb"),
            "budget_headroom_gb": request.get("budget_headroom_gb"),
            "truncated_samples": request.get("truncated_samples"), "notes": list(request.get("notes", []))}
    if res_path.exists() and not timed_out:
        data = json.loads(res_path.read_text())
        data["wall_time_s"] = wall
        from trainfit.probe.measurement import SCHEMA_VERSION

        data["schema_version"] = SCHEMA_VERSION
        return Measurement.from_dict(data)
    output = "\n".join(tail)
    if timed_out:
        status, message = "timeout", f"the probe did not finish within {timeout_s:g} s and was killed"
    else:
        status, message = _describe_exit(proc.returncode)
    if output:
        message += "\nlast output:\n" + output
    return Measurement(status=status, message=message, **base)


def run_probe(
    spec: Spec,
    params: Params | None = None,
    *,
    stats: LengthStats | None = None,
    on_event: EventCallback | None = None,
    workdir: str | Path | None = None,
) -> Measurement:
    """Measure ``params`` (default: ``spec.params``) in a child process.

    ``stats`` is the dataset's length analysis; without it, it is computed (and cached) from
    ``spec.data``.
    """
    params = params or spec.params
    if stats is None and spec.data is not None:
        from trainfit.data.analyze import analyze_spec

        stats = analyze_spec(spec, progress=False)
    device = resolve_device_name(spec.probe.device)
    request = build_request(spec, params, stats, device)
    if workdir is not None:
        return run_child(request, spec.probe.timeout_s, Path(workdir), on_event)
    with tempfile.TemporaryDirectory(prefix="trainfit-probe-") as tmp:
        return run_child(request, spec.probe.timeout_s, Path(tmp), on_event)
