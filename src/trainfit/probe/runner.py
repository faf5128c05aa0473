"""The parent side of a probe: prepare the request, run it in a worker process, turn any ending
into a Measurement. The caller survives whatever the worker does."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from trainfit.data.analyze import analyze_spec
from trainfit.data.stats import LengthStats, count_longer_than
from trainfit.devices import resolve_device_name
from trainfit.params import Params, memory_grows
from trainfit.probe.estimate import assumed_mix, times_longest, typical_mix
from trainfit.probe.events import ProbeEvent, Result, parse_event
from trainfit.probe.measurement import SCHEMA_VERSION, Measurement
from trainfit.probe.real_rows import timing_rows
from trainfit.probe.request import Bar, ProbeRequest
from trainfit.probe.strays import descendants, kill_all, pipe_writers
from trainfit.spec import GiB, Spec

EventCallback = Callable[[ProbeEvent], None]


def build_request(spec: Spec, params: Params, stats: LengthStats | None, device: str,
                  slower_than: Bar | None = None) -> ProbeRequest:
    """Everything the child needs. Lengths are chosen here, from the data analysis:
    the worst case is the ``batch_size`` longest samples; the typical batches are an epoch of a
    uniform sample of the data's lengths, batched as the trainer will (see probe/estimate.py).
    ``slower_than``: the search's bar, where timing may stop early (:class:`~trainfit.probe.request.Bar`)."""
    notes: list[str] = []
    truncated: int | None = None
    rows = None
    if stats is None:
        assert params.max_length is not None, "a spec without data has params.max_length (validated)"
        max_length = params.max_length
        worst = [max_length] * params.batch_size
        typical = assumed_mix(params, max_length)
        notes.append(f"no dataset: every sample is assumed to be max_length={max_length} long")
    else:
        max_length = stats.truncation_length(params.max_length)
        # Packed: batch_size full rows, each (at worst for the attention) one max_length sample.
        worst = [max_length] * params.batch_size if params.packing else stats.longest_lengths(params.batch_size)
        typical = typical_mix(stats.length_sample, params, max_length, spec.probe.seed,
                              longest=times_longest(params, spec.probe.memory_steps), data_samples=stats.samples)
        rows = timing_rows(spec, typical.timing_batches, max_length, notes)
        truncated, exact = count_longer_than(stats, max_length)
        if stats.approximate:
            notes.append("sample lengths are approximate (no tokenizer, so word pieces were counted): "
                         "set `tokenizer:` to the model's tokenizer for the lengths training will see")
        if stats.samples < params.batch_size:
            notes.append(f"the dataset holds {stats.samples:,} samples, fewer than batch_size={params.batch_size}: "
                         f"each step trains all {stats.samples:,} of them, and the probe timed that smaller batch")
        if truncated:
            notes.append(f"{'' if exact else '~'}{truncated:,} of {stats.samples:,} samples "
                         f"({truncated / stats.samples:.2%}) are longer than max_length={max_length} "
                         "and are truncated")
    if params.nnodes > 1:
        notes.append(f"nnodes: {params.nnodes}: measured on one machine ({params.nproc_per_node} process"
                     f"{'es' if params.nproc_per_node > 1 else ''}); the speeds count all {params.processes}, assuming "
                     "each machine steps as this one did (the network between machines is not measured)"
                     + (f"; FSDP's shards here are 1/{params.nproc_per_node} of the model, in the run "
                        f"1/{params.processes}: the memory measured is an upper bound" if params.parallel == "fsdp"
                        else ""))
    return ProbeRequest(model=spec.model, command_template=spec.tune.command_template, params=params,
                        probe=spec.probe, device=device, max_length=max_length, worst_lengths=tuple(worst),
                        typical=typical, timing_rows=rows, truncated_samples=truncated,
                        memory_cap_bytes=int(spec.budget.memory_gb * GiB) if spec.budget.memory_gb else None,
                        budget_memory_gb=spec.budget.memory_gb, budget_headroom_gb=spec.budget.headroom_gb,
                        notes=tuple(notes), slower_than=slower_than)


def _describe_exit(rc: int) -> tuple[str, str]:
    """(status, message) for a child that ended without writing a result."""
    if rc < 0:
        sig = signal.Signals(-rc)
        if sig == signal.SIGKILL:
            return "oom", "the probe was killed by SIGKILL, most likely by the operating system's OOM killer"
        return "error", f"the probe process died of {sig.name}"
    return "error", f"the probe process exited with code {rc} without a result"


DRAIN_S = 2.0
"""How long the reader keeps taking a stopped worker's output while more keeps coming (from a
process it left behind): its last lines are in the pipe already, written before it ended."""


_WORKER_MAIN = """import sys
if sys.path[:1] == ['']:
    del sys.path[0]
from trainfit.probe.worker import main
sys.exit(main(sys.argv[1:]))
"""


def worker_command(spawned_at: float, parent_pid: int, on_main_thread: bool, events_fd: int) -> list[str]:
    """The worker's command line (see :func:`trainfit.probe.worker.main` for its arguments).

    Not ``python -m``, which puts the working directory first on ``sys.path``: a ``psutil.py``
    there would run inside the worker. ``-c`` puts it there as ``''``, which the first line drops
    before anything is imported (a factory named ``module:function`` adds it back to import its
    module, see :func:`~trainfit.workloads.factory.load_factory`). ``on_main_thread``: whether the
    thread starting the worker lives as long as its process (Linux kills a process whose parent
    *thread* ends, when asked to kill it with its parent). ``events_fd``: the write end of the
    event channel, passed to the worker under the same number.
    """
    return [sys.executable, "-c", _WORKER_MAIN, repr(spawned_at), str(parent_pid), str(int(on_main_thread)),
            str(events_fd)]


@dataclass
class _Job:
    """The probe a worker is running: where its output goes."""

    log: IO[str]
    on_event: EventCallback | None
    done: threading.Event = field(default_factory=threading.Event)
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=30))


class _Lines:
    """One of the worker's pipes, read in lines: what came after its last whole line, and where
    each whole line goes."""

    def __init__(self, fd: int, take: Callable[[str], None]) -> None:
        self.fd, self.take, self.pending = fd, take, b""

    def read(self) -> bool:
        """Take what the pipe holds (call when it is readable: this reads once); False at its end."""
        chunk = os.read(self.fd, 1 << 16)
        if not chunk:
            self.flush()
            return False
        *lines, self.pending = (self.pending + chunk).split(b"\n")
        for raw in lines:
            self.take(raw.decode("utf-8", "replace"))
        return True

    def catch_up(self) -> None:
        """Take all the pipe holds now (at most :data:`DRAIN_S` of it: a helper may write for ever)."""
        deadline = time.monotonic() + DRAIN_S
        with selectors.DefaultSelector() as selector:
            selector.register(self.fd, selectors.EVENT_READ)
            while time.monotonic() < deadline and selector.select(0) and self.read():
                pass

    def flush(self) -> None:
        """Take an unfinished last line."""
        if self.pending:
            self.take(self.pending.decode("utf-8", "replace"))
            self.pending = b""


class ProbeSession:
    """Runs probes in a worker process (``trainfit.probe.worker``) in its own process group.

    The worker writes its events (:mod:`trainfit.probe.events`) to a pipe of their own, the event
    channel, apart from its stdout and stderr, where the model's code prints: nothing the model
    prints is read as an event. The process started is the worker's supervisor
    (:mod:`trainfit.probe.supervisor`), which ends what the worker leaves behind.

    The worker stays alive after a successful probe; the next probe with the same
    :func:`model_key` runs on the model it already built (no process start, no model build): on
    CUDA whatever its batches (the caching allocator is emptied and the peak restarts), on a CPU
    only for a probe that needs no less memory (:func:`~trainfit.params.memory_grows`). A Hugging
    Face model is switched in place to another gradient checkpointing (``Knob.switched``). On CUDA another model may
    be built in the same process (:func:`process_outlives_model`). Any other probe, and any probe after a
    failure, gets a fresh worker. Never raises for
    anything a worker does; use as a context manager (or call :meth:`close`) so no worker
    outlives its caller (a caller killed outright takes its worker with it, see
    :func:`trainfit.probe.worker.die_with_parent`).
    """

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._events_fd = -1
        """The read end of the worker's event channel (-1 without a worker)."""
        self._reader: threading.Thread | None = None
        self._key: str | None = None
        self._params: dict[str, Any] = {}
        self._last: ProbeRequest | None = None
        """The request the worker ran last."""
        self._job: _Job | None = None
        self._stop = threading.Event()

    def __enter__(self) -> ProbeSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker and everything it started, then stop reading its output.

        Its process group goes (compile workers, say), and with it what left the group while
        the worker ran (a process in its own session) and anything still holding the worker's
        output: such a process would keep the pipe open, and its reader waiting, forever. Nothing
        here waits on a process the worker started.
        """
        proc, self._proc = self._proc, None
        if proc is None:
            return
        assert proc.stdout is not None and proc.stdin is not None
        strays: list[Any] = []
        if proc.poll() is None:
            strays = descendants(proc.pid)  # before the kill: then they still have the worker as ancestor
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
        kill_all(strays + pipe_writers(proc.stdout.fileno(), self._events_fd))
        self._stop_reading()
        proc.stdin.close()
        proc.stdout.close()
        os.close(self._events_fd)
        self._events_fd = -1

    def _spawn(self) -> subprocess.Popen[bytes]:
        # pyarrow's default allocator (imported with trl's trainer, for its fused LM head) reserves
        # 1 GiB of address space, which a CPU memory cap (RLIMIT_DATA) counts as used.
        env = {"ARROW_DEFAULT_MEMORY_POOL": "system", **os.environ, "PYTHONUNBUFFERED": "1",
               "TOKENIZERS_PARALLELISM": "false"}
        src = str(Path(__file__).resolve().parents[2])
        # No empty entry: Python reads one as the working directory.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        on_main_thread = threading.current_thread() is threading.main_thread()
        events_fd, events_w = os.pipe()
        try:
            proc = subprocess.Popen(
                worker_command(time.time(), os.getpid(), on_main_thread, events_w),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.PIPE, env=env,
                start_new_session=True,  # its own process group: a timeout kills compile workers too
                pass_fds=(events_w,),
            )
        except BaseException:
            os.close(events_fd)
            raise
        finally:
            os.close(events_w)  # the worker's alone: the channel ends when the worker does
        assert proc.stdout is not None
        self._events_fd = events_fd
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._pump, args=(proc.stdout.fileno(), events_fd, self._stop),
                                        daemon=True)
        self._reader.start()
        return proc

    def _pump(self, out_fd: int, events_fd: int, stop: threading.Event) -> None:
        """Read the worker's output and its events until both pipes end, or, once ``stop`` is set,
        until neither has anything more to give (at most :data:`DRAIN_S` more): a process the
        worker left behind may hold a pipe open, and even keep writing, forever. It reads only what
        is there, so stopping never waits on a read (nor does closing a pipe wait on this thread).

        The output is read first, and caught up with before a result ends the job: what the worker
        printed before its result is in the pipe already, and belongs to this job's log."""
        output = _Lines(out_fd, self._take_log)
        events = _Lines(events_fd, lambda line: self._take_event(line, output))
        drain_until: float | None = None
        with selectors.DefaultSelector() as selector:
            selector.register(out_fd, selectors.EVENT_READ, output)
            selector.register(events_fd, selectors.EVENT_READ, events)
            while selector.get_map() and (drain_until is None or time.monotonic() < drain_until):
                if drain_until is None and stop.is_set():
                    drain_until = time.monotonic() + DRAIN_S
                ready = selector.select(0.1)
                if not ready and drain_until is not None:
                    break
                for key, _ in sorted(ready, key=lambda found: found[0].data is events):
                    if not key.data.read():
                        selector.unregister(key.fd)
        output.flush()
        events.flush()

    def _stop_reading(self) -> None:
        """Take what the worker wrote before it ended, then stop the reader (bounded: see :meth:`_pump`)."""
        if self._reader is not None:
            self._stop.set()
            self._reader.join()

    def _take_event(self, line: str, output: _Lines) -> None:
        """One line of the event channel: an event for the job's callback; a result ends the job,
        once the output written before it is in the job's log."""
        job = self._job
        if job is None:
            return
        event = parse_event(line)
        if event is None:  # not an event this runner knows: kept, as output is
            self._take_log(line)
        elif isinstance(event, Result):
            output.catch_up()
            job.done.set()
        elif job.on_event is not None:
            try:
                job.on_event(event)
            except Exception:  # noqa: BLE001 - a display problem never stops a probe
                pass

    def _take_log(self, line: str) -> None:
        """One line of the worker's output (whatever it looks like): a line of the job's log."""
        job = self._job
        if job is None:
            return
        job.tail.append(line)
        try:
            job.log.write(line + "\n")
        except ValueError:  # the job's log was closed: output after its result
            pass

    def _wait(self, job: _Job, proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
        """Until the result, the worker's exit or the timeout; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while not job.done.wait(0.1):
            if proc.poll() is not None:
                self._stop_reading()  # its last output (and a result event) is in the pipe already
                return True
            if time.monotonic() >= deadline:
                return False
        return True

    def run(self, request: ProbeRequest, timeout_s: float, workdir: Path,
            on_event: EventCallback | None = None) -> Measurement:
        """Run the probe in ``request`` (see :func:`build_request`); its files go to ``workdir``."""
        workdir.mkdir(parents=True, exist_ok=True)
        req_path, res_path = workdir / "request.json", workdir / "result.json"
        res_path.unlink(missing_ok=True)
        req_path.write_text(request.to_json())
        key = request.model_key
        start = time.perf_counter()
        # A CPU keeps its model only where the probe needs no less memory: its peak RSS after a larger one stays high.
        same_model = key is not None and key == self._key and (
            request.device.startswith("cuda") or memory_grows(self._params, request.params.to_dict()))
        keep = same_model or (self._last is not None and process_outlives_model(self._last, request))
        if self._proc is not None and (not keep or self._proc.poll() is not None):
            self.close()
        if self._proc is None:
            self._proc = self._spawn()
        proc, self._key, self._params, self._last = self._proc, key, request.params.to_dict(), request
        with (workdir / "probe.log").open("w") as log:
            job = self._job = _Job(log=log, on_event=on_event)
            try:
                assert proc.stdin is not None
                proc.stdin.write((json.dumps({"request": str(req_path), "result": str(res_path),
                                              "reuse_model": same_model}) + "\n").encode())
                proc.stdin.flush()
            except OSError:
                pass  # the worker is gone: its exit status says why, below
            finished = self._wait(job, proc, timeout_s)
            self._job = None
        wall = time.perf_counter() - start
        measurement = None
        if finished and res_path.exists():
            data = json.loads(res_path.read_text())
            measurement = Measurement.from_dict({**data, "wall_time_s": wall, "schema_version": SCHEMA_VERSION})
        if measurement is None or measurement.status != "ok" or key is None:
            self.close()  # a hang, a crash, a failed or a one-off probe: this worker is done
        if measurement is not None:
            return measurement
        base: dict[str, Any] = {
            "config": request.params.to_dict(), "device": request.device, "wall_time_s": wall,
            "memory_cap_bytes": request.memory_cap_bytes, "budget_memory_gb": request.budget_memory_gb,
            "budget_headroom_gb": request.budget_headroom_gb, "truncated_samples": request.truncated_samples,
            "notes": list(request.notes)}
        if finished:
            status, message = _describe_exit(proc.returncode)
        else:
            status, message = "timeout", f"the probe did not finish within {timeout_s:g} s and was killed"
        output = "\n".join(job.tail)
        if output:
            message += "\nlast output:\n" + output
        return Measurement(status=status, message=message, **base)


def process_outlives_model(before: ProbeRequest, request: ProbeRequest) -> bool:
    """Whether a CUDA worker builds ``request``'s model in the process that probed ``before``
    rather than in a fresh process: no process start, no imports and no CUDA context to pay again
    (a fresh process took 14-17 s before a 0.5B model's memory phase on an H100,
    docs/benchmarks.md). The old model is dropped and the caching allocator emptied first, and the
    peak counts from the memory phase on, as in a fresh process. Only between Hugging Face models
    of one process each (a factory may patch what it likes; a multi-process probe's ranks would share
    the GPU with this process's CUDA context), not on a CPU (a process's peak RSS never falls back:
    its freed heap would count), not after Liger's kernels (they replace the model classes'
    functions for the whole process, so a later ``loss: model`` would run them), and not for a
    model that may not be kept at all."""
    return all(r.device.startswith("cuda") and r.model_key is not None and r.model.factory is None
               and r.params.nproc_per_node == 1 for r in (before, request)) and before.params.loss != "liger"


def run_probe(
    spec: Spec,
    params: Params | None = None,
    *,
    stats: LengthStats | None = None,
    on_event: EventCallback | None = None,
    workdir: str | Path | None = None,
    session: ProbeSession | None = None,
    slower_than: Bar | None = None,
) -> Measurement:
    """Measure ``params`` (default: ``spec.params``) in a child process.

    ``stats`` is the dataset's length analysis; without it, it is computed (and cached) from
    ``spec.data``. ``session`` keeps the worker between probes (see :class:`ProbeSession`);
    without one, the probe gets a worker of its own. ``slower_than``: a search's bar; the timing
    stops once the config is clearly slower than it (:class:`~trainfit.probe.request.Bar`).
    """
    params = params or spec.params
    if stats is None and spec.data is not None:
        stats = analyze_spec(spec, progress=False)
    device = resolve_device_name(spec.probe.device)
    request = build_request(spec, params, stats, device, slower_than)
    with contextlib.ExitStack() as stack:
        if session is None:
            session = stack.enter_context(ProbeSession())
        if workdir is None:
            workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="trainfit-probe-"))
        return session.run(request, spec.probe.timeout_s, Path(workdir), on_event)

