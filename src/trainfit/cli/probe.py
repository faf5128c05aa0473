"""``trainfit probe``: measure one configuration in an isolated process."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from trainfit.cli import COMMANDS
from trainfit.cli.common import add_spec_arguments, knobs_help, output_file, spec_from_args, stats_from_args
from trainfit.cli.render import measurement_report
from trainfit.format import config_line
from trainfit.probe.events import Phase, Step
from trainfit.probe.runner import run_probe

if TYPE_CHECKING:
    from trainfit.probe.events import ProbeEvent

EPILOG = """\
exit status: 0 ok, 3 out of memory, 4 error (crash, unsupported knob), 5 timeout, 6 diverged (a loss
that is not finite), 2 bad usage/spec, 130/143/129 stopped by Ctrl-C/SIGTERM/SIGHUP.

examples:
  trainfit probe examples/tiny-llama.yaml
  trainfit probe examples/tiny-llama.yaml --set batch_size=8 --set lora_r=16 --json out.json
  trainfit probe examples/tiny-llama.yaml --set gradient_checkpointing=true --memory-gb 2
  trainfit probe examples/tiny-tts.yaml --set ddpm_batch_mul=8        # custom knob of a factory
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("probe", help=COMMANDS["probe"],
                       description="Run one configuration for a short time in a child process: the worst-case "
                                   "batch for memory, typical batches for speed.",
                       epilog=EPILOG + "\n" + knobs_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_spec_arguments(p)
    p.add_argument("--json", metavar="FILE", help="write the Measurement as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(run=run)


class PhasePrinter:
    """Shows the child's progress on stderr: phases, then the timed-step count."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.plain = enabled and not self.enabled

    def __call__(self, event: ProbeEvent) -> None:
        if isinstance(event, Phase):
            if self.enabled:
                sys.stderr.write(f"\r\033[K  {event.phase}...")
            elif self.plain:
                sys.stderr.write(f"  {event.phase}...\n")
        elif isinstance(event, Step) and self.enabled:
            sys.stderr.write(f"\r\033[K  timed step {event.n} ({event.seconds:.3f} s)")
        sys.stderr.flush()

    def done(self) -> None:
        if self.enabled:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def run(args: argparse.Namespace) -> int:

    spec = spec_from_args(args)
    json_path = output_file(args.json, "--json")
    stats = stats_from_args(args, spec, progress=not args.quiet)
    print(f"trainfit probe: {spec.source}")
    print(f"config: {config_line(spec.params.to_dict())}")
    if stats is not None:
        print(f"data: {stats.headline()}")
    printer = PhasePrinter(not args.quiet)
    m = run_probe(spec, stats=stats, on_event=printer)
    printer.done()
    print(measurement_report(m))
    if json_path:
        m.write_json(json_path)
        print(f"\nwrote {json_path}")
    return m.exit_code
