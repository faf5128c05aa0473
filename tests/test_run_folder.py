"""``RunFolder``: a tune output folder read through one object, each file read and checked once
however many steps of a flow ask, and the only reader of ``summary.json`` in the code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import EXAMPLES
from tune_helpers import fixed_speed

from trainfit.errors import TrainfitError
from trainfit.run_folder import COMMAND_FILE, SUMMARY_FILE, RunFolder
from trainfit.tune.options import TuneOptions
from trainfit.spec import load_spec
from trainfit.tune import tune

SRC = Path(__file__).resolve().parent.parent / "src" / "trainfit"


fixed = fixed_speed()


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRAINFIT_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        tune(load_spec(EXAMPLES / "tiny-tts.yaml", ["tune.max_trials=1"]), TuneOptions(output=out, probe_fn=fixed))
    return out


def test_each_file_is_read_once_whoever_asks(tuned: Path, tmp_path: Path) -> None:
    """What a flow checked is what it uses: a file rewritten after its first read (a tune still
    writing the folder) does not change what the same RunFolder answers."""
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(tuned, folder)
    run = RunFolder(folder)
    first, script = run.summary, run.command_script
    assert first.best_config is not None and script is not None and "trainfit: fastest measured config" in script
    (folder / SUMMARY_FILE).write_text("{")
    (folder / COMMAND_FILE).write_text("changed")
    assert run.summary is first and run.command_script == script and RunFolder.of(run) is run
    with pytest.raises(TrainfitError, match=r"cannot read .*summary.json") as err:
        RunFolder(folder).summary  # noqa: B018 (a new reader reads the file as it is now)
    assert "--resume" in (err.value.hint or "")
    assert RunFolder(folder).trainer_cost is None


def test_a_folder_that_is_not_a_tune_output_names_the_newest_one_inside(tuned: Path) -> None:
    with pytest.raises(TrainfitError, match="holds no summary.json") as err:
        RunFolder(tuned.parent).summary  # noqa: B018
    assert f"the newest tune folder in it is {tuned}" in (err.value.hint or "")


def summary_readers(path: Path) -> list[str]:
    """The functions of ``path`` that read a path joined to ``summary.json`` (``folder / "summary.json"``,
    or a name given it): its read_text, read_bytes or open, or an open(...) of it."""

    def is_join(n: ast.AST) -> bool:
        return isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) and (
            (isinstance(n.right, ast.Constant) and n.right.value == "summary.json")
            or (isinstance(n.right, ast.Name) and n.right.id == "SUMMARY_FILE"))

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        inner = list(ast.walk(node))
        pairs = [(t, n.value) for n in inner if isinstance(n, ast.Assign) for t in n.targets]
        pairs += [(t, v) for n in inner if isinstance(n, ast.Assign) and isinstance(n.value, ast.Tuple)
                  for target in n.targets if isinstance(target, ast.Tuple)
                  for t, v in zip(target.elts, n.value.elts)]  # a, b = x, folder / "summary.json"
        names = {t.id for t, v in pairs if isinstance(t, ast.Name) and is_join(v)}

        def summary_path(n: ast.AST) -> bool:
            return is_join(n) or (isinstance(n, ast.Name) and n.id in names)  # noqa: B023 (this function's names)

        if any(isinstance(n, ast.Call) and (
                (isinstance(n.func, ast.Attribute) and n.func.attr in ("read_text", "read_bytes", "open")
                 and summary_path(n.func.value))
                or (isinstance(n.func, ast.Name) and n.func.id == "open" and n.args and summary_path(n.args[0])))
               for n in inner):
            found.append(f"{node.name} at line {node.lineno}")
    return found


def test_no_module_but_run_folder_reads_summary_json(tmp_path: Path) -> None:
    """Issue 31: one reader per run folder. No function but ``RunFolder``'s joins a path to
    summary.json and reads a file (writing it stays with the report and budgets)."""
    found = {str(p.relative_to(SRC)): summary_readers(p) for p in sorted(SRC.rglob("*.py")) if p.name != "run_folder.py"}
    assert {path: names for path, names in found.items() if names} == {}
    # The check sees a reader written the old way, and RunFolder's own.
    (tmp_path / "m.py").write_text("def read(folder):\n    path = folder / 'summary.json'\n"
                                   "    return json.loads(path.read_text())\n")
    assert summary_readers(tmp_path / "m.py") == ["read at line 1"]
    assert summary_readers(SRC / "run_folder.py") == ["summary at line 38"]
