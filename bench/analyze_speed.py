"""Data-analysis figures of issue 3:

1. speed: trainfit's rows/s counting a generated JSONL vs a bare batched call of the same fast
   tokenizer on the same texts, in the same run (goal: >= 0.8x);
2. memory: peak RSS of the counting process (goal: < 1 GiB on a >= 2 GiB input with --big);
3. resume: a count killed at ~50% and rerun, vs a full count (goal: <= 0.6x).

    python bench/analyze_speed.py --rows 1000000 [--big-gb 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import dump  # noqa: E402

TOKENIZER = ROOT / "examples" / "data" / "tokenizer.json"


def generate(path: Path, rows: int, seed: int = 0) -> None:
    """Long-tailed lengths (log-normal word counts) over the example vocabulary's syllables."""
    sys.path.insert(0, str(ROOT / "examples"))
    from make_data import vocabulary

    rng = random.Random(seed)
    words = vocabulary(rng, 2000)
    with path.open("w") as f:
        buf = []
        for i in range(rows):
            n = max(3, min(4000, int(rng.lognormvariate(4.1, 0.8))))
            buf.append(json.dumps({"id": i, "text": " ".join(rng.choices(words, k=n))}))
            if len(buf) == 10000:
                f.write("\n".join(buf) + "\n")
                buf = []
        if buf:
            f.write("\n".join(buf) + "\n")


def bare_rows_per_s(path: Path) -> float:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER))
    texts = [json.loads(line)["text"] for line in path.open()]  # preloaded: not timed
    t = time.perf_counter()
    for i in range(0, len(texts), 2000):
        tok.encode_batch(texts[i:i + 2000])
    return len(texts) / (time.perf_counter() - t)


def count_cmd(path: Path, cache: Path) -> tuple[list[str], dict[str, str]]:
    # Peak RSS from VmHWM: ru_maxrss would include this (big) parent's size, inherited over fork+exec.
    code = ("import sys, time; from trainfit.data import LengthRecipe, count_lengths; "
            "from trainfit.devices import peak_rss_bytes; t=time.perf_counter(); "
            f"tab=count_lengths(sys.argv[1], LengthRecipe(text_fields=('text',), tokenizer={str(TOKENIZER)!r}), "
            "progress=False); "
            "print(len(tab.lengths), time.perf_counter()-t, peak_rss_bytes())")
    return [sys.executable, "-c", code, str(path)], {**os.environ, "TRAINFIT_CACHE": str(cache)}


def trainfit_count(path: Path, cache: Path) -> tuple[int, float, int]:
    cmd, env = count_cmd(path, cache)
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout.split()
    return int(out[0]), float(out[1]), int(out[2])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--big-gb", type=float, default=0.0, help="also measure peak RSS on a file this large")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="trainfit-bench-"))
    try:
        data = work / "rows.jsonl"
        generate(data, args.rows)
        size_gb = data.stat().st_size / 1024**3
        bare = bare_rows_per_s(data)
        rows, seconds, rss = trainfit_count(data, work / "cache-full")
        full_s = seconds
        # Resume: kill a fresh count at ~50% of the full time, then rerun to completion.
        cmd, env = count_cmd(data, work / "cache-resume")
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        t = time.perf_counter()
        time.sleep(full_s * 0.5)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed_after = time.perf_counter() - t
        t = time.perf_counter()
        _, resumed_s, _ = trainfit_count(data, work / "cache-resume")
        resume_wall = time.perf_counter() - t
        result = {
            "rows": rows, "file_gb": round(size_gb, 3),
            "bare_tokenizer_rows_per_s": round(bare), "trainfit_rows_per_s": round(rows / seconds),
            "ratio_trainfit_over_bare": (rows / seconds) / bare,
            "trainfit_peak_rss_gb": round(rss / 1024**3, 3),
            "full_count_s": round(full_s, 1), "killed_after_s": round(killed_after, 1),
            "resumed_count_s": round(resumed_s, 1), "resume_ratio": resumed_s / full_s,
            "resume_wall_s_incl_start": round(resume_wall, 1),
        }
        if args.big_gb:
            big = work / "big.jsonl"
            with big.open("wb") as out:
                while out.tell() < args.big_gb * 1024**3:
                    with data.open("rb") as src:
                        shutil.copyfileobj(src, out)
            big_rows, big_s, big_rss = trainfit_count(big, work / "cache-big")
            result.update(big_file_gb=round(big.stat().st_size / 1024**3, 2), big_rows=big_rows,
                          big_seconds=round(big_s, 1), big_peak_rss_gb=round(big_rss / 1024**3, 3))
        dump("analyze_speed", result)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
