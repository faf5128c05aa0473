"""``trainfit dashboard``: watch a search (and the run's pages) in a browser."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from trainfit.cli import COMMANDS
from trainfit.cli.common import number
from trainfit.dashboard import PAGES, serve_forever
from trainfit.errors import TrainfitError

EPILOG = """\
examples:
  trainfit dashboard trainfit-runs/tiny-llama/20261124-101500            # then open http://127.0.0.1:8080
  trainfit dashboard RUN_DIR --port 9000 --storage postgresql://host/db   # a shared study

The study (every trial, its values, the speed and the memory constraint) is shown by
optuna-dashboard, reading the run's study.journal as it is, so a search can be watched while it
runs. The run folder's own pages (report.html, compare.html, ablation.html) are at /trainfit/,
rewritten as the run goes on: a comparison or an ablation folder (no study) is served its pages alone.
Needs the extra: pip install 'trainfit[dashboard]'. Serves on 127.0.0.1 only unless --host says
otherwise; Ctrl-C stops it.
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("dashboard", help=COMMANDS["dashboard"],
                       description="Serve a live view of a run: its Optuna study through optuna-dashboard, and the "
                                   "run folder's HTML pages.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a `trainfit tune` output folder (holds study.journal)")
    p.add_argument("--port", type=number(int, at_least=0, at_most=65535), default=8080,
                   help="port to serve on (default 8080; 0: any free port)")
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1: this machine only)")
    p.add_argument("--storage", metavar="URL", help="the study's storage URL, for a tune run with --storage")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:

    folder = Path(args.run_dir)
    if not folder.is_dir():
        raise TrainfitError(f"{folder} is not a folder", "give a `trainfit tune` output folder")

    def ready(url: str) -> None:
        study = f"the study at {url}/dashboard, " if args.storage or (folder / "study.journal").is_file() else ""
        print(f"trainfit dashboard: {study}the run's pages at {url}{PAGES}/ (Ctrl-C stops)", file=sys.stderr,
              flush=True)

    serve_forever(folder, host=args.host, port=args.port, storage_url=args.storage, on_ready=ready)
    return 0
