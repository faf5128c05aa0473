"""The ``trainfit`` command. Each sub-command is a module with ``add_parser`` and ``run(args) -> int``;
they compute with library functions and render separately. Errors a user can fix are printed
without a traceback."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import threading
from collections.abc import Collection, Iterator
from typing import Any

from trainfit import __version__
from trainfit.errors import Terminated, TrainfitError, os_error

COMMANDS = {
    "analyze": "length statistics of a dataset",
    "probe": "measure one configuration (speed, memory, MFU)",
    "tune": "search for the fastest config that fits in memory",
    "ablate": "measure what each speed/memory technique buys, alone and together",
    "compare": "train named configs for K steps each and compare loss, speed and memory",
    "plan": "fit a training run into a time window: from a tune folder, or before the hardware (--throughput, --like)",
    "train": "train the measured config, checkpointed and resumable",
    "dashboard": "watch a run's study and pages in a browser (optuna-dashboard)",
    "ui": "a local web app: edit a spec, start and watch runs, compare them",
    "env": "devices, memory and library versions",
}
"""Each command's line in ``trainfit --help`` (its module's parser takes it from here, so the top
level lists every command without importing one)."""

DESCRIPTION = """\
Find the fastest training configuration that fits in memory, prove it by measurement.

  trainfit analyze data.jsonl --text-field text --tokenizer ./tok   lengths, percentiles, padding
  trainfit probe spec.yaml --set batch_size=8                       measure one configuration
  trainfit tune spec.yaml --quick                                   search for the fastest config that fits
  trainfit ablate spec.yaml                                         what each speed/memory technique buys
  trainfit compare spec.yaml --configs c.yaml --steps 200           train named configs, compare their curves
  trainfit plan RUN_DIR --max-hours 12 --epochs 3                   fit the run into a time window, with an ETA
  trainfit train RUN_DIR --resume                                   train it, checkpointed and resumable
  trainfit dashboard RUN_DIR                                        watch a search in a browser (optuna-dashboard)
  trainfit ui                                                       edit specs, start and watch runs in a browser
  trainfit env                                                      devices and versions

Run `trainfit COMMAND --help` for the options of each command.
"""


def build_parser(commands: Collection[str] = tuple(COMMANDS)) -> argparse.ArgumentParser:
    """The ``trainfit`` parser with the options of ``commands`` (default: all); every other command is
    listed by its name and line alone, its module not imported: ``trainfit --help`` and each command
    start with only what they use."""
    parser = argparse.ArgumentParser(prog="trainfit", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"trainfit {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, line in COMMANDS.items():
        if name in commands:
            importlib.import_module(f"trainfit.cli.{name}").add_parser(sub)
        else:
            sub.add_parser(name, help=line)
    return parser


def _version() -> str:

    return __version__


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def interrupted_status(err: KeyboardInterrupt) -> int:
    """The shell's convention: 128 + the signal's number (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP)."""
    return 128 + (err.signum if isinstance(err, Terminated) else signal.SIGINT)


def interrupt_behind(err: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C (or stop signal) an error was raised while handling, if any: one that lands inside a
    file operation (Optuna's journal lock, between its rename and its unlink) leaves that operation's
    cleanup to fail, and the failure, not the interrupt, reaches the top. It is still an interrupt."""
    seen = err.__context__
    while seen is not None and not isinstance(seen, KeyboardInterrupt):
        seen = seen.__context__
    return seen


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    def terminate(signum: int, frame: Any) -> None:
        raise Terminated(signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, terminate) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def split_passed_on(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """trainfit's own arguments, and what follows ``--`` (None without one): that goes to the
    trainer unchanged (argparse's sub-commands do not pass it on)."""
    if "--" not in argv:
        return argv, None
    at = argv.index("--")
    return argv[:at], argv[at + 1:]


def main(argv: list[str] | None = None) -> int:

    argv = sys.argv[1:] if argv is None else list(argv)
    ours, passed_on = split_passed_on(argv)
    named = next((word for word in ours if not word.startswith("-")), None)  # the top level takes no values
    parser = build_parser([named] if named in COMMANDS else [])
    args = parser.parse_args(ours)
    if args.command is None:
        parser.print_help()
        return 2
    if passed_on is not None:
        if not hasattr(args, "passed_on"):
            parser.error(f"`trainfit {args.command}` takes no arguments after --")
        args.passed_on = passed_on
    args.argv = argv  # what the user ran: the resume hint repeats it
    try:
        with terminate_as_interrupt():
            status = int(args.run(args))
        sys.stdout.flush()  # here, not at exit: a reader gone by then is caught below, not "Exception ignored"
        return status
    except TrainfitError as err:
        print(f"trainfit {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # before OSError, its base: output piped into `head` and closed early
        return output_closed()
    except OSError as err:  # a path too long, a full disk, a read-only folder: the file and the cause
        if (interrupt := interrupt_behind(err)) is not None:  # stopping as asked; what failed on the way said too
            print(f"\ntrainfit {args.command}: interrupted (while stopping: {os_error(err)})", file=sys.stderr)
            return interrupted_status(interrupt)
        print(f"trainfit {args.command}: error: {os_error(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        print(f"\ntrainfit {args.command}: interrupted", file=sys.stderr)
        return interrupted_status(err)


OUTPUT_CLOSED_STATUS = 128 + signal.SIGPIPE
"""141, the status a shell reports for a command a closed pipe stopped (``yes | head``)."""


def output_closed() -> int:
    """Whoever read our output has stopped reading (``trainfit ... | head``): not an error of ours, so
    nothing is printed. What is still buffered for stdout goes to /dev/null, as Python's docs advise
    (``signal`` module, "Note on SIGPIPE"): flushed at exit into the closed pipe it would print an
    "Exception ignored ... BrokenPipeError" and exit 120."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return OUTPUT_CLOSED_STATUS
