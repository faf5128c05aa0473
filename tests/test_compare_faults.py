"""``trainfit compare`` against the faults of issue #35: no comparison may lose another's work. A
second comparison into a running one's folder is refused; a config's process dies with its
comparison; config names cannot reach trainfit's own files; a damaged ``compare.json`` is rebuilt
from the configs' results."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import gone_within, make_spec_file, write_frames

from trainfit.cli import main
from trainfit.compare.configs import read_configs
from trainfit.errors import SpecError
from trainfit.spec import load_spec


@pytest.fixture
def factory_spec(tmp_path: Path) -> Path:
    data = write_frames(tmp_path / "frames.jsonl", 40)
    return make_spec_file(tmp_path, model={"factory": f"{Path(__file__).parent / 'factories.py'}:learnable"},
                          data={"path": str(data), "length_field": "n"},
                          params={"batch_size": 2, "max_length": 16, "width_mul": 2})


def config_children(out: Path) -> list[psutil.Process]:
    """The live config processes of the comparison writing into ``out`` (their command names its job)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        words = proc.info["cmdline"] or []
        if any("trainfit.compare.child" in w for w in words) and any(str(out) in w for w in words):
            found.append(proc)
    return found


@pytest.fixture
def no_strays(tmp_path: Path) -> Iterator[None]:
    """Whatever a failed test leaves training is killed, so it cannot slow the tests after it."""
    yield
    for proc in config_children(tmp_path):
        proc.kill()


def wait_for(text: str, log: Path, proc: subprocess.Popen[bytes], timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)


def compare_argv(spec: Path, configs: Path, steps: int, out: Path, *more: str) -> list[str]:
    return ["compare", str(spec), "--configs", str(configs), "--steps", str(steps), "--output", str(out), *more]


@pytest.mark.integration
@pytest.mark.slow
def test_a_second_comparison_into_a_running_ones_folder_is_refused_naming_it_and_touching_nothing(
        factory_spec: Path, tmp_path: Path, no_strays: None) -> None:
    configs = tmp_path / "c.yaml"
    configs.write_text("quick: {learning_rate: 1.0e-3}\nslow: {learning_rate: 1.0e-3, sleep_s: 0.2}\n")
    out, log = tmp_path / "cmp", tmp_path / "first.log"
    argv = compare_argv(factory_spec, configs, 300, out)
    with log.open("wb") as f:
        first = subprocess.Popen([sys.executable, "-m", "trainfit", *argv], stdout=f, stderr=subprocess.STDOUT)
    try:
        wait_for("slow: step", log, first)  # quick is done and kept; slow trains
        before = {p: p.read_bytes() for p in out.rglob("*.json")}
        for again in ([*argv, "--resume"], argv):  # a resume would start slow over, deleting its folder
            second = subprocess.run([sys.executable, "-m", "trainfit", *again], capture_output=True, text=True,
                                    timeout=120)
            assert second.returncode == 2, second.stdout + second.stderr
            errors = [line for line in second.stderr.splitlines() if line.strip()]
            assert f"is in use by a running trainfit (pid {first.pid} on " in errors[0], second.stderr
            assert len(errors) == 2 and errors[1].startswith("  fix: ") and "Traceback" not in second.stderr
            assert {p: p.read_bytes() for p in out.rglob("*.json")} == before  # compare.json and slow's job as they were
        assert first.poll() is None and len(config_children(out)) == 1  # the first trains on
    finally:
        first.kill()
        first.wait()


@pytest.mark.integration
def test_a_config_process_dies_with_its_comparison_even_while_it_starts(
        factory_spec: Path, tmp_path: Path, no_strays: None) -> None:
    """Killed (-9) while its config's process still imports: that process learns its parent only
    then, and must not take the init process it was handed to for the comparison."""
    configs = tmp_path / "c.yaml"
    configs.write_text("slow: {learning_rate: 1.0e-3, sleep_s: 0.2}\n")
    out, log = tmp_path / "cmp", tmp_path / "compare.log"
    with log.open("wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "trainfit", *compare_argv(factory_spec, configs, 2000, out)],
                                stdout=f, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 240
    while not config_children(out):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.02)
    child = config_children(out)[0]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # Gone once its imports end (seconds; a loaded machine gets a minute), where it would train 400 s.
    assert gone_within(child.pid, 60), f"config process {child.pid} outlived its comparison"
    assert not list(out.rglob("result.json"))


@pytest.mark.integration
def test_configs_named_like_the_comparisons_own_files_train_in_their_own_folders(
        factory_spec: Path, tmp_path: Path) -> None:
    """``holdout`` (the held-out split's folder) and ``compare.json`` are config names like any."""
    configs = tmp_path / "c.yaml"
    configs.write_text("holdout: {learning_rate: 1.0e-3}\ncompare.json: {learning_rate: 1.0e-2}\n")
    out = tmp_path / "cmp"
    assert main(compare_argv(factory_spec, configs, 3, out, "--holdout", "8")) == 0
    state = json.loads((out / "compare.json").read_text())
    assert {n: r["status"] for n, r in state["runs"].items()} == {"holdout": "finished", "compare.json": "finished"}
    assert len((out / "holdout" / "heldout.jsonl").read_text().splitlines()) == 8  # the split, untouched
    assert all(r["evals"] for r in state["runs"].values())
    assert sorted(p.parent.name for p in (out / "configs").glob("*/result.json")) == ["compare.json", "holdout"]


def test_config_names_that_are_not_one_plain_folder_or_that_collide_are_refused(
        factory_spec: Path, tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("ok: {}\n'a/b': {}\n'..': {}\n'': {}\n.hidden: {}\nLow: {}\nlow: {}\n"
                                     f"{'x' * 101}: {{}}\n")
    with pytest.raises(SpecError) as err:
        read_configs(tmp_path / "c.yaml", load_spec(factory_spec))
    named = sorted(p.key for p in err.value.problems)
    assert named == sorted(["a/b", "..", "", ".hidden", "low", "x" * 101]), str(err.value)
    assert "the same folder as Low" in str(err.value) and "at most 100 characters" in str(err.value)


@pytest.mark.integration
@pytest.mark.slow
def test_a_damaged_compare_json_is_rebuilt_from_the_configs_results_on_resume(
        factory_spec: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    configs = tmp_path / "c.yaml"
    configs.write_text("a: {learning_rate: 1.0e-3}\nb: {learning_rate: 1.0e-2}\nc: {learning_rate: 3.0e-2}\n")
    out = tmp_path / "cmp"
    argv = compare_argv(factory_spec, configs, 3, out)
    assert main(argv) == 0
    whole = json.loads((out / "compare.json").read_text())
    damaged = (out / "compare.json").read_bytes()[:200]  # a write cut off
    (out / "compare.json").write_bytes(damaged)
    job = out / "configs" / "c" / "job.json"  # c trained as the configs file had it before an edit: not taken
    job.write_text(json.dumps({**json.loads(job.read_text()), "given": {"learning_rate": 0.5}}))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()

    # Another setting than the folder's: refused as with an intact compare.json, touching nothing.
    assert main([*compare_argv(factory_spec, configs, 4, out), "--resume"]) == 2
    said = capsys.readouterr().err
    assert f"{out} compared with other settings; what differs:\n  steps: 3 -> 4\n" in said, said
    assert "training it again" not in said and "Traceback" not in said, said
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # not moved aside, nothing deleted

    assert main([*argv, "--resume"]) == 0
    said = capsys.readouterr().err
    assert "cannot be read" in said and "rebuilt from the configs' results: a, b" in said, said
    assert "c changed in the configs file: training it again" in said, said
    assert "a: 3 steps" not in said and "[3/3] c: 3 steps" in said  # a and b kept, c trained again
    state = json.loads((out / "compare.json").read_text())
    assert {n: state["runs"][n]["losses"] for n in "ab"} == {n: whole["runs"][n]["losses"] for n in "ab"}
    assert state["runs"]["c"]["status"] == "finished"
    assert (out / "compare.json.damaged").read_bytes() == damaged
