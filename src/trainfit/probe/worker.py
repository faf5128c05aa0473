"""The probe's child process: build a configuration, measure it, write a Measurement.

Started by the runner (:func:`trainfit.probe.runner.worker_command`) with ``SPAWNED_AT PARENT_PID
PDEATHSIG EVENTS_FD`` (see :func:`main`); each line on stdin is a job,
``{"request": REQUEST.json, "result": RESULT.json, "reuse_model": true}`` (false: build the
request's model anew, the kept one dropped first). Whatever happens here (an OOM, a segfault
in a kernel, a hang) stays here: the parent reads RESULT.json or, when there is none, classifies
the exit. Progress goes to the event channel, a pipe of its own (:mod:`trainfit.probe.events`);
``result`` ends a job. The process the runner started stays behind as the worker's supervisor
(:mod:`trainfit.probe.supervisor`), which ends whatever the worker leaves running.

Imports at the top are light (no numpy, no torch): :func:`main` forks before any library has
started a thread.

A request with a ``model_key`` may be followed by another with the same key (the same config but
for the batch shape): it runs on the model this process already built, after the previous probe's
memory is returned and the peak counters restart. After any failed probe the process exits, so
the next probe gets a fresh one.

Phases: start (process + imports) -> build (model, knobs, optimizer) -> memory (optimizer steps on
the worst-case batch; AdamW allocates its state at the first step, so >= 2; at most two
micro-batches each, see :func:`~trainfit.probe.memory.memory_micro_batches`) -> burn_in (typical
batches, untimed: compile, cuDNN autotune, allocator warm-up) -> timed (typical batches at a few
shapes spread over the epoch's padded lengths, whose fitted cost gives the epoch's speed, until the
stop rule in :mod:`trainfit.probe.timing` says the estimate is stable).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import signal
import sys
import threading
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainfit.devices import device_label, peak_rss_bytes, reset_peak_rss, synchronize, versions
from trainfit.errors import TrainfitError, Unsupported
from trainfit.files import write_atomically
from trainfit.probe.events import emit, open_channel
from trainfit.probe.memory import (
    MemoryMeter,
    cap_memory,
    cpu_cap_explained,
    device_memory_gb,
    is_oom,
    memory_at_failure,
)
from trainfit.probe.phases import (
    Built,
    LossNotFinite,
    burn_in,
    capped_length,
    check_scaler,
    communication_share,
    check_loss,
    clearly_slower,
    epoch_fields,
    input_bound_note,
    measure_memory,
    speed_fields,
    time_steps,
    typical_batches,
)
from trainfit.probe.ranks import distribute, is_distributed, run_ranks
from trainfit.probe.supervisor import PARENT_POLL_S, PR_SET_PDEATHSIG, supervise

if TYPE_CHECKING:
    from trainfit.probe.request import ProbeRequest


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class ModelCache:
    """The one model a worker keeps between probes."""

    built: Built | None = None

    def take(self, key: str | None) -> Built | None:
        """The kept model if ``key`` matches it; otherwise the kept model is dropped first."""
        if key is not None and self.built is not None and self.built.key == key:
            return self.built
        if self.built is not None:
            self.built = None
            gc.collect()
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        return None


def run(req: ProbeRequest, out: dict[str, Any], cache: ModelCache, meter: MemoryMeter,
        spawned_at: float | None) -> None:
    """Measure the configuration in ``req`` into ``out`` (Measurement fields); raises on failure,
    leaving in ``out`` what was learned before it. ``spawned_at``: when this process was started
    for this probe (None when the worker was already running: no start time to pay).

    The phases, in order: open the device (a fresh process's CUDA context), build (or reuse) the
    model, the memory phase on the worst-case batch, burn-in on typical batches, then timed steps
    until the estimate is stable."""
    phases: dict[str, float] = {"start": 0.0 if spawned_at is None else time.time() - spawned_at}
    t = time.perf_counter()  # the device's opening: importing torch (versions() does) and its context
    out.update(phases_s=phases, versions=versions())
    device = open_device(req, out, capped_now=spawned_at is not None)
    phases["device"] = time.perf_counter() - t
    built, reused, phases["build"] = build(req, device, cache)
    out["model_reused"] = reused
    out["notes"] += built.notes
    max_len = capped_length(req, built.workload.max_positions, out["notes"])

    skipped_before = built.step.skipped_steps  # a kept model's count goes on from its last probe
    t = time.perf_counter()
    meter.start(built, reused)
    worst_step = measure_memory(req, built, max_len, out, device)
    synchronize(device)
    phases["memory"] = time.perf_counter() - t

    batches = typical_batches(req, built.workload, max_len, out)
    try:
        emit("phase", phase="burn_in")
        t = time.perf_counter()
        first_sight = burn_in(req, built, batches, device)
        phases["burn_in"] = time.perf_counter() - t
        out["loader_start_s"] = batches.start_s

        t = time.perf_counter()
        timed = time_steps(req, built, batches, device,
                           clearly_slower(req, batches, max_len, worst_step, built, first_sight))
        if timed.slower and req.slower_than is not None:
            out["slower_than"] = dataclasses.asdict(req.slower_than)
        out["communication_share"] = communication_share(req, built, batches, timed, device)
        phases["timed"] = time.perf_counter() - t
    finally:
        batches.close()
    if built.step.scaler is not None:
        out["scaler_skipped_steps"] = built.step.skipped_steps - skipped_before
        check_scaler(timed, out["scaler_skipped_steps"], out["notes"])
    out.update(speed_fields(req, timed, out["device_name"], out["notes"]))
    out.update(epoch_fields(req, timed, batches, max_len, worst_step, built, first_sight))
    note = input_bound_note(out, req.params)
    if note:
        out["notes"].append(note)


def open_device(req: ProbeRequest, out: dict[str, Any], capped_now: bool) -> Any:
    """The torch device of ``req``, made current, under the budget's cap; records what it is.
    ``capped_now``: a fresh process before its first probe, where the CPU cap is set for its life."""
    import torch

    cap = req.memory_cap_bytes
    device = torch.device(req.device)
    cuda = device.type == "cuda"
    if cuda:
        # Memory counters, caches and bf16 support read the *current* device: on cuda:1 they
        # would read (and open a context on) cuda:0, and every config would seem to use nothing.
        torch.cuda.set_device(device)
    if cap:
        cap_memory(cap, device, out, cpu=capped_now)
    out["device"] = str(device)
    out["device_name"] = device_label(str(device))
    out["cpu_threads"] = torch.get_num_threads()
    if req.budget_memory_gb is None:
        out["budget_memory_gb"] = own = device_memory_gb(device)
        out["notes"].append(f"no budget.memory_gb: this {'GPU' if cuda else 'machine'}'s {own:.1f} GiB is the budget "
                            f"(headroom {req.budget_headroom_gb:g} GiB)")
    return device


def build(req: ProbeRequest, device: Any, cache: ModelCache) -> tuple[Built, bool, float]:
    """The model with its knobs and optimizer applied, whether it was reused, and the seconds
    building took: the worker's
    kept model when only the batch shape differs (``req.model_key``), else a new one (kept for the
    next probe when it may be reused)."""
    # local: the worker answers its supervisor and binds to its parent before the spec and the workloads load
    from trainfit.spec import Spec, TuneSettings
    from trainfit.workloads import build_workload
    from trainfit.workloads.knobs import switch_checkpointing
    from trainfit.workloads.step import TrainStep, check_support

    built = cache.take(req.model_key)
    if built is not None:  # only batch-shape knobs differ, and those a built model switches (the key says so)
        if built.step.params.gradient_checkpointing != req.params.gradient_checkpointing:
            switch_checkpointing(built.workload.model, req.params.gradient_checkpointing)
        built.step.params = req.params
        return built, True, 0.0
    emit("phase", phase="build")
    t = time.perf_counter()
    notes = check_support(req.params, device)
    spec = Spec(model=req.model, data=None, params=req.params, probe=req.probe,
                tune=TuneSettings(command_template=req.command_template))
    workload = build_workload(spec, req.params, device)
    workload.model = distribute(workload.model, req.params, device)  # a rank's share of a multi-process run
    step = TrainStep(workload, req.params, device)
    built = Built(req.model_key, workload, step, notes + workload.notes,
                  0 if device.type == "cuda" else peak_rss_bytes())
    if built.key is not None:
        cache.built = built
    return built, False, time.perf_counter() - t


def probe(req: ProbeRequest, cache: ModelCache, spawned_at: float | None,
          scratch: Path | None = None) -> dict[str, Any]:
    """One job: the Measurement fields of ``req``, whatever happens. ``scratch``: the probe's own
    folder, where a multi-process probe's ranks leave their results (None: the system's temp folder)."""
    started = _now()
    out: dict[str, Any] = {"device": req.device, "notes": list(req.notes)}
    meter = MemoryMeter(req.device)
    capped_cpu = bool(req.memory_cap_bytes) and req.device == "cpu"
    ranks = req.params.nproc_per_node > 1 and not is_distributed()  # this worker starts the ranks
    try:
        if ranks:
            run_ranks(req, out, scratch)
        else:
            run(req, out, cache, meter, spawned_at)
    except BaseException as err:  # every failure becomes a status, never a crash of the tuner
        if isinstance(err, KeyboardInterrupt):
            raise

        status = "diverged" if isinstance(err, LossNotFinite) else "oom" if is_oom(err, capped_cpu=capped_cpu) \
            else "error"
        if isinstance(err, Unsupported) and err.knob is not None:
            out["unsupported"] = {err.knob: err.value}
        if isinstance(err, TrainfitError):
            message = str(err)
        elif status == "oom":
            message = f"out of memory: {(str(err).splitlines() or [type(err).__name__])[0][:300]}"
            held, asked = memory_at_failure(str(err), req.device.startswith("cuda"))
            if held is not None and asked is not None:
                out["oom_needed_bytes"] = held + asked
            if capped_cpu:
                assert req.memory_cap_bytes is not None  # capped_cpu
                message += cpu_cap_explained(held, asked, req.memory_cap_bytes)
        else:
            message = "".join(traceback.format_exception(err)[-6:]).strip()
        out.update(status=status, message=message)
    if not ranks:
        out.update(meter.fields())
    out.update(started_at=started, finished_at=_now(), config=req.params.to_dict(),
               memory_cap_bytes=req.memory_cap_bytes,
               budget_memory_gb=req.budget_memory_gb or out.get("budget_memory_gb"),
               budget_headroom_gb=req.budget_headroom_gb, truncated_samples=req.truncated_samples)
    return out


def serve(spawned_at: float, jobs: Any) -> int:
    """Run the jobs on ``jobs`` (lines of JSON) until it closes or a probe fails."""
    # local: the worker answers its supervisor before numpy loads
    from trainfit.probe.request import ProbeRequest

    cache = ModelCache()
    first = True
    reusable = True
    for line in jobs:
        if not line.strip():
            continue
        job = json.loads(line)
        with open(job["request"]) as f:
            req = ProbeRequest.from_json(f.read())
        if not job.get("reuse_model", True):  # the runner's call: a new model in this process
            cache.take(None)
        if first:
            # A CPU peak can only be measured per probe where it can be restarted.
            reusable = req.device.startswith("cuda") or reset_peak_rss()
        out = probe(req, cache, spawned_at if first else None, scratch=Path(job["request"]).parent)
        first = False
        write_atomically(Path(job["result"]), json.dumps(out))
        emit("result", path=job["result"])
        if out.get("status") != "ok" or not reusable or req.model_key is None:
            return 0
    return 0


def die_with_parent(parent_pid: int, pdeathsig: bool) -> None:
    """End this process when ``parent_pid``, the process that started it, dies (the probe worker's
    supervisor, which dies with the runner; a comparison's runner), even in a phase that prints
    nothing (it would notice only at its next write), so a killed tuner leaves no worker holding memory.

    Two ways, as each misses a case. Linux's ``PR_SET_PDEATHSIG`` kills it at once, even while a
    C call holds the GIL, but fires when the parent *thread* ends, so the runner asks for it
    (``pdeathsig``) only from its main thread. A watchdog thread, portable, polls the parent pid
    and kills this process's whole group (compile workers, a factory's helpers) with it.
    """
    if pdeathsig and sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="parent-watchdog", daemon=True).start()


def _watch_parent(parent_pid: int) -> None:
    """Kill this process (and the group it leads) once its parent is no longer ``parent_pid``
    (checked first at once: the parent may have died before this thread started)."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    if os.getpgid(0) == os.getpid():  # its own group, as the runner starts it: not a shell's
        os.killpg(0, signal.SIGKILL)
    os._exit(1)


def main(argv: list[str]) -> int:
    """``SPAWNED_AT PARENT_PID PDEATHSIG EVENTS_FD``: when the runner started this process
    (time.time()), the runner's pid, 1 when the runner's thread that started it lives as long as
    the runner, and the write end of the event channel (:func:`~trainfit.probe.events.open_channel`).

    Forks first (:func:`~trainfit.probe.supervisor.supervise`): what goes on here is the worker,
    which dies with its supervisor; the supervisor dies with the runner."""
    parent, pdeathsig = supervise(int(argv[1]), argv[2] == "1")
    die_with_parent(parent, pdeathsig)
    open_channel(int(argv[3]))
    return serve(float(argv[0]), sys.stdin)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

