"""The releases of the libraries trainfit mirrors or builds on, as installed here, set against the ones
the last green CI had (bench/releases_tested.txt): what a fresh install would change.

    python bench/releases.py                     # a table: tested, installed, changed
    python bench/releases.py --write             # record the installed ones as tested (after a green CI)

bench/latest_releases.sh runs it in a fresh venv of the newest releases, then the tests."""
from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

TESTED = Path(__file__).with_name("releases_tested.txt")
# What trainfit copies a choice from (accelerate's FSDP units and mixed precision, TRL's flags, Optuna's
# storages and constraints, transformers' models) or reads files with.
WATCHED = ("torch", "transformers", "trl", "accelerate", "peft", "optuna", "optuna-dashboard", "sqlalchemy",
           "tokenizers", "datasets", "pyarrow", "numpy", "scipy", "flask", "psycopg", "tensorboard")


def installed() -> dict[str, str]:
    found = {}
    for name in WATCHED:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "-"
    return found


def tested(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    pairs = (line.split("==", 1) for line in path.read_text().splitlines() if "==" in line and not line.startswith("#"))
    return {name.strip(): ver.strip() for name, ver in pairs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", type=Path, default=TESTED, help="the tested releases (default: %(default)s)")
    parser.add_argument("--write", action="store_true", help="record the installed releases as tested")
    args = parser.parse_args()
    now = installed()
    if args.write:
        args.against.write_text("# the releases of the last green CI (bench/releases.py --write)\n"
                                + "".join(f"{name}=={ver}\n" for name, ver in now.items()))
        print(f"wrote {args.against}")
        return 0
    before = tested(args.against)
    print(f"{'package':<18} {'tested':<14} {'installed':<14}")
    changed = 0
    for name, ver in now.items():
        old = before.get(name, "?")
        mark = "  <- changed" if old != ver else ""
        changed += bool(mark)
        print(f"{name:<18} {old:<14} {ver:<14}{mark}")
    print(f"{changed} of {len(now)} changed since the tested releases ({args.against})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
