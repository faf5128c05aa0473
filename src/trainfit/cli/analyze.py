"""``trainfit analyze``: sample lengths, percentiles, longest samples, padding advice."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from trainfit.cli import COMMANDS
from trainfit.cli.common import number, output_file
from trainfit.data.analyze import analyze_spec
from trainfit.data.lengths import count_lengths
from trainfit.data.plot import histogram_html
from trainfit.data.row_length import LengthRecipe
from trainfit.files import write_atomically
from trainfit.spec import LENGTH_BY
from trainfit.data.stats import summarize
from trainfit.errors import TrainfitError
from trainfit.format import table
from trainfit.spec import load_spec

EPILOG = """\
examples:
  trainfit analyze data/train.jsonl --text-field text --tokenizer ./tokenizer --json lengths.json
  trainfit analyze data/manifest.csv --length-field duration_s --length-scale 100   # audio frames
  trainfit analyze data/manifest.csv --audio-field path --frames-per-second 75   # each file's header
  trainfit analyze chats.jsonl --messages-field messages --tokenizer ./model         # chat template
  trainfit analyze --spec examples/tiny-llama.yaml --plot lengths.html

Counts are cached by (file, tokenizer, fields): a repeat is instant, and an interrupted count
resumes where it stopped. The JSON is what `trainfit probe --lengths` reads.
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("analyze", help=COMMANDS["analyze"],
                       description="Stream a dataset, count each sample's length, and summarize: percentiles, "
                                   "longest samples, recommended fixed padding, padding waste.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", nargs="?", help="JSONL, JSON, CSV/TSV, Parquet, text, a save_to_disk folder, or "
                   "shards: a folder of data files or a quoted glob ('data/train-*.parquet')")
    p.add_argument("--spec", help="take path, fields and tokenizer from a spec's data section")
    p.add_argument("--text-field", action="append", default=[], metavar="FIELD",
                   help="field holding the text; repeat to join several fields")
    p.add_argument("--messages-field", metavar="FIELD", help="chat messages, rendered with the chat template")
    p.add_argument("--length-field", metavar="FIELD", help="a numeric field that is the length (e.g. duration_s)")
    p.add_argument("--audio-field", metavar="FIELD",
                   help="a field naming each sample's audio file (relative to the data file's folder): its "
                        "duration, read from the file's header (WAV; FLAC, OGG... with soundfile), is the length")
    p.add_argument("--length-scale", "--frames-per-second", dest="length_scale", type=number(float, above=0),
                   default=1.0, help="positions per unit of --length-field, or frames per second of --audio-field's "
                                     "audio (e.g. 75 codec frames; mel frames: the sample rate over the hop length)")
    p.add_argument("--length-by", choices=LENGTH_BY, default="sum",
                   help="with a text field and --audio-field both: the length that drives memory, so each "
                        "sample's: sum (text tokens and audio frames in one sequence, as a TTS language model "
                        "holds them; default), max, text or audio; both are shown")
    p.add_argument("--tokenizer", help="tokenizer folder or tokenizer.json (default: a stated approximation)")
    p.add_argument("--format", default="auto", help="auto, jsonl, json, csv, tsv, parquet, text, hf")
    p.add_argument("--on-bad-row", choices=("stop", "skip"), default="stop",
                   help="malformed rows: stop with the line number (default) or count and skip them")
    p.add_argument("--percentile", type=number(float, above=0, at_most=100), default=99.5,
                   help="percentile for the fixed length (99.5)")
    p.add_argument("--multiple", type=number(int, at_least=1), default=256,
                   help="round the fixed length up to this (256)")
    p.add_argument("--batch-size", type=number(int, at_least=1), default=8,
                   help="batch size for the padding-waste figures (8)")
    p.add_argument("--top", type=number(int, at_least=0), default=10,
                   help="how many longest samples to list (10)")
    p.add_argument("--max-positions", type=number(int, at_least=1),
                   help="the model's position limit, to count samples beyond it")
    p.add_argument("--json", metavar="FILE", help="write the analysis (what probe and tune take as --lengths)")
    p.add_argument("--plot", metavar="FILE.html", help="write a histogram page")
    p.add_argument("--no-cache", action="store_true", help="count again, ignoring cached results")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(run=run)


def _histogram_text(stats, width: int = 40) -> str:
    edges, counts = stats.histogram["edges"], stats.histogram["counts"]
    peak = max(counts) or 1
    lines = []
    for i, c in enumerate(counts):
        last = i == len(counts) - 1 and stats.max > edges[-1]
        label = f"{edges[i]:>8.0f} - {edges[i + 1]:<8.0f}{'+' if last else ' '}"
        lines.append(f"  {label} {'#' * max(1 if c else 0, round(width * c / peak)):<{width}} {c:,}")
    return "\n".join(lines)


def render(stats) -> str:

    rows = [
        ("samples", f"{stats.samples:,}" + (f" ({stats.bad_rows:,} bad rows skipped)" if stats.bad_rows else "")),
        ("total", f"{stats.total:,} positions"),
        ("min / mean / max", f"{stats.min:,} / {stats.mean:,.1f} / {stats.max:,}"),
        ("percentiles", ", ".join(f"{k} {v:,.0f}" for k, v in stats.percentiles.items())),
        ("fixed length", f"{stats.recommended_max_length:,} ({stats.recommended_rule}); "
                         f"truncates {stats.truncated_share:.2%} of samples"),
        (f"padding waste @bs={stats.batch_size}",
         f"pad to longest in batch {stats.waste['pad_to_longest_in_batch']:.1%}, "
         f"fixed length {stats.waste['pad_to_fixed_length']:.1%}, packing {stats.waste['packing']:.1%}"),
        ("lengths", stats.description),
        *((f"  {name}", f"median {p['p50']:,.0f}, p99 {p['p99']:,.0f}, max {p['max']:,.0f}")
          for name, p in stats.parts.items()),
    ]
    if stats.over_max_positions is not None:
        rows.append(("over max positions", f"{stats.over_max_positions:,} samples longer than the model's "
                                           f"{stats.max_positions:,} positions"))
    for note in stats.notes:
        rows.append(("note", note))
    out = [table(rows), "", "histogram (lengths; last bin holds everything above p99.9):", _histogram_text(stats)]
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:

    json_path, plot_path = output_file(args.json, "--json"), output_file(args.plot, "--plot")
    if args.spec:
        spec = load_spec(args.spec)
        if spec.data is None:
            raise TrainfitError(f"{args.spec} has no data section", "add data: {path: ..., text_field: ...}")
        stats = analyze_spec(spec, progress=not args.quiet, batch_size=args.batch_size,
                             percentile=args.percentile, multiple=args.multiple, top=args.top)
    else:
        if not args.path:
            raise TrainfitError("give a dataset path or --spec", "e.g. trainfit analyze data.jsonl --text-field text")
        if not any(c in args.path for c in "*?[") and not Path(args.path).exists():  # a pattern is the reader's
            raise TrainfitError(f"{args.path} not found", "give the path of your dataset: a file, a folder of shards "
                                "or a pattern (data/*.parquet)")
        recipe = LengthRecipe(text_fields=tuple(args.text_field), messages_field=args.messages_field,
                              length_field=args.length_field, audio_field=args.audio_field,
                              length_scale=args.length_scale, length_by=args.length_by,
                              tokenizer=args.tokenizer)
        table = count_lengths(args.path, recipe, fmt=args.format, on_bad_row=args.on_bad_row,
                              use_cache=not args.no_cache, progress=not args.quiet)
        stats = summarize(table, percentile=args.percentile, multiple=args.multiple, batch_size=args.batch_size,
                          top=args.top, max_positions=args.max_positions)
    print(f"trainfit analyze: {stats.source}")
    print(render(stats))
    print(f"\nlongest {min(args.top, len(stats.longest))} samples (row index: length):")
    print("  " + ", ".join(f"{x['row']}: {x['length']:,}" for x in stats.longest[: args.top]))
    if stats.over_max_positions:
        print(f"\nwarning: {stats.over_max_positions:,} samples exceed the model's {stats.max_positions:,} "
              "positions and will be truncated")
    if json_path:
        write_atomically(json_path, json.dumps(stats.to_dict()) + "\n")
        print(f"\nwrote {json_path}")
    if plot_path:
        write_atomically(plot_path, histogram_html(stats))
        print(f"wrote {plot_path}")
    return 0
