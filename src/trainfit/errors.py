"""Errors a user can act on.

Every error trainfit raises on purpose is a :class:`TrainfitError`: the CLI prints its message
(and hint) without a traceback. A :class:`SpecError` carries every problem found in a spec at
once, each naming the key and the fix, so a user fixes their file in one pass.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Any


class TrainfitError(Exception):
    """A problem the user can fix; ``str(err)`` is the whole message, hint included."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message}\n  fix: {hint}")


class Unsupported(TrainfitError):
    """A knob this device or installation cannot honour. ``knob``/``value`` name it, so a search
    skips every config with that value instead of failing on each."""

    def __init__(self, message: str, hint: str | None = None, *, knob: str | None = None,
                 value: Any = None) -> None:
        super().__init__(message, hint)
        self.knob, self.value = knob, value


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec: where (a dotted key), what, and how to fix it."""

    key: str
    message: str
    hint: str | None = None

    def __str__(self) -> str:
        text = f"{self.key}: {self.message}"
        return text if self.hint is None else f"{text} ({self.hint})"


class SpecError(TrainfitError):
    """The spec (file plus overrides) is invalid; ``problems`` lists every issue found."""

    def __init__(self, problems: list[Problem], source: str = "spec") -> None:
        self.problems = list(problems)
        lines = [f"{source} has {len(problems)} problem(s):"]
        lines += [f"  - {p}" for p in problems]
        super().__init__("\n".join(lines))


_OS_FIXES = {
    errno.ENOSPC: "free some space (or point --output elsewhere)",
    errno.EDQUOT: "free some space (or point --output elsewhere)",
    errno.ENAMETOOLONG: "use a shorter path",
    errno.EACCES: "use a folder you can write to",
    errno.EROFS: "use a folder you can write to",
}


def os_error(err: OSError) -> TrainfitError:
    """An operating system's refusal (a full disk, a path too long) as one line naming the file,
    the cause and, where there is one, the fix."""
    where = f" ({err.filename})" if err.filename else ""
    return TrainfitError(f"{err.strerror or err}{where}", _OS_FIXES.get(err.errno or 0))


class Terminated(KeyboardInterrupt):
    """SIGTERM (a cluster's preemption or time limit, ``kill``) or SIGHUP (the terminal closed),
    handled as Ctrl-C is: the probe worker is stopped, what was measured is kept, and the way to
    resume is printed."""

    def __init__(self, signum: int) -> None:
        import signal

        super().__init__(signal.Signals(signum).name)
        self.signum = signum
