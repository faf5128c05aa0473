"""Spec files under the root: found, read for the editor, validated by the spec's own loader (what
the CLI runs, so a spec the page accepts is one the command accepts), and saved as new files."""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from trainfit.errors import SpecError, TrainfitError
from trainfit.files import naming
from trainfit.spec import build_spec, load_yaml, merge_overrides, parse_override
from trainfit.ui.paths import Refused, Root, read_regular, write_refused

SKIPPED = {"node_modules", "__pycache__", "site-packages", "probes", "checkpoints"}
"""Folders never searched for specs or runs (besides hidden ones: ``.git``, ``.venv``, the UI's own)."""
MAX_FILES = 2000
"""Files looked at, at most, when listing specs: a root over a large tree still answers at once."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Checked:
    """What validating a spec found: its problems (none: it is valid), each with its hint."""

    problems: list[dict[str, str | None]]
    """``key``, ``message``, ``hint`` of each problem (one with key ``spec`` for an error of the whole file)."""

    @property
    def ok(self) -> bool:
        return not self.problems


def walk(root: Path, max_depth: int = 6) -> Iterator[tuple[Path, list[str], list[str]]]:
    """``os.walk`` under ``root``, skipping hidden and :data:`SKIPPED` folders, at most ``max_depth`` deep."""
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        depth = len(here.relative_to(root).parts)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED and depth < max_depth
                         and not d.startswith("checkpoint-"))
        yield here, dirs, files


@dataclasses.dataclass(frozen=True, kw_only=True)
class Listed:
    """A YAML file a folder listing found under the root."""

    path: str
    """Root-relative, as listed (a link by its own name)."""
    problem: str | None = None
    """Why it is not opened (a link out of the root, a FIFO), shown beside it; None: it can be opened."""


def yaml_files(root: Root) -> Iterator[Listed]:
    """The YAML files under the root (at most :data:`MAX_FILES` files looked at), each with the reason
    it is not opened, where there is one."""
    seen = 0
    for folder, _, files in walk(root.path):
        for name in sorted(files):
            seen += 1
            if name.endswith((".yaml", ".yml")):
                path = folder / name
                yield Listed(path=path.relative_to(root.path).as_posix(), problem=root.why_not_opened(path))
        if seen > MAX_FILES:
            break


def spec_files(root: Root) -> list[Listed]:
    """The YAML files under the root that look like specs (a ``model:`` key at the top), and those that
    cannot be opened to tell (a link out of the root, a FIFO): listed with their problem."""
    return [f for f in yaml_files(root) if f.problem is not None or _looks_like_spec(root.path / f.path)]


def _looks_like_spec(path: Path) -> bool:
    try:
        return any(re.match(r"model\s*:", line) for line in read_regular(path, 64_000).splitlines())
    except OSError:
        return False


def params_of(text: str, section: str = "params") -> dict[str, Any]:
    """The ``params:`` section (or another, ``search:``) of a spec's YAML text ({} where it has none
    or the text is not valid)."""
    try:
        raw = load_yaml(text, "the spec")
    except TrainfitError:
        return {}
    params = raw.get(section) if isinstance(raw, dict) else None
    return dict(params) if isinstance(params, dict) else {}


def check(text: str, overrides: Sequence[str], *, folder: Path, source: str) -> Checked:
    """Validate the spec ``text`` with ``overrides`` (``NAME=VALUE``) as ``trainfit.spec.load_spec``
    does a file (relative paths against ``folder``, the spec file's): every problem, none raised."""
    try:
        raw = load_yaml(text, source) or {}
        if not isinstance(raw, dict):
            raise TrainfitError(f"{source} must hold a mapping (model:, data:, params:, ...)")
        merged = merge_overrides(raw, [parse_override(o) for o in overrides])
        build_spec(merged, base_dir=folder, source=source)
    except SpecError as err:
        return Checked(problems=[{"key": p.key, "message": p.message, "hint": p.hint} for p in err.problems])
    except TrainfitError as err:
        return Checked(problems=[{"key": "spec", "message": err.message, "hint": err.hint}])
    return Checked(problems=[])


def save(root: Root, source: Path, text: str, name: str) -> Path:
    """Write ``text`` as a new spec beside ``source`` (so its relative paths still point where they
    did), named ``name`` (``.yaml`` added), never over an existing file. Returns the new file."""
    name = name.strip() or f"{source.stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", name):
        raise Refused(f"{name!r} is not a file name the UI writes", "use letters, digits, '.', '_' and '-'", status=400)
    path = source.parent / (name if name.endswith((".yaml", ".yml")) else name + ".yaml")
    root.inside(root.relative(path.parent))  # under the root, as its source is
    made = False
    try:
        with naming(path), path.open("x") as f:  # "x": refused where the file exists, checked and made in one step
            made = True
            f.write(text if text.endswith("\n") else text + "\n")
    except FileExistsError:
        raise Refused(f"{root.relative(path)} exists already", "give the new spec another name", status=409) from None
    except OSError as err:
        if made:  # a spec cut short (0 bytes on a full disk) is no spec, and its name would be refused as taken
            path.unlink(missing_ok=True)
        raise write_refused(err, path) from None
    return path
