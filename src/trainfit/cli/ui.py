"""``trainfit ui``: the local web app (a spec editor, the actions, their jobs and the run folders)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from trainfit.cli import COMMANDS
from trainfit.cli.common import number
from trainfit.errors import TrainfitError
from trainfit.ui.paths import TOKEN_PATTERN

EPILOG = """\
examples:
  trainfit ui                                   # the current folder's specs and runs, in your browser
  trainfit ui --root ~/experiments --port 9000 --no-browser
  trainfit ui --host 0.0.0.0                    # reachable from other machines: open the URL printed (?token=...)

The page edits a spec (its knobs as controls, its YAML, checked as you type), starts analyze, probe,
tune, ablate, compare, plan and train as `trainfit` child processes that outlive the page and the UI
(records and logs in ROOT/.trainfit-ui/jobs/), streams their logs, stops and resumes them, and lists
every run folder under the root with its status and pages. Serves on 127.0.0.1 only unless --host says
otherwise; every request needs the token in the URL it prints (and opens), kept in ROOT/.trainfit-ui/token
so that pages left open work again after a restart (--token sets one). Only files under --root are
served or written. Needs the extra: pip install 'trainfit[ui]'. Ctrl-C stops the server, not the jobs.
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("ui", help=COMMANDS["ui"], epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="A local web app over trainfit's commands: edit a spec, start and watch runs, "
                                   "compare their results.")
    p.add_argument("--root", metavar="DIR", default=".", help="the folder of specs and runs it works in (default: .)")
    p.add_argument("--host", type=host_address, default="127.0.0.1",
                   help="address to serve on (default 127.0.0.1: this machine only; 0.0.0.0: every interface)")
    p.add_argument("--port", type=number(int, at_least=0, at_most=65535), default=8765,
                   help="port to serve on (default 8765; 0: any free port)")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser")
    p.add_argument("--token", type=token_text, help="the token every request must carry (default: the one kept in "
                   "ROOT/.trainfit-ui/token from the last start, else a new random one; kept there for the next)")
    p.set_defaults(run=run)


def host_address(text: str) -> str:
    """An argparse ``type``: the address to serve on; an empty one (which binds every interface, as
    0.0.0.0 would, without saying so) is a usage error."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty address would serve every interface: give 127.0.0.1 "
                                         "(this machine only) or 0.0.0.0 (every interface)")
    return text.strip()


def token_text(text: str) -> str:
    """An argparse ``type``: a token a URL carries as it is, long enough not to be guessed."""
    if not TOKEN_PATTERN.fullmatch(text):
        raise argparse.ArgumentTypeError("a token is 16 to 128 of the characters A-Z a-z 0-9 _ - "
                                         "(python -c 'import secrets; print(secrets.token_urlsafe(24))' makes one)")
    return text


def run(args: argparse.Namespace) -> int:

    try:
        # local: Flask is an extra; without it the command says how to install it
        from trainfit.ui.server import serve_forever
    except ImportError as err:
        raise TrainfitError(f"`trainfit ui` needs Flask ({err})", "pip install 'trainfit[ui]'") from None

    def ready(url: str) -> None:
        print(f"trainfit ui: serving {Path(args.root).resolve()} at {url} (Ctrl-C stops the server; jobs go on)",
              file=sys.stderr, flush=True)

    serve_forever(Path(args.root), host=args.host, port=args.port, open_browser=not args.no_browser, on_ready=ready,
                  token=args.token)
    return 0
