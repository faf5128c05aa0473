"""A lever the default search leaves aside because it changes what is learned (packing) is measured
on the pick, reported with why it is not taken and how to take it (issue 47 item 3): the user
decides, instead of never learning what it would buy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_LLAMA, make_spec_file

from trainfit.cli.tune_render import print_aside
from trainfit.params import Params
from trainfit.probe.measurement import Measurement
from trainfit.spec import load_spec
from trainfit.tune import tune, with_default_search
from trainfit.tune.options import TuneOptions

GiB = 1024**3


def spec_file(tmp_path: Path, texts_file: tuple[Path, list[int]], **extra: Any) -> Path:
    """The tiny Llama trained by the written `trl sft` command (which packs with --packing), no `search:`."""
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA},
                          data={"path": str(texts_file[0]), "text_field": "text"},
                          params={"batch_size": 2, "max_length": 128}, budget={"memory_gb": 8.0})
    if extra:
        path.write_text(path.read_text() + "".join(f"{k}: {json.dumps(v)}\n" for k, v in extra.items()))
    return path


class Padded:
    """Random batches half padding; a packed row trains twice the samples a second."""

    def __init__(self, padding: float = 0.5) -> None:
        self.padding, self.calls = padding, []  # type: ignore[var-annotated]

    def __call__(self, params: Params, number: int) -> Measurement:
        self.calls.append((number, params.batch_size, params.packing, params.gradient_checkpointing))
        speed = 10.0 * params.batch_size * (2.0 if params.packing else 1.0) / (1.5 if params.gradient_checkpointing else 1)
        return Measurement(status="ok", config=params.to_dict(), samples_per_second=speed,
                           tokens_per_second=speed * 50, peak_memory_bytes=GiB * params.batch_size // 4,
                           budget_memory_gb=8.0, budget_headroom_gb=0.0, padding_share=self.padding,
                           step_time_ci95_rel=0.02, steps_measured=8, stable=True, device="cpu")


def test_packing_is_measured_on_the_pick_and_left_to_the_user(tmp_path: Path, texts_file, capsys) -> None:
    probe = Padded()
    result = tune(load_spec(spec_file(tmp_path, texts_file)), TuneOptions(output=tmp_path / "run", probe_fn=probe))
    best = result.summary.best_config
    assert best is not None and "packing" not in best.searched  # not searched, not taken
    [lever] = result.summary.aside
    assert (lever.knob, lever.value, lever.status, lever.fits) == ("packing", True, "ok", True)
    assert lever.searched == {**best.searched, "packing": True, "group_by_length": False}  # what was probed
    assert lever.speedup == pytest.approx(2.0) and "changes what is learned" in lever.why
    assert "search: {packing: [false, true]}" in lever.how
    packed = [c for c in probe.calls if c[2]]
    assert packed == [(-1, best.searched["batch_size"], True, False)]  # one probe, outside the study
    assert result.summary.total_tested == len(probe.calls) - 1
    assert (tmp_path / "run" / "probes" / f"aside-packing-of-trial-{best.trial:04d}" / "measurement.json").exists()
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["aside"][0]["speedup"] == pytest.approx(2.0)
    print_aside(lever)
    out = capsys.readouterr().out
    assert "not taken: packing=true measured on the pick: 40 samples/s, 2.00x the pick's probe" in out

    again = Padded()  # a resumed run reads the kept measurement instead of probing again
    resumed = tune(load_spec(spec_file(tmp_path, texts_file)),
                   TuneOptions(output=tmp_path / "run", probe_fn=again, resume=True))
    assert not [c for c in again.calls if c[2]] and resumed.summary.aside == result.summary.aside


def test_the_speedup_is_in_samples_whatever_the_objective(tmp_path: Path, texts_file) -> None:
    """Ranked by tokens/s, the pick's speed and the packed one's are still compared in samples/s."""
    result = tune(load_spec(spec_file(tmp_path, texts_file, tune={"objective": "tokens_per_second"})),
                  TuneOptions(output=tmp_path / "run", probe_fn=Padded()))
    [lever] = result.summary.aside
    assert lever.speedup == pytest.approx(2.0)


@pytest.mark.parametrize("why, extra, padding, quick", [
    ("the batches are little padding", {}, 0.1, False),
    ("a search: section says what is searched", {"search": {"batch_size": [1, 2]}}, 0.5, False),
    ("--quick", {}, 0.5, True),
])
def test_no_packing_probe_where_it_cannot_pay_or_was_not_left_aside(tmp_path: Path, texts_file, why: str,
                                                                  extra: dict, padding: float, quick: bool) -> None:
    probe = Padded(padding)
    result = tune(load_spec(spec_file(tmp_path, texts_file, **extra)),
                  TuneOptions(output=tmp_path / "run", probe_fn=probe, quick=quick))
    assert result.summary.aside == [] and not [c for c in probe.calls if c[2]], why


@pytest.mark.integration
def test_a_probe_aside_runs_the_real_probe_in_its_own_folder(tmp_path: Path, texts_file) -> None:
    """``Search.probe_aside`` with the default probe: a real probe of the packed config in
    probes/NAME (its request and measurement there), outside the study, and read back there next time."""
    from trainfit.search.loop import open_search
    from trainfit.search.options import SearchOptions

    spec = load_spec(spec_file(tmp_path, texts_file))
    spec = with_default_search(spec)
    with open_search(spec, SearchOptions(output=tmp_path / "run")) as search:
        m = search.probe_aside(spec.search.params({"batch_size": 2, "packing": True}), "aside-packing-test")
        again = search.probe_aside(spec.search.params({"batch_size": 2, "packing": True}), "aside-packing-test")
        trials = search.outcome().trials
    folder = tmp_path / "run" / "probes" / "aside-packing-test"
    assert m.status == "ok", m.message
    assert m.config["packing"] is True and m.samples_per_second > 0
    assert (folder / "request.json").exists() and (folder / "measurement.json").exists()
    assert (again.samples_per_second, again.step_times_s) == (m.samples_per_second, m.step_times_s)  # read back
    assert trials == []
