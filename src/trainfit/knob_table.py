"""The built-in knobs as the markdown table docs/spec.md holds, rendered from ``KNOBS``."""

from __future__ import annotations

from trainfit.params import KNOBS, Knob, Params


def knob_table_markdown() -> str:
    """The built-in knobs as a markdown table, rendered from ``KNOBS`` and ``Params``'s defaults:
    name, values, default, whether two values train a different model, meaning. docs/spec.md holds
    this output between ``<!-- knobs:start -->`` and ``<!-- knobs:end -->`` (tests/test_docs.py
    checks that it is current)."""
    def number(x: float) -> str:
        return f"{x:,g}" if abs(x) < 1e6 else f"{int(x):,}"

    def values(k: Knob) -> str:
        if k.choices:
            text = ", ".join(f"`{c}`" for c in k.choices)
        elif k.kind == "bool":
            text = "`true`, `false`"
        elif k.kind == "modules":
            text = "list of names, or one name"
        else:
            text = {"int": "integer", "float": "number"}[k.kind]
            if k.minimum is not None and k.maximum is not None:
                text += f" {number(k.minimum)} to {number(k.maximum)}"
            elif k.minimum is not None:
                text += f" >= {number(k.minimum)}"
        return text + (", or `null`" if k.nullable else "")

    def default(name: str) -> str:
        value = getattr(Params(), name)
        if value is None:
            return "`null`"
        if isinstance(value, bool):
            return f"`{str(value).lower()}`"
        if isinstance(value, float):
            return f"`{value:g}`"
        return f"`{value}`"

    rows = ["| knob | values | default | changes what is learned | meaning |", "|---|---|---|---|---|"]
    for k in KNOBS.values():
        meaning = k.doc.replace("|", "\\|")
        rows.append(f"| `{k.name}` | {values(k)} | {default(k.name)} | {'yes' if k.changes_learning else 'no'} "
                    f"| {meaning} |")
    return "\n".join(rows) + "\n"
