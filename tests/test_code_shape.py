"""The code stays in pieces a reader can hold: no function in ``src/trainfit`` is longer than
``LONGEST`` lines unless a ``# long: <why>`` comment on the line above its ``def`` says why, and
no module is longer than ``LARGEST`` lines, and a function imports one of trainfit's own modules
only with a ``# local: <why>`` comment above the import (at most ``LOCAL_IMPORTS`` of them): an
import belongs at the top of its module unless it keeps a heavy package (numpy, torch) out of a
light one's start-up or breaks a cycle (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "trainfit"
LONGEST = 60
LARGEST = 450
"""A module over this holds several concerns: split it by concern (issue 31)."""
LOCAL_IMPORTS = 40


def long_functions(path: Path) -> list[str]:
    """``path``'s functions over ``LONGEST`` lines with no reason written above them, as
    ``name (N lines) at line L``."""
    lines = path.read_text().splitlines()
    found = []
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert node.end_lineno is not None
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = node.end_lineno - node.lineno + 1
            if length > LONGEST and not lines[first - 2].strip().startswith("# long:"):
                found.append(f"{node.name} ({length} lines) at line {node.lineno}")
    return found


def test_no_function_in_src_is_longer_than_a_screen_without_a_reason() -> None:
    found = {str(path.relative_to(SRC)): long_functions(path) for path in sorted(SRC.rglob("*.py"))}
    assert {path: names for path, names in found.items() if names} == {}


def test_the_check_sees_a_long_function_and_a_written_reason(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(LONGEST))
    (tmp_path / "m.py").write_text(f"def f():\n{body}\n\n# long: one table\ndef g():\n{body}\n\ndef h():\n    pass\n")
    assert long_functions(tmp_path / "m.py") == [f"f ({LONGEST + 1} lines) at line 1"]


def test_no_module_in_src_is_longer_than_its_concern() -> None:
    sizes = {str(path.relative_to(SRC)): len(path.read_text().splitlines()) for path in sorted(SRC.rglob("*.py"))}
    assert len(sizes) > 100  # it read the tree
    assert {path: n for path, n in sizes.items() if n > LARGEST} == {}


def local_imports(path: Path) -> tuple[int, list[str]]:
    """How many imports of trainfit's own modules ``path``'s functions make, and those with no
    ``# local:`` reason on a line above them in the same import block, as ``module at line L``."""
    lines = path.read_text().splitlines()
    count, unexplained = 0, []
    for fn in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("trainfit") and not node.level:
                count += 1
                above = node.lineno - 2
                while above >= 0 and lines[above].strip().startswith("from trainfit"):
                    above -= 1  # the block of imports this one is in
                if above < 0 or not lines[above].strip().startswith("# local:"):
                    unexplained.append(f"{node.module} at line {node.lineno}")
    return count, unexplained


def test_a_function_imports_our_own_modules_only_with_a_reason() -> None:
    found = {str(path.relative_to(SRC)): local_imports(path) for path in sorted(SRC.rglob("*.py"))}
    assert {path: bad for path, (_, bad) in found.items() if bad} == {}
    assert 0 < sum(count for count, _ in found.values()) <= LOCAL_IMPORTS


def test_the_check_sees_a_local_import_without_its_reason(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "def f():\n    from trainfit.spec import Spec\n\n\ndef g():\n"
        "    # local: a cycle\n    from trainfit.spec import Spec\n    from trainfit.data import x\n")
    assert local_imports(tmp_path / "m.py") == (3, ["trainfit.spec at line 2"])
