"""``trainfit train`` of a factory config measured on two processes: two gloo ranks on this CPU under
DDP, this process rank 0 (issue 48 item 2). Killed and resumed, the run ends on the weights of an
uninterrupted one; a killed rank stops the run with the command that resumes it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import learnable_spec
from tune_helpers import fixed_speed

from trainfit.cli import main
from trainfit.train.checkpoints import MARK

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = ["--max-steps", "12", "--checkpoint-minutes", "0.00001"]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tune folder whose config trains on two processes under DDP (its probes are not probes: what
    is tested is the training)."""
    from trainfit.data.analyze import analyze_spec
    from trainfit.spec import load_spec
    from trainfit.tune import tune
    from trainfit.tune.options import TuneOptions

    root = tmp_path_factory.mktemp("ranks")
    path = learnable_spec(root, 40, {"batch_size": 2, "gradient_accumulation_steps": 2, "max_length": 16, "width_mul": 2,
                                     "nproc_per_node": 2, "parallel": "ddp", "sleep_s": 0.25},
                          "search:\n  batch_size: [2]\n")
    spec = load_spec(path)
    tune(spec, TuneOptions(output=root / "run", probe_fn=fixed_speed(), stats=analyze_spec(spec, progress=False)))
    return root / "run"


def weights(folder: Path) -> dict:
    import torch

    return torch.load(folder / "model.pt")


def same(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def started(run: Path, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "trainfit", "train", str(run), "--output", str(out), *STEPS],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def until_checkpoint(out: Path, proc: subprocess.Popen[str], step: int = 4) -> None:
    deadline = time.monotonic() + 240
    while not any((c / MARK).exists() for c in out.glob("checkpoint-*") if int(c.name.split("-")[1]) >= step):
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "no checkpoint"
        time.sleep(0.1)


def test_two_ranks_killed_and_resumed_end_on_the_weights_of_an_uninterrupted_run(two_ranks: Path, tmp_path: Path,
                                                                                 capsys) -> None:
    whole = tmp_path / "whole"
    assert main(["train", str(two_ranks), "--output", str(whole), *STEPS]) == 0
    assert (whole / "checkpoint-12" / "rng_state_1.pth").is_file()  # each rank's random state

    part = tmp_path / "part"
    proc = started(two_ranks, part)
    until_checkpoint(part, proc)
    proc.send_signal(signal.SIGKILL)  # rank 0, the trainfit train process: its rank 1 exits on its own
    proc.wait()
    assert main(["train", str(two_ranks), "--output", str(part), *STEPS, "--resume"]) == 0
    assert same(weights(whole), weights(part))
    # this process's environment as it was: a command it starts later took WORLD_SIZE=2 for its own and
    # waited for a rank that never came (a later test's `trl sft` hung the slow tier)
    assert not {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE"} & set(os.environ)


def test_a_killed_rank_stops_the_run_and_says_how_to_resume_it(two_ranks: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    proc = started(two_ranks, out)
    until_checkpoint(out, proc)
    [rank] = [p for p in psutil.Process(proc.pid).children() if "trainfit.train.rank_child" in " ".join(p.cmdline())]
    os.kill(rank.pid, signal.SIGKILL)
    text, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, text
    assert "rank 1 of 2 ended (SIGKILL), so the run stopped" in text and "Traceback" not in text
    assert f"trainfit train {two_ranks} --output {out}" in text and "--resume" in text
    assert main(["train", str(two_ranks), "--output", str(out), *STEPS, "--resume"]) == 0


def test_sigterm_to_every_rank_stops_them_together_with_a_checkpoint(two_ranks: Path, tmp_path: Path) -> None:
    """A cluster's preemption signals the whole job: rank 0 hears it, the others ignore it, and all
    stop at the same step with a checkpoint that resumes."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "trainfit", "train", str(two_ranks), "--output", str(out), *STEPS],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    until_checkpoint(out, proc, step=2)
    os.killpg(proc.pid, signal.SIGTERM)
    text, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, text
    assert "stopped by SIGTERM" in text and "with a checkpoint" in text
    assert main(["train", str(two_ranks), "--output", str(out), *STEPS, "--resume"]) == 0


def test_a_rank_that_ends_before_the_ranks_join_is_said_at_once(tmp_path: Path) -> None:
    """Rank 0 waited for the group's whole timeout (30 minutes) for a rank that had failed before it
    joined (a review found it). Run in a process of its own: the wait it stops is left behind."""
    script = (
        "import os, subprocess, sys\n"
        "from trainfit.errors import TrainfitError\n"
        "from trainfit.train.ranks import _free_port, _joined\n"
        "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(_free_port()), WORLD_SIZE='2')\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import sys; sys.exit(3)'])\n"
        "try:\n"
        "    _joined([child], 2, 'cpu', 'trainfit train R --resume')\n"
        "except TrainfitError as err:\n"
        "    print(err.message, err.hint)\n"
        "    os._exit(0)\n"
        "os._exit(1)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rank 1 of 2 ended (exit status 3) before the ranks joined" in done.stdout
