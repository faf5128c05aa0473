"""A probe survives what its workload leaves behind and dies with its caller.

Each test runs a real probe whose factory misbehaves the way a user's workload can: it starts a
process in its own session that holds the worker's output, it sleeps silently while the caller is
killed, it runs from a folder holding a module named like one the worker imports. Time bounds
here are hang guards only, far above what a passing run takes.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil  # the real one, imported before any test changes the working directory
import pytest
from conftest import TINY_LLAMA, alive, gone_within, kill_left_running, make_spec_file

from trainfit.probe import Measurement, run_probe
from trainfit.spec import load_spec

pytestmark = pytest.mark.integration  # every test runs a real probe

HANG_GUARD_S = 120.0

FAULTS = '''"""Factories that misbehave as a user's workload can; each writes a process id beside this file."""
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent


def _write_pid(name, pid):
    tmp = HERE / (name + ".tmp")
    tmp.write_text(str(pid))
    os.replace(tmp, HERE / name)


def _leave_a_process_holding_the_output():
    """A helper in its own session (out of the worker's process group) that inherits its stdout."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    _write_pid("grandchild.pid", child.pid)


def grandchild_then_hang(params, device):
    _leave_a_process_holding_the_output()
    time.sleep(3600)


def grandchild_then_fail(params, device):
    _leave_a_process_holding_the_output()
    raise ValueError("the factory failed after starting a helper")


def silent(params, device):
    _write_pid("worker.pid", os.getpid())
    time.sleep(3600)
'''

PARENT = '''"""A caller of run_probe, to be SIGKILLed mid-probe: on the main thread or on another one."""
import sys
import threading

from trainfit.probe import run_probe
from trainfit.spec import load_spec

spec = load_spec(sys.argv[1])
if sys.argv[2] == "main":
    run_probe(spec)
else:
    thread = threading.Thread(target=run_probe, args=(spec,))
    thread.start()
    thread.join()
'''


def read_pid(path: Path, bound_s: float = HANG_GUARD_S) -> int:
    deadline = time.monotonic() + bound_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} was not written within {bound_s} s"
        time.sleep(0.1)
    return int(path.read_text())


@pytest.fixture
def faults(tmp_path: Path):
    """The folder holding the faulty factories; any process they left running is killed after the test."""
    folder = tmp_path / "faults"
    folder.mkdir()
    (folder / "faults.py").write_text(FAULTS)
    yield folder
    kill_left_running(folder)


def fault_spec(folder: Path, factory: str, **probe: float) -> Path:
    return make_spec_file(folder, model={"factory": f"{folder / 'faults.py'}:{factory}"}, params={"max_length": 8},
                          probe=probe or None, name=f"{factory}.yaml")


def probe_guarded(path: Path) -> Measurement:
    """run_probe on a thread, so a probe that never returns fails the test instead of hanging the suite
    (the fixture's cleanup then kills what blocked it)."""
    found: list[Measurement] = []
    thread = threading.Thread(target=lambda: found.append(run_probe(load_spec(path))), daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), f"the probe did not return within {HANG_GUARD_S} s"
    return found[0]


@pytest.mark.slow  # 40 s, most of it the timeout itself
def test_a_timeout_ends_the_probe_whatever_the_worker_left_holding_its_output(faults: Path) -> None:
    # The timeout's clock starts at the spawn: 40 s leaves a loaded machine room for the worker's imports.
    m = probe_guarded(fault_spec(faults, "grandchild_then_hang", timeout_s=40))
    grandchild = read_pid(faults / "grandchild.pid", 0)  # started before the timeout: the case under test
    assert m.status == "timeout", m.message
    assert gone_within(grandchild, 30), "the runner left the worker's grandchild running"


def test_a_failed_probe_returns_though_its_factory_left_a_process_holding_the_output(faults: Path) -> None:
    m = probe_guarded(fault_spec(faults, "grandchild_then_fail"))
    assert m.status == "error" and "the factory failed after starting a helper" in m.message
    assert gone_within(read_pid(faults / "grandchild.pid", 0), 30), "the runner left the worker's grandchild running"


@pytest.mark.parametrize("thread", ["main", "other"])
def test_a_worker_dies_with_its_caller_in_a_phase_that_prints_nothing(faults: Path, thread: str) -> None:
    """SIGKILL of the caller (a tuner killed by the OOM killer or `kill -9`) while the worker sleeps
    silently in its factory: the worker must not live on holding memory."""
    script = faults / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script), str(fault_spec(faults, "silent")), thread])
    try:
        worker = read_pid(faults / "worker.pid")
        assert parent.poll() is None, "the caller ended before it was killed"
        parent.kill()
        parent.wait()
        assert gone_within(worker, 30), "the worker outlived its SIGKILLed caller"
    finally:
        parent.kill()
        parent.wait()


def test_a_module_in_the_working_directory_does_not_run_in_the_worker(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m` and an empty PYTHONPATH entry put the working directory first on sys.path: a
    psutil.py there ran inside the worker instead of psutil."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "psutil.py").write_text("from pathlib import Path\n\n(Path(__file__).parent / 'imported').touch()\n")
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 16, "batch_size": 2})
    monkeypatch.chdir(folder)
    m = run_probe(load_spec(path))
    assert not (folder / "imported").exists(), "the worker imported psutil.py from the working directory"
    assert m.status == "ok", m.message


def test_a_budget_below_what_the_worker_needs_to_start_is_an_oom_that_says_so(tmp_path: Path) -> None:
    """0.01 GiB cannot hold Python and torch: an OOM that names what starting takes, not a traceback."""
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 16},
                          budget={"memory_gb": 0.01, "headroom_gb": 0})
    m = run_probe(load_spec(path))
    assert m.status == "oom", m.message
    assert "Traceback" not in m.message and "budget.memory_gb" in m.message and "0.01 GiB" in m.message
    assert m.oom_needed_bytes > 100 * 2**20  # the interpreter and torch, before any model
    assert f"{m.oom_needed_bytes / 2**30:.2f} GiB" in m.message


def test_a_quantized_model_s_folder_left_by_a_killed_worker_goes_with_the_next_load(tmp_path: Path) -> None:
    """A QLoRA probe of a random-init model saves it to a temporary folder first; a worker killed at its
    timeout (SIGKILL) skips every cleanup. The next load removes such a folder, and keeps one a live
    process holds and one just made (not held yet)."""
    import os

    from trainfit.workloads.quantized import model_folder, remove_abandoned

    def holder() -> tuple[subprocess.Popen[str], Path]:
        code = ("import sys, time; from pathlib import Path; from trainfit.workloads.quantized import model_folder\n"
                "with model_folder(Path(sys.argv[1])) as folder:\n"
                "    (folder / 'model.safetensors').write_bytes(b'0' * 4096); print(folder, flush=True); time.sleep(120)")
        proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        return proc, Path(proc.stdout.readline().strip())

    killed, left = holder()
    killed.kill()
    killed.wait()
    living, held = holder()
    try:
        fresh = tmp_path / "trainfit-qlora-fresh"
        fresh.mkdir()
        for folder in (left, held):
            os.utime(folder, (time.time() - 3600, time.time() - 3600))
        assert left.is_dir()  # the kill left it
        with model_folder(tmp_path) as mine:  # the next load
            assert mine.is_dir()
        assert not left.exists() and held.is_dir() and fresh.is_dir() and not mine.exists()
        assert remove_abandoned(tmp_path) == []
    finally:
        living.kill()
        living.wait()
