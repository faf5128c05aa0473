"""The code stays in pieces a reader can hold: no function in ``src/trainfit`` is longer than
``LONGEST`` lines unless a ``# long: <why>`` comment on the line above its ``def`` says why, and
no module is longer than ``LARGEST`` lines (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "trainfit"
LONGEST = 60
LARGEST = 450
"""A module over this holds several concerns: split it by concern (issue 31)."""


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
