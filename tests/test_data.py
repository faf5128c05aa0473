"""Length counting and statistics on files written in the test, with exact expected values."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest

from trainfit.cli import main
from trainfit.data import LengthRecipe, LengthStats, count_lengths, summarize
from trainfit.data.readers import iter_rows
from trainfit.data.row_length import BAD
from trainfit.data.stats import count_longer_than, packing_waste, padding_waste, round_up
from trainfit.errors import TrainfitError

EXAMPLE_TOKENIZER = Path(__file__).resolve().parents[1] / "examples" / "data" / "tokenizer.json"
WORDS = LengthRecipe(text_fields=("text",))  # the fallback count: one per word here


def write_jsonl(path: Path, counts: list[int]) -> Path:
    with path.open("w") as f:
        for c in counts:
            f.write(json.dumps({"text": " ".join(["word"] * c), "extra": 1}) + "\n")
    return path


def test_an_unwritable_cache_costs_the_cache_not_the_count(tmp_path: Path, capsys) -> None:
    counts = [3, 1, 4, 1, 5]
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a cache folder under a file cannot be created
    table = count_lengths(write_jsonl(tmp_path / "d.jsonl", counts), WORDS, progress=False,
                          cache_dir=blocker / "cache")
    assert table.lengths.tolist() == counts
    assert "cannot write the length cache" in capsys.readouterr().err


def test_exact_percentiles_and_longest_rows(tmp_path: Path) -> None:
    counts = list(range(1, 101))  # 1..100 words
    counts[10], counts[20] = 500, 400  # two long outliers at known rows
    table = count_lengths(write_jsonl(tmp_path / "d.jsonl", counts), WORDS, progress=False)
    assert table.lengths.tolist() == counts
    stats = summarize(table, percentile=99, multiple=64, batch_size=4, top=3)
    assert (stats.samples, stats.min, stats.max, stats.total) == (100, 1, 500, sum(counts))
    assert stats.percentiles["p50"] == float(np.percentile(counts, 50))
    assert stats.percentiles["p99"] == float(np.percentile(counts, 99))  # 401.0
    assert [(x["row"], x["length"]) for x in stats.longest[:3]] == [(10, 500), (20, 400), (99, 100)]
    assert stats.recommended_max_length == 448  # p99 = 401 rounded up to a multiple of 64
    assert stats.truncated_share == pytest.approx(0.01)
    assert stats.longest_lengths(2) == [500, 400]


def test_padding_waste_figures() -> None:
    lengths = np.array([1, 3, 2, 2])
    assert padding_waste(lengths, 1, None) == 0.0
    assert padding_waste(lengths, 4, None) == pytest.approx(1 - 8 / 12)
    assert padding_waste(lengths, 4, 4) == pytest.approx(1 - 8 / 16)
    assert padding_waste(lengths, 4, 2) == pytest.approx(1 - 7 / 8)  # truncation drops a token
    assert packing_waste(lengths, 3) == pytest.approx(1 - 8 / 9)
    assert round_up(1, 256) == 256 and round_up(257, 256) == 512


def test_every_format_gives_the_same_lengths(tmp_path: Path) -> None:
    texts = ["a b c", "d e", "f g h i"]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (tmp_path / "d.json").write_text(json.dumps([{"text": t} for t in texts]))
    with (tmp_path / "d.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "text"])
        w.writerows(enumerate(texts))
    (tmp_path / "d.tsv").write_text("text\n" + "\n".join(texts) + "\n")
    (tmp_path / "d.txt").write_text("\n".join(texts) + "\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": texts}), tmp_path / "d.parquet")
    hf = tmp_path / "hf"
    hf.mkdir()
    with pa.OSFile(str(hf / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, pa.schema([("text", pa.string())])) as writer:
            writer.write_table(pa.table({"text": texts}))
    (hf / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    names = ["d.jsonl", "d.json", "d.csv", "d.tsv", "d.txt", "d.parquet", "hf"]
    for name in names:
        table = count_lengths(tmp_path / name, WORDS, progress=False, use_cache=False)
        assert table.lengths.tolist() == [3, 2, 4], name
    assert len(names) == 7


def test_tokenizer_counts_and_joined_fields(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(EXAMPLE_TOKENIZER))
    path = tmp_path / "d.jsonl"
    rows = [{"q": "Kato rimen sa", "a": "lo vi dur"}, {"q": "ne", "a": "pa zu el mor"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = LengthRecipe(text_fields=("q", "a"), tokenizer=str(EXAMPLE_TOKENIZER))
    table = count_lengths(path, recipe, progress=False)
    assert table.lengths.tolist() == [len(tok.encode(f"{r['q']}\n{r['a']}").ids) for r in rows]
    assert "tokenized with" in table.description


def test_length_field_with_scale(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text("utt,duration_s\na,1.5\nb,0.014\nc,3\n")
    table = count_lengths(path, LengthRecipe(length_field="duration_s", length_scale=100), progress=False)
    assert table.lengths.tolist() == [150, 2, 300]  # rounded up to whole frames


def test_missing_field_names_the_fields_that_exist(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [3, 4])
    with pytest.raises(TrainfitError, match="no field 'txt'") as info:
        count_lengths(path, LengthRecipe(text_fields=("txt",)), progress=False)
    assert "text, extra" in str(info.value)


def test_bad_rows_stop_with_line_numbers_or_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"text": "a b"}\n{"text": broken\n{"text": "c"}\n{"text": "\xff\xfe"}\n{"other": 1}\n')
    with pytest.raises(TrainfitError, match="line 2: invalid JSON"):
        count_lengths(path, WORDS, progress=False)
    table = count_lengths(path, WORDS, on_bad_row="skip", progress=False)
    assert table.lengths.tolist() == [2, BAD, 1, BAD, BAD]
    assert table.bad_rows == 3
    reasons = [b["reason"] for b in table.bad_examples]
    assert reasons[0].startswith("invalid JSON") and reasons[1].startswith("not UTF-8")
    assert reasons[2] == "missing field 'text'"
    stats = summarize(table)
    assert stats.samples == 2 and stats.bad_rows == 3


def test_a_byte_order_mark_is_named_with_how_to_remove_it(tmp_path: Path) -> None:
    import subprocess

    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"text": "a b"}\n{"text": "c"}\n')
    with pytest.raises(TrainfitError, match="line 1: starts with a UTF-8 byte-order mark") as err:
        count_lengths(path, WORDS, progress=False)
    command = str(err.value).split("(e.g. ", 1)[1].split(")", 1)[0].replace("FILE", str(path))
    subprocess.run(command, shell=True, check=True)  # the fix it gives works
    assert count_lengths(path, WORDS, progress=False).lengths.tolist() == [2, 1]


def test_empty_and_missing_files(tmp_path: Path) -> None:
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(TrainfitError, match="has no rows"):
        count_lengths(tmp_path / "e.jsonl", WORDS, progress=False)
    with pytest.raises(TrainfitError, match="does not exist"):
        count_lengths(tmp_path / "nope.jsonl", WORDS, progress=False)
    (tmp_path / "blank.jsonl").write_text('{"text": ""}\n{"text": ""}\n')  # rows there, every text empty
    with pytest.raises(TrainfitError, match="every row of blank.jsonl is 0 positions long") as err:
        count_lengths(tmp_path / "blank.jsonl", WORDS, progress=False)
    assert "data.text_field" in (err.value.hint or "")
    (tmp_path / "some.jsonl").write_text('{"text": ""}\n{"text": "a b"}\n{"text": ""}\n')
    table = count_lengths(tmp_path / "some.jsonl", WORDS, progress=False)
    assert table.lengths.tolist() == [0, 2, 0] and any(n.startswith("rows 0 positions long: 2 of them") for n in
                                                       table.notes)


def test_interrupted_count_resumes_and_finished_count_is_cached(tmp_path: Path) -> None:
    counts = [(i % 17) + 1 for i in range(5000)]
    path = write_jsonl(tmp_path / "d.jsonl", counts)
    cache = tmp_path / "cache"
    seen: list[int] = []

    class Interrupt(Exception):
        pass

    def stop_halfway(rows_done: int) -> None:
        seen.append(rows_done)
        if rows_done >= 2500:
            raise Interrupt

    with pytest.raises(Interrupt):
        count_lengths(path, WORDS, cache_dir=cache, batch_rows=500, checkpoint_every_s=0, progress=False,
                      on_batch=stop_halfway)
    resumed_from: list[int] = []
    table = count_lengths(path, WORDS, cache_dir=cache, batch_rows=500, progress=False,
                          on_batch=resumed_from.append)
    assert table.lengths.tolist() == counts
    # Interrupted while handling rows 2,000-2,500 (checkpointed up to 2,000): resumes there.
    assert resumed_from[0] == 2500
    assert any("resumed" in n for n in table.notes)
    again = count_lengths(path, WORDS, cache_dir=cache, progress=False)
    assert again.from_cache and again.lengths.tolist() == counts


def test_rows_stream_lazily(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [1] * 10)
    rows = iter_rows(path)
    assert next(rows)[0] == 0  # a generator: nothing is read ahead


def test_count_longer_than_is_exact_for_small_sets(tmp_path: Path) -> None:
    table = count_lengths(write_jsonl(tmp_path / "d.jsonl", list(range(1, 201))), WORDS, progress=False)
    stats = summarize(table)
    assert count_longer_than(stats, 150) == (50, True)


def test_cli_analyze_json_round_trip_and_plot(tmp_path: Path, capsys) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", list(range(1, 51)))
    out, plot = tmp_path / "lengths.json", tmp_path / "lengths.html"
    assert main(["analyze", str(path), "--text-field", "text", "--json", str(out), "--plot", str(plot),
                 "--max-positions", "40", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "p99.5" in printed and "histogram" in printed and "exceed the model's 40 positions" in printed
    stats = LengthStats.from_dict(json.loads(out.read_text()))
    assert stats.max == 50 and stats.over_max_positions == 10
    page = plot.read_text()
    assert "<svg" in page and "length (positions)" in page and ">samples</text>" in page
    # the y-axis says how many samples the tallest bar holds
    assert f">{max(stats.histogram['counts']):,}</text>" in page
    assert main(["analyze", str(path), "--text-field", "nope", "--quiet"]) == 2
    assert "fields in the first row: text, extra" in capsys.readouterr().err
    for option, message in ((["--multiple", "0"], "--multiple: 0 is out of range: expected an integer >= 1"),
                            (["--percentile", "150"],
                             "--percentile: 150 is out of range: expected a number > 0 and <= 100")):
        with pytest.raises(SystemExit) as exit_:  # a usage error, not a ZeroDivisionError traceback
            main(["analyze", str(path), "--text-field", "text", "--quiet", *option])
        assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_chat_messages_use_the_chat_template(tmp_path: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path / "tok"
    hf = PreTrainedTokenizerFast(tokenizer_file=str(EXAMPLE_TOKENIZER), bos_token="<s>", eos_token="</s>")
    hf.chat_template = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}")
    hf.save_pretrained(folder)
    chats = [[{"role": "user", "content": "kato rimen"}, {"role": "assistant", "content": "sa lo vi dur ne"}],
             [{"role": "user", "content": "pa"}]]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats))
    table = count_lengths(path, LengthRecipe(messages_field="messages", tokenizer=str(folder)), progress=False)
    expected = [len(hf(hf.apply_chat_template(c, tokenize=False), add_special_tokens=False)["input_ids"])
                for c in chats]
    assert table.lengths.tolist() == expected
    assert table.notes == []
    # Without a template the messages are rendered as 'role: content' lines, and the result says so.
    plain = tmp_path / "plain"
    PreTrainedTokenizerFast(tokenizer_file=str(EXAMPLE_TOKENIZER)).save_pretrained(plain)
    table = count_lengths(path, LengthRecipe(messages_field="messages", tokenizer=str(plain)), progress=False)
    assert any("no chat template" in n for n in table.notes)


def test_resume_works_for_csv_too(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("text\n" + "".join(" ".join(["w"] * ((i % 9) + 1)) + "\n" for i in range(3000)))
    cache = tmp_path / "cache"

    def stop(rows_done: int) -> None:
        if rows_done >= 2000:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        count_lengths(path, WORDS, cache_dir=cache, batch_rows=500, checkpoint_every_s=0, progress=False,
                      on_batch=stop)
    table = count_lengths(path, WORDS, cache_dir=cache, batch_rows=500, progress=False)
    assert table.lengths.tolist() == [(i % 9) + 1 for i in range(3000)]


def test_recommended_length_is_capped_only_when_beyond_the_model(tmp_path: Path) -> None:
    table = count_lengths(write_jsonl(tmp_path / "d.jsonl", list(range(1, 301))), WORDS, progress=False)
    free = summarize(table, percentile=99, multiple=64, max_positions=1024)
    assert free.recommended_max_length == 320 and "capped" not in free.recommended_rule
    capped = summarize(table, percentile=99, multiple=64, max_positions=256)
    assert capped.recommended_max_length == 256 and "capped at the model's 256 positions" in capped.recommended_rule


def test_a_folder_of_shards_or_a_pattern_reads_as_one_dataset(tmp_path: Path) -> None:
    """train-0000x-of-0000n files are how datasets ship: a folder of them, or a glob, is one
    dataset with one row index across files (so an interrupted count resumes mid-shard)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trainfit.data.readers import fingerprint
    from trainfit.data_paths import data_files

    shards = tmp_path / "train"
    (shards / "x-more").mkdir(parents=True)  # sorted by path: after the top-level shards
    counts = [[(i % 7) + 1 for i in range(1200)], [(i % 5) + 2 for i in range(800)], [9, 1, 4]]
    for n, c in zip(("train-00000-of-00003", "train-00001-of-00003", "x-more/train-00002-of-00003"), counts):
        pq.write_table(pa.table({"text": [" ".join(["w"] * k) for k in c]}), shards / f"{n}.parquet")
    (shards / ".cache").mkdir()
    (shards / ".cache" / "stale.parquet").write_bytes(b"not read")  # hidden: not a shard
    (shards / "README.md").write_text("a dataset card: not a shard")
    every = [k for c in counts for k in c]
    assert [f.name for f in data_files(shards)] == [f"train-0000{i}-of-00003.parquet" for i in (0, 1)] + [
        "train-00002-of-00003.parquet"]
    assert count_lengths(shards, WORDS, progress=False, use_cache=False).lengths.tolist() == every
    pattern = f"{shards}/*.parquet"  # the two top-level shards
    assert count_lengths(pattern, WORDS, progress=False, use_cache=False).lengths.tolist() == every[:2000]
    assert [i for i, _ in iter_rows(shards, skip=1199)][:3] == [1199, 1200, 1201]  # one index over the files

    cache = tmp_path / "cache"

    def stop(rows_done: int) -> None:
        if rows_done >= 1500:  # in the second shard
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        count_lengths(shards, WORDS, cache_dir=cache, batch_rows=500, checkpoint_every_s=0, progress=False,
                      on_batch=stop)
    resumed = count_lengths(shards, WORDS, cache_dir=cache, batch_rows=500, progress=False)
    assert resumed.lengths.tolist() == every and any("resumed" in n for n in resumed.notes)

    before = fingerprint(shards)
    pq.write_table(pa.table({"text": ["w w"]}), shards / "x-more" / "train-00002-of-00003.parquet")
    assert fingerprint(shards) != before  # a changed shard is a new dataset for the cache
    (shards / "extra.jsonl").write_text(json.dumps({"text": "w"}) + "\n")
    with pytest.raises(TrainfitError, match="mixes formats"):
        count_lengths(shards, WORDS, progress=False)
    with pytest.raises(TrainfitError, match="matches no file"):
        count_lengths(f"{shards}/*.csv", WORDS, progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrainfitError, match="no data files"):
        count_lengths(tmp_path / "empty", WORDS, progress=False)
    (tmp_path / "dd").mkdir()
    (tmp_path / "dd" / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    with pytest.raises(TrainfitError, match="DatasetDict with the splits train, test") as info:
        count_lengths(tmp_path / "dd", WORDS, progress=False)
    assert str(tmp_path / "dd" / "train") in str(info.value)


def test_compressed_line_files_read_like_plain_ones(tmp_path: Path) -> None:
    import bz2
    import gzip
    import lzma

    texts = ["a b c", "d e", "f g h i"]
    jsonl = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    (tmp_path / "d.jsonl.gz").write_bytes(gzip.compress(jsonl))
    (tmp_path / "d.json.bz2").write_bytes(bz2.compress(json.dumps([{"text": t} for t in texts]).encode()))
    (tmp_path / "d.csv.xz").write_bytes(lzma.compress(("text\n" + "\n".join(texts) + "\n").encode()))
    (tmp_path / "d.txt.gz").write_bytes(gzip.compress(("\n".join(texts) + "\n").encode()))
    for name in ("d.jsonl.gz", "d.json.bz2", "d.csv.xz", "d.txt.gz"):
        assert count_lengths(tmp_path / name, WORDS, progress=False, use_cache=False).lengths.tolist() == [3, 2, 4]
    shards = tmp_path / "shards"
    shards.mkdir()
    for i in range(2):
        (shards / f"part-{i}.jsonl.gz").write_bytes(gzip.compress(jsonl))
    assert count_lengths(shards, WORDS, progress=False, use_cache=False).lengths.tolist() == [3, 2, 4] * 2


def write_wav(path: Path, seconds: float, rate: int = 16_000) -> None:
    """A mono 16-bit WAV of ``seconds`` of silence, through the standard library."""
    import wave

    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(b"\0\0" * int(seconds * rate))


def test_audio_lengths_are_each_files_duration_from_its_header(tmp_path: Path, capsys) -> None:
    """A manifest naming WAV files (relative to its folder, or absolute): each length is the file's
    duration times the frames a second, rounded up, read from the header; a missing or damaged file
    is a bad row with its reason; the CLI says the same."""
    seconds = [1.0, 2.5, 0.3, 4.0]
    for i, s in enumerate(seconds):
        write_wav(tmp_path / "wavs" / f"{i}.wav", s, rate=22_050 if i % 2 else 16_000)
    (tmp_path / "bad.wav").write_bytes(b"RIFF not audio")
    rows = [{"path": f"wavs/{i}.wav", "text": "x"} for i in range(4)]
    rows.append({"path": str(tmp_path / "wavs" / "0.wav"), "text": "absolute"})
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = LengthRecipe(audio_field="path", length_scale=75)
    table = count_lengths(manifest, recipe, cache_dir=tmp_path / "cache", progress=False)
    assert table.lengths.tolist() == [75, 188, 23, 300, 75]  # ceil(seconds x 75)
    assert not table.approximate and "audio file in 'path'" in table.description
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text(json.dumps({"path": "bad.wav"}) + "\n" + json.dumps({"path": "gone.wav"}) + "\n"
                       + json.dumps({"path": "wavs/1.wav"}) + "\n")
    skipped = count_lengths(damaged, recipe, on_bad_row="skip", cache_dir=tmp_path / "cache", progress=False)
    assert skipped.bad_rows == 2 and skipped.valid.tolist() == [188]
    assert "No such file" in skipped.bad_examples[1]["reason"]
    assert main(["analyze", str(manifest), "--audio-field", "path", "--frames-per-second", "75", "--quiet"]) == 0
    assert "audio file in 'path'" in capsys.readouterr().out
    from conftest import TINY_LLAMA, make_spec_file

    from trainfit.data.analyze import analyze_spec
    from trainfit.spec import load_spec

    spec = load_spec(make_spec_file(tmp_path, model={"config": TINY_LLAMA},
                                    data={"path": str(manifest), "audio_field": "path", "length_scale": 75}))
    assert analyze_spec(spec, progress=False, cache_dir=tmp_path / "cache").max == 300


def test_a_wav_header_that_claims_more_than_the_file_holds_is_not_believed(tmp_path: Path) -> None:
    """A WAV cut short keeps the header of the whole file, and a streamed one claims 4 GB: the
    duration is what the file holds; a file of no audio is a bad row, not a length of 0."""
    from trainfit.data.audio import audio_seconds

    write_wav(tmp_path / "whole.wav", 2.0)
    data = (tmp_path / "whole.wav").read_bytes()
    (tmp_path / "cut.wav").write_bytes(data[: len(data) // 4])  # a quarter of it, the header saying 2 s
    assert audio_seconds(tmp_path / "cut.wav") == pytest.approx(0.5, abs=0.01)
    streamed = bytearray(data)
    streamed[40:44] = (0xFFFFFFFF).to_bytes(4, "little")  # the data chunk's size: unknown when written
    (tmp_path / "streamed.wav").write_bytes(bytes(streamed))
    assert audio_seconds(tmp_path / "streamed.wav") == pytest.approx(2.0)
    write_wav(tmp_path / "empty.wav", 0.0)
    with pytest.raises(ValueError, match="holds no audio"):
        audio_seconds(tmp_path / "empty.wav")
    with pytest.raises(ValueError, match="cannot read"):
        audio_seconds(tmp_path / "gone.wav")
    # Cut inside its header, or empty: wave's EOFError says nothing, the reason says how (issue 45).
    for name, head, reason in (("none.wav", b"", "(empty file)"),
                               ("header.wav", data[:30], f"(truncated: 30 bytes, its header says {len(data):,})"),
                               ("riff.wav", data[:4], "(truncated: its 4 bytes end inside the header)")):
        (tmp_path / name).write_bytes(head)
        with pytest.raises(ValueError) as info:
            audio_seconds(tmp_path / name)
        assert str(info.value) == f"{name} is no WAV the standard library reads {reason}"


def test_text_and_audio_lengths_are_both_kept_and_the_one_that_drives_memory_decides(tmp_path: Path, capsys) -> None:
    """A TTS manifest with each sample's text and its audio file: both lengths are counted (each
    cached on its own), and a sample is as long as its text tokens and audio frames together (a
    TTS language model holds them in one sequence), or as ``length_by`` says."""
    seconds, texts = [1.0, 0.2, 3.0], ["one two three", "a b c d e f g h i j k l m n o p q r s t u v w x y z", "hi"]
    for i, s in enumerate(seconds):
        write_wav(tmp_path / f"{i}.wav", s)
    manifest = tmp_path / "tts.jsonl"
    manifest.write_text("".join(json.dumps({"path": f"{i}.wav", "text": t}) + "\n" for i, t in enumerate(texts)))
    words = [3, 26, 1]  # word pieces: no tokenizer
    frames = [75, 15, 225]  # ceil(seconds x 75)
    for by, expected in (("sum", [w + f for w, f in zip(words, frames)]), ("max", [75, 26, 225]),
                         ("text", words), ("audio", frames)):
        recipe = LengthRecipe(text_fields=("text",), audio_field="path", length_scale=75, length_by=by)
        table = count_lengths(manifest, recipe, cache_dir=tmp_path / "cache", progress=False)
        assert table.lengths.tolist() == expected, by
        assert table.parts["text"].tolist() == words and table.parts["audio"].tolist() == frames
    assert "the sum of text in 'text'" in LengthRecipe(text_fields=("text",), audio_field="path").describe()
    assert main(["analyze", str(manifest), "--text-field", "text", "--audio-field", "path", "--frames-per-second",
                 "75", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "41 / 115.0 / 226" in out  # min / mean / max of the sums 78, 41 and 226
    assert re.search(r"text\s+median 3, p99 26, max 26", out) and re.search(r"audio\s+median 75, p99 222, max 225", out)
    with pytest.raises(TrainfitError, match="length_by 'longest' is not one of"):
        LengthRecipe(text_fields=("text",), audio_field="path", length_by="longest")
