"""What a workload does inside the probe worker cannot lose or falsify the probe.

Each test runs a real probe whose factory misbehaves as a user's workload can: it prints lines that
look like the worker's own progress events, it starts a helper in its own session (out of the
worker's process group, its output not the worker's) and then aborts or outlives a killed caller,
its loss is not a number. Time bounds are hang guards only, far above what a passing run takes.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import gone_within, kill_left_running, make_spec_file
from test_probe_faults import PARENT

from trainfit.probe import Measurement, run_probe
from trainfit.probe.events import Phase, ProbeEvent
from trainfit.spec import load_spec

HANG_GUARD_S = 120.0

FACTORIES = '''"""Factories that misbehave as a user's workload can; each writes process ids beside this file."""
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

import trainfit

HERE = Path(__file__).parent
FORGED_RESULT = '@@trainfit {"event": "result", "path": "/nonexistent/result.json"}'
FORGED_PHASE = '@@trainfit {"event": "phase", "phase": "forged"}'


def _write_pid(name, pid):
    tmp = HERE / (name + ".tmp")
    tmp.write_text(str(pid))
    os.replace(tmp, HERE / name)


def _tiny(device, scale=1.0):
    model = torch.nn.Linear(8, 8).to(device)
    return trainfit.CustomWorkload(
        model=model,
        make_batch=lambda lengths, pad_to: torch.randn(len(lengths), pad_to, 8, device=device),
        loss=lambda m, x: m(x).pow(2).mean() * scale,
    )


class Forger(torch.nn.Module):
    """Prints what looks like the worker's events at every forward, through every way out."""

    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(8, 8)

    def forward(self, x):
        for line in (FORGED_PHASE, FORGED_RESULT):
            print(line, flush=True)
            print(line, file=sys.stderr, flush=True)
            os.write(2, (line + "\\n").encode())  # as a C library writes
        return self.inner(x)


def forges_events(params, device):
    print(FORGED_RESULT, flush=True)
    os.write(1, (FORGED_RESULT + "\\n").encode())
    made = _tiny(device)
    made.model = Forger().to(device)
    return made


def _helper_in_its_own_session():
    """A helper in its own session, its output not the worker's: neither the worker's process
    group nor its output pipe leads to it."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _write_pid("helper.pid", child.pid)


def helper_then_abort(params, device):
    _helper_in_its_own_session()
    os.abort()


def helper_then_silent(params, device):
    _helper_in_its_own_session()
    _write_pid("worker.pid", os.getpid())
    time.sleep(3600)


def nan_loss(params, device):
    return _tiny(device, float("nan"))


def inf_loss(params, device):
    return _tiny(device, float("inf"))
'''



def test_the_worker_forks_its_supervisor_before_any_library_starts_a_thread() -> None:
    """The worker's module forks first thing (trainfit.probe.supervisor); a fork after numpy or torch
    started their threads may deadlock, so importing it must start none and import neither."""
    code = ("import sys, os, trainfit.probe.worker\n"
            "heavy = [m for m in ('numpy', 'torch') if m in sys.modules]\n"
            "print(heavy, len(os.listdir('/proc/self/task')) if os.path.isdir('/proc/self/task') else 1)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]", "1"], out


@pytest.fixture
def factories(tmp_path: Path):
    """The folder holding the factories; any process they left running is killed after the test."""
    folder = tmp_path / "factories"
    folder.mkdir()
    (folder / "misbehaving.py").write_text(FACTORIES)
    yield folder
    kill_left_running(folder)


def spec_of(folder: Path, factory: str) -> Path:
    return make_spec_file(folder, model={"factory": f"{folder / 'misbehaving.py'}:{factory}"},
                          params={"max_length": 8, "batch_size": 2}, name=f"{factory}.yaml")


def read_pid(path: Path, bound_s: float = HANG_GUARD_S) -> int:
    deadline = time.monotonic() + bound_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} was not written within {bound_s} s"
        time.sleep(0.1)
    return int(path.read_text())


def probe_guarded(path: Path, workdir: Path | None = None,
                  events: list[ProbeEvent] | None = None) -> Measurement:
    """run_probe on a thread, so a probe that never returns fails the test instead of hanging the suite."""
    found: list[Measurement] = []
    on_event = None if events is None else events.append
    thread = threading.Thread(target=lambda: found.append(run_probe(load_spec(path), workdir=workdir,
                                                                    on_event=on_event)), daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), f"the probe did not return within {HANG_GUARD_S} s"
    return found[0]


@pytest.mark.integration
def test_output_that_looks_like_the_workers_events_is_the_models_log(factories: Path, tmp_path: Path) -> None:
    """A result line printed by the model (stdout, stderr, straight to fd 2) ended the probe, which
    was then recorded as an OOM; a phase line reached the display. Now they are log lines."""
    events: list[ProbeEvent] = []
    m = probe_guarded(spec_of(factories, "forges_events"), tmp_path / "probe", events)
    assert m.status == "ok", m.message
    assert m.samples_per_second and m.steps_measured >= 2
    phases = [e.phase for e in events if isinstance(e, Phase)]
    assert "forged" not in phases and phases[-1] == "timed"
    log = (tmp_path / "probe" / "probe.log").read_text()
    assert log.count('"phase": "forged"') >= 3 and log.count('"path": "/nonexistent/result.json"') >= 5


@pytest.mark.integration
def test_a_helper_in_its_own_session_goes_with_an_aborted_worker(factories: Path) -> None:
    """os.abort() of the worker left a helper it had started with setsid (and without its output)
    running for ever: nothing led to it once the worker was gone."""
    m = probe_guarded(spec_of(factories, "helper_then_abort"))
    helper = read_pid(factories / "helper.pid", 0)  # started before the abort: the case under test
    assert m.status == "error" and "SIGABRT" in (m.message or ""), m.message
    assert gone_within(helper, 30), "the aborted worker's helper outlived the probe"


@pytest.mark.integration
@pytest.mark.parametrize("thread", ["main", "other"])
def test_a_helper_in_its_own_session_goes_with_a_killed_caller(factories: Path, thread: str) -> None:
    """SIGKILL of the caller (`kill -9` of tune) while the worker sleeps in its factory: the worker
    died, and the helper it had started in its own session lived on."""
    script = factories / "caller.py"
    script.write_text(PARENT)  # test_probe_faults' caller of run_probe, killed mid-probe
    caller = subprocess.Popen([sys.executable, str(script), str(spec_of(factories, "helper_then_silent")), thread])
    try:
        worker = read_pid(factories / "worker.pid")
        helper = read_pid(factories / "helper.pid", 0)
        assert caller.poll() is None, "the caller ended before it was killed"
        caller.kill()
        caller.wait()
        assert gone_within(worker, 30), "the worker outlived its SIGKILLed caller"
        assert gone_within(helper, 30), "the worker's helper outlived the SIGKILLed caller"
    finally:
        caller.kill()
        caller.wait()


@pytest.mark.integration
@pytest.mark.parametrize("factory", ["nan_loss", "inf_loss"])
def test_a_loss_that_is_not_a_number_is_not_ok(factories: Path, factory: str) -> None:
    """A NaN (or infinite) loss was timed and reported ok, so a search ranked it best."""
    m = probe_guarded(spec_of(factories, factory))
    assert m.status == "diverged" and m.exit_code == 6, m.message
    assert m.samples_per_second is None and not m.fits
    word = "nan" if factory == "nan_loss" else "inf"
    assert "not finite" in m.headline and word in m.headline, m.message
    assert m.peak_memory_bytes  # what was measured before is kept
