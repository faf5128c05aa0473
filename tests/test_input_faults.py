"""Faults of what a user hands trainfit, found from outside (issue #35, group D): a dataset path that
is a device or a pipe, seeds out of range, a text field that is not text, numbers YAML 1.1 reads as
text and budgets past any machine. Real files, FIFOs and processes; each case failed before its fix."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import wave
from pathlib import Path

import pytest
from conftest import EXAMPLES, TINY_LLAMA, make_spec_file

from trainfit.cli import main
from trainfit.data import LengthRecipe, count_lengths
from trainfit.data.readers import fingerprint
from trainfit.data.row_length import BAD
from trainfit.data_paths import data_files
from trainfit.errors import SpecError, TrainfitError
from trainfit.spec import load_spec, load_yaml
from trainfit.tune.budgets import parse_budgets

WORDS = LengthRecipe(text_fields=("text",))  # the fallback count: one per word here
EXAMPLE_TOKENIZER = EXAMPLES / "data" / "tokenizer.json"


def _limited_memory() -> None:
    """A child's address space capped at 2 GiB: a reader gone unbounded fails there, not on the host."""
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def _analyze(path: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``trainfit analyze PATH`` in a child process bounded in memory and time."""
    return subprocess.run([sys.executable, "-m", "trainfit", "analyze", path, "--text-field", "text", "--quiet"],
                          capture_output=True, text=True, timeout=120, preexec_fn=_limited_memory,
                          env={**os.environ, "TRAINFIT_CACHE": str(tmp_path / "cache")}, cwd=tmp_path)


@pytest.mark.integration
def test_a_device_or_a_pipe_as_the_dataset_is_refused_naming_it(tmp_path: Path) -> None:
    """``data.path=/dev/zero`` was read whole by the fingerprint (24 GB, then the OOM killer); a pipe
    (``<(cat data.jsonl)``) blocked, or read as empty."""
    fifo = tmp_path / "rows.jsonl"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a pipe (FIFO)"), (Path("/dev/zero"), "a character device")):
        with pytest.raises(TrainfitError, match="not a regular file") as info:
            data_files(path)
        assert f"{path} is {kind}, not a regular file" in str(info.value)
        assert "save its content as a file" in str(info.value)
        with pytest.raises(TrainfitError, match="not a regular file"):
            fingerprint(path)
    spec = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, data={"path": str(fifo), "text_field": "text"},
                          params={"max_length": 64})
    with pytest.raises(SpecError) as spec_error:
        load_spec(spec, ["data.path=/dev/zero"])
    assert [p.key for p in spec_error.value.problems] == ["data.path"]
    assert "/dev/zero is a character device, not a regular file" in str(spec_error.value)
    with pytest.raises(SpecError, match=f"data.path: {fifo} is a pipe"):
        load_spec(spec)
    link = tmp_path / "zero.jsonl"
    link.symlink_to("/dev/zero")
    with pytest.raises(TrainfitError, match="zero.jsonl is a character device"):
        data_files(link)
    with pytest.raises(TrainfitError, match="rows.jsonl is a pipe"):  # a glob's match is read, never left out
        data_files(str(tmp_path / "*.jsonl"))

    with pytest.raises(SpecError, match="tokenizer: /dev/zero is a character device, not a file or folder"):
        load_spec(spec, [f"data.path={_rows(tmp_path / 'd.jsonl', [{'text': 'a'}])}", "tokenizer=/dev/zero"])
    with pytest.raises(TrainfitError, match="the tokenizer /dev/zero is a character device"):
        count_lengths(tmp_path / "d.jsonl", LengthRecipe(text_fields=("text",), tokenizer="/dev/zero"), progress=False)
    piped_spec = tmp_path / "spec-pipe.yaml"
    os.mkfifo(piped_spec)
    with pytest.raises(TrainfitError, match="spec .*spec-pipe.yaml is a pipe"):  # was "not found"
        load_spec(piped_spec)

    # The CLI, as the fault tester ran it: one line, status 2, in bounded memory and time.
    for path in (fifo, link):
        done = _analyze(str(path), tmp_path)
        assert done.returncode == 2, done.stderr[-2000:]
        assert "not a regular file" in done.stderr and "Traceback" not in done.stderr


def _wav(path: Path, seconds: float, rate: int = 16_000) -> Path:
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(b"\0\0" * int(seconds * rate))
    return path


@pytest.mark.integration
def test_a_pipe_or_a_device_a_manifest_names_as_audio_is_a_bad_row_naming_it(tmp_path: Path) -> None:
    """A FIFO given as an audio file hung `trainfit analyze` for good (opening it waits for a writer);
    a device was read as if it were audio (issue 45). Each is a bad row saying what it is."""
    _wav(tmp_path / "ok.wav", 1.0)
    os.mkfifo(tmp_path / "pipe.wav")
    (tmp_path / "zero.wav").symlink_to("/dev/zero")
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text("".join(json.dumps({"path": p}) + "\n" for p in ("ok.wav", "pipe.wav", "zero.wav", "/dev/null")))
    done = subprocess.run([sys.executable, "-m", "trainfit", "analyze", str(manifest), "--audio-field", "path",
                           "--quiet"], capture_output=True, text=True, timeout=60, preexec_fn=_limited_memory,
                          env={**os.environ, "TRAINFIT_CACHE": str(tmp_path / "cache")}, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"manifest.jsonl, row 1: {tmp_path / 'pipe.wav'} is a pipe (FIFO), not a regular file" in done.stderr
    table = count_lengths(manifest, LengthRecipe(audio_field="path", length_scale=75), on_bad_row="skip",
                          cache_dir=tmp_path / "cache", progress=False)
    assert table.valid.tolist() == [75] and table.bad_rows == 3
    reasons = [bad["reason"] for bad in table.bad_examples]
    assert reasons == [f"{tmp_path / 'pipe.wav'} is a pipe (FIFO), not a regular file",
                       f"{tmp_path / 'zero.wav'} is a character device, not a regular file",
                       "/dev/null is a character device, not a regular file"]


@pytest.mark.integration
def test_a_pipe_among_a_folders_shards_is_refused_naming_it_not_left_out(tmp_path: Path) -> None:
    """A FIFO among a folder's shards (or matched by a glob) was left out without a word, its rows
    silently missing from every count (issue 45): it is refused, named, as one given alone is."""
    shards = tmp_path / "shards"
    shards.mkdir()
    _rows(shards / "a.jsonl", [{"text": "one two"}])
    os.mkfifo(shards / "b.jsonl")
    (shards / "notes.md").symlink_to("/dev/zero")  # not a data file's name: not the dataset's, as before
    for path in (shards, str(shards / "*.jsonl")):
        with pytest.raises(TrainfitError, match=f"{shards / 'b.jsonl'} is a pipe \\(FIFO\\), not a regular file"):
            data_files(path)
    done = _analyze(str(shards), tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"{shards / 'b.jsonl'} is a pipe (FIFO), not a regular file" in done.stderr
    (shards / "b.jsonl").unlink()
    assert data_files(shards) == [shards / "a.jsonl"]


@pytest.mark.parametrize("override", ["probe.seed=-1", "probe.seed=4294967296", "tune.seed=-5",
                                      f"tune.seed={2**64}"])
def test_a_seed_out_of_range_is_a_spec_problem(tmp_path: Path, override: str) -> None:
    """numpy's and Optuna's seeding take 0 to 2**32 - 1: -1 crashed the parent with numpy's traceback,
    2**64 the probe with torch's."""
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64})
    key = override.split("=")[0]
    with pytest.raises(SpecError) as info:
        load_spec(path, [override])
    assert [str(p) for p in info.value.problems] == [f"{key}: must be between 0 and 4,294,967,295"]
    for seed in (0, 2**32 - 1):  # both ends are seeds
        assert load_spec(path, [f"{key}={seed}"]).to_dict()[key.split(".")[0]]["seed"] == seed


def test_a_seed_out_of_range_is_one_line_from_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64})
    assert main(["probe", str(path), "--set", "probe.seed=-1"]) == 2
    err = capsys.readouterr().err
    assert "probe.seed: must be between 0 and 4,294,967,295" in err and "Traceback" not in err


def _rows(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_text_field_that_is_not_text_is_a_bad_row(tmp_path: Path) -> None:
    """``{"text": 42}`` was counted as a 2-token sample ("42"), without a word."""
    path = _rows(tmp_path / "d.jsonl", [{"text": "a b"}, {"text": 42}, {"text": ["x", "y"]}, {"text": "c"}])
    with pytest.raises(TrainfitError, match=r"d.jsonl, row 1: 'text' holds int 42, not text") as info:
        count_lengths(path, WORDS, progress=False)
    assert "--on-bad-row skip" in str(info.value)
    table = count_lengths(path, WORDS, on_bad_row="skip", progress=False)
    assert table.lengths.tolist() == [2, BAD, BAD, 1] and table.bad_rows == 2
    assert table.bad_examples[1]["reason"] == "'text' holds list ['x', 'y'], not text"
    joined = _rows(tmp_path / "j.jsonl", [{"q": "a", "a": "b c"}, {"q": "a", "a": 7.5}, {"q": None, "a": "b"}])
    both = count_lengths(joined, LengthRecipe(text_fields=("q", "a")), on_bad_row="skip", progress=False)
    assert both.lengths.tolist() == [3, BAD, 1]  # a null part still joins as empty
    assert both.bad_examples[0]["reason"] == "'a' holds float 7.5, not text"


def test_messages_that_are_not_messages_are_bad_rows_not_tracebacks(tmp_path: Path) -> None:
    """A message that is not an object crashed the count with an AttributeError."""
    good = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": None}]
    path = _rows(tmp_path / "c.jsonl", [{"messages": good}, {"messages": ["hi"]},
                                        {"messages": [{"role": "user", "content": 3}]}])
    recipe = LengthRecipe(messages_field="messages")
    with pytest.raises(TrainfitError, match=r"c.jsonl, row 1: 'messages' item 0 is str 'hi', not a message"):
        count_lengths(path, recipe, progress=False)
    table = count_lengths(path, recipe, on_bad_row="skip", progress=False)
    assert table.lengths.tolist()[1:] == [BAD, BAD] and table.lengths[0] > 0
    assert table.bad_examples[1]["reason"] == "'messages' item 0 has content int 3, not text, a list of parts or null"


def test_scientific_notation_is_a_number_as_yaml_1_2_reads_it(tmp_path: Path) -> None:
    """PyYAML (YAML 1.1) read ``1e9``, ``1.0e308`` and ``1e-6`` as text: ``memory_gb: 1e9`` was
    "expected a number, got '1e9'" and an inline model's ``rms_norm_eps: 1e-6`` a string."""
    assert load_yaml("a: 1e9\nb: 1.0e308\nc: 1e-6\nd: -2.5E+3\ne: .5e1\nf: 1_000e2\ng: 1.0e+9\nh: e9\ni: 1e\n",
                     "t") == {"a": 1e9, "b": 1e308, "c": 1e-6, "d": -2500.0, "e": 5.0, "f": 1e5, "g": 1e9,
                              "h": "e9", "i": "1e"}
    assert load_yaml("[12, 0x10, 1.5, .inf, v1e5]", "t")[:3] == [12, 16, 1.5]
    path = make_spec_file(tmp_path, model={"config": {**TINY_LLAMA, "rms_norm_eps": "1e-6"}},
                          params={"max_length": 64})
    path.write_text(path.read_text().replace("'1e-6'", "1e-6"))
    spec = load_spec(path, ["budget.memory_gb=2e1", "budget.headroom_gb=5e-1"])
    assert spec.model.config["rms_norm_eps"] == 1e-6
    assert (spec.budget.memory_gb, spec.budget.headroom_gb) == (20.0, 0.5)


def test_a_yaml_date_is_the_text_written_and_a_wrong_type_is_a_problem_under_its_key(
        llama_spec, capsys: pytest.CaptureFixture[str]) -> None:
    """PyYAML (YAML 1.1) read ``2024-01-01`` as a ``datetime.date``, which the overrides' JSON copy
    could not hold: ``load_spec`` raised a TypeError, a traceback from the CLI, wherever a date was."""
    assert load_yaml("a: 2024-01-01\nb: 2024-01-01 10:00:00\n2024-01-02: x\nc: !!timestamp 2024-01-03\n", "t") == {
        "a": "2024-01-01", "b": "2024-01-01 10:00:00", "2024-01-02": "x", "c": "2024-01-03"}
    with pytest.raises(TrainfitError, match="not 'binary' values: write the value out"):
        load_yaml("a: !!binary aGk=\n", "t")  # bytes and sets are refused where written: no JSON holds them
    path = llama_spec()
    path.write_text(path.read_text().replace("text_field: text", "text_field: 2024-01-01"))
    data = load_spec(path).data
    assert data is not None and data.text_field == "2024-01-01"  # a string field takes the text
    path.write_text(path.read_text() + "budget: {memory_gb: 2024-01-01}\nnotes: 2024-01-01\n")
    with pytest.raises(SpecError) as info:
        load_spec(path, ["lora_alpha=2024-01-02"])
    assert [str(p) for p in info.value.problems] == [
        "notes: unknown section (sections are: model, tokenizer, data, params, budget, probe, search, tune, plan, train)",
        "budget.memory_gb: expected a number (or null), got '2024-01-01'",
        "params.lora_alpha: expected a number, got '2024-01-02'"]
    assert main(["probe", str(path)]) == 2
    err = capsys.readouterr().err
    assert "budget.memory_gb: expected a number (or null), got '2024-01-01'" in err and "Traceback" not in err


def test_a_budget_past_any_machine_is_refused_with_its_bound(tmp_path: Path) -> None:
    """``memory_gb: 1.0e308`` overflowed when made bytes (``int(inf)``) in the probe's parent."""
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64})
    with pytest.raises(SpecError) as info:
        load_spec(path, ["budget.memory_gb=1.0e308", "budget.headroom_gb=1e300"])
    assert [str(p) for p in info.value.problems] == [
        "budget.memory_gb: must be <= 1,048,576 GiB (a pebibyte), got 1e+308",
        "budget.headroom_gb: must be <= 1,048,576 GiB (a pebibyte), got 1e+300"]
    assert load_spec(path, ["budget.memory_gb=1048576"]).budget.memory_gb == 2**20
    with pytest.raises(TrainfitError, match="--budgets 1e308,8: each budget must be <= 1,048,576 GiB"):
        parse_budgets("1e308,8")
    with pytest.raises(TrainfitError, match="give two or more positive budgets"):
        parse_budgets("inf,8")  # float("inf") passed the "> 0" check
    assert parse_budgets("8,1.6e1") == [16.0, 8.0]


def test_messages_a_chat_template_refuses_are_a_bad_row(tmp_path: Path) -> None:
    """A template's ``raise_exception`` (roles that do not alternate, a system turn it does not take)
    ended the count with jinja's traceback."""
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path / "tok"
    hf = PreTrainedTokenizerFast(tokenizer_file=str(EXAMPLE_TOKENIZER), bos_token="<s>", eos_token="</s>")
    hf.chat_template = ("{% if messages[0]['role'] != 'user' %}{{ raise_exception('the first turn must be the "
                        "user') }}{% endif %}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    hf.save_pretrained(folder)
    path = _rows(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": "pa"}]},
                                        {"messages": [{"role": "assistant", "content": "pa"}]}])
    recipe = LengthRecipe(messages_field="messages", tokenizer=str(folder))
    with pytest.raises(TrainfitError, match=r"c.jsonl, row 1: the chat template refused the messages: the first "
                                            r"turn must be the user"):
        count_lengths(path, recipe, progress=False)
    table = count_lengths(path, recipe, on_bad_row="skip", progress=False)
    assert table.lengths[0] > 0 and table.lengths[1] == BAD
