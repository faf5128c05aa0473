"""The documentation says what the code does: the knob table is the one ``KNOBS`` renders, every
spec key is documented, every relative link lands on a file (and heading) that exists, every
``trainfit`` command shown parses, and the README stays a front door that starts with the two
commands CI and newcomers copy."""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import pytest

from trainfit.cli import build_parser, split_passed_on
from trainfit.knob_table import knob_table_markdown
from trainfit.spec import Budget, DataSpec, ModelSpec, ProbeSettings, TuneSettings

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS, ROOT / "bench" / "README.md"]
EXPECTED_DOCS = {"ablate.md", "architecture.md", "cluster.md", "compare.md", "benchmarks.md", "outputs.md", "plan.md",
                 "probe.md", "search.md", "spec.md", "train.md"}

TWO_COMMANDS = """\
```bash
# 1. set up and run the main job: tune the bundled tiny model on the bundled dataset (CPU, ~2 minutes)
python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e '.[dev]' && trainfit tune examples/tiny-llama.yaml --quick

# 2. run the tests (same set-up; ~12 minutes on 2 cores; CI runs this, then the slow tier: -m slow)
python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e '.[dev]' && python -m pytest -q
```
"""
"""CI and newcomers copy these lines as they are: they change only on purpose, here too."""

REGENERATE = 'python -c "from trainfit.knob_table import knob_table_markdown; print(knob_table_markdown())"'


def test_the_docs_are_all_there() -> None:
    assert EXPECTED_DOCS <= {p.name for p in DOCS}, f"docs/ holds {[p.name for p in DOCS]}"
    assert all(p.is_file() for p in PAGES)


def test_the_readme_is_a_front_door_that_starts_with_the_two_commands() -> None:
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 160, f"README.md has {len(lines)} lines: move details to docs/ (at most 160)"
    first_block = text.index("```")
    assert text[first_block:].startswith(TWO_COMMANDS), "README.md must open with the two commands, byte for byte"
    assert text[:first_block].count("\n") <= 6, "the two commands must come right after the title and the pitch"


def test_the_knob_table_in_the_spec_reference_is_the_one_the_declarations_render() -> None:
    text = (ROOT / "docs" / "spec.md").read_text()
    found = re.findall(r"<!-- knobs:start -->\n(.*?)<!-- knobs:end -->", text, flags=re.S)
    assert len(found) == 1, "docs/spec.md needs one <!-- knobs:start --> ... <!-- knobs:end --> block"
    assert found[0].strip() == knob_table_markdown().strip(), (
        f"docs/spec.md's knob table is out of date with KNOBS in params.py: replace the lines between the "
        f"markers with the output of\n  {REGENERATE}")


@pytest.mark.parametrize("section, cls", [("model", ModelSpec), ("data", DataSpec), ("budget", Budget),
                                          ("probe", ProbeSettings), ("tune", TuneSettings)])
def test_every_spec_key_is_in_the_spec_reference(section: str, cls: type) -> None:
    text = (ROOT / "docs" / "spec.md").read_text()
    body = text.split(f"## `{section}`", 1)[1].split("\n## ", 1)[0]
    missing = [f.name for f in dataclasses.fields(cls) if f"| `{f.name}` |" not in body]
    assert not missing, f"docs/spec.md, section {section}: no row for {missing}"


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # a `# comment` in code is no heading
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_every_relative_link_points_at_a_file_and_heading_that_exist() -> None:
    checked, broken = 0, []
    for page in PAGES:
        for target in links(page):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            checked += 1
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading in {dest.name})")
    assert checked >= 40, f"only {checked} relative links found: is the link pattern still right?"
    assert not broken, "broken links:\n" + "\n".join(broken)


def code_blocks(page: Path) -> list[tuple[str, list[str]]]:
    """The page's fenced code blocks: (language, lines)."""
    blocks: list[tuple[str, list[str]]] = []
    inside = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            inside = not inside
            if inside:
                blocks.append((line[3:].strip(), []))
        elif inside:
            blocks[-1][1].append(line)
    return blocks


def commands(page: Path) -> list[str]:
    """Every ``trainfit ...`` command line in the page's shell blocks (after ``&&`` too)."""
    found = []
    for language, lines in code_blocks(page):
        if language not in ("bash", "sh", ""):
            continue
        for line in "\n".join(lines).replace("\\\n", " ").splitlines():  # continued lines joined
            for part in line.split("&&"):
                if part.strip().startswith("trainfit "):
                    found.append(shlex.split(part, comments=True))
    return [shlex.join(w) for w in found]


def test_every_trainfit_command_in_the_docs_parses() -> None:
    """A renamed or removed flag breaks the example that shows it."""
    shown = [(page, c) for page in PAGES for c in commands(page)]
    assert len(shown) >= 15, f"only {len(shown)} trainfit commands found in the docs"
    parser = build_parser()
    for page, command in shown:
        try:
            args = parser.parse_args(split_passed_on(shlex.split(command)[1:])[0])
        except SystemExit:
            pytest.fail(f"{page.relative_to(ROOT)}: `{command}` does not parse (see `trainfit --help`)")
        assert args.command is not None, command


def test_every_test_a_page_names_as_a_guard_exists() -> None:
    """docs/reliability.md (and any page) names tests as ``tests/FILE.py::NAME``: a renamed or
    dropped test must not leave a row claiming a guard that is gone."""
    named, missing = 0, []
    for page in PAGES:
        for file, name in re.findall(r"tests/(\w+\.py)::(\w+)", page.read_text()):
            named += 1
            source = ROOT / "tests" / file
            if not source.exists() or not re.search(rf"^(async )?def {name}\(", source.read_text(), re.M):
                missing.append(f"{page.relative_to(ROOT)}: tests/{file}::{name}")
    assert named >= 50, f"only {named} named tests found: is the pattern still right?"
    assert not missing, "pages name tests that do not exist:\n" + "\n".join(sorted(set(missing)))


def test_the_architecture_page_counts_the_layers_the_contract_holds() -> None:
    """docs/architecture.md said "seven layers" when pyproject.toml's tier contract held eight."""
    import tomllib

    words = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    tiers = next(c for c in contracts if c["name"].startswith("Tiers"))
    count = re.search(r"tiers \((\w+) layers\)", (ROOT / "docs" / "architecture.md").read_text())
    assert count is not None and count.group(1) == words[len(tiers["layers"]) - 1]


def _ablate_section() -> str:
    text = (ROOT / "docs" / "ablate.md").read_text()
    return text[text.index("## What is measured"):text.index("Every row is a real probe")]


def test_the_ablation_baseline_in_the_docs_is_the_one_the_knobs_declare() -> None:
    """docs/ablate.md named 7 baseline knobs where the code turns 12 off: the page lists each knob at its
    ``off=`` value, as ``BASELINE`` (params.py's declarations) holds them."""
    import yaml

    from trainfit.ablate import BASELINE

    baseline = _ablate_section().split("2. **Each technique alone**")[0]
    named = {}
    for pair in re.findall(r"`(\w+: [^`]+)`", baseline.replace("\n   ", " ")):
        named.update(yaml.safe_load(pair))
    assert named == BASELINE


def test_the_docs_say_why_each_baseline_knob_without_a_row_has_none(tmp_path: Path) -> None:
    """ablate switches off four knobs it never measures: the page names exactly those, with why."""
    from conftest import TINY_LLAMA, make_spec_file

    from trainfit.ablate import BASELINE, techniques
    from trainfit.spec import load_spec

    measured: set[str] = set()
    for model, params in (({"config": TINY_LLAMA}, {}), ({"factory": f"{ROOT / 'tests' / 'factories.py'}:scaled"},
                                                          {"width_mul": 1})):
        spec = load_spec(make_spec_file(tmp_path, model=model, params={"max_length": 32, **params}))
        measured |= {knob for row in techniques(spec, 16) for knob in row.knobs}
    sentence = re.search(r"have no row of their own: ([^.]+)\.", _ablate_section().replace("\n", " "))
    assert sentence is not None
    assert set(re.findall(r"`(\w+)`", sentence.group(1))) == set(BASELINE) - measured
