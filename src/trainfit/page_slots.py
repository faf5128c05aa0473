"""Named slots in a run's ``report.html`` that a later command fills: ``trainfit plan`` puts its
section in the ``plan`` slot of the page ``tune`` wrote, a budget matrix its own, each replacing an
earlier one, so the page stays one file that every workflow adds to without reading another's code."""

from __future__ import annotations


PLAN_SLOT = "<!-- plan --><!-- /plan -->"
"""Where ``trainfit plan`` puts its section (between the two comments, replacing an earlier one)."""


def with_section(page: str, name: str, section: str) -> str:
    """``page`` (a report written by :func:`tune_report_html`) with ``section`` in its ``name``
    slot (``<!-- name -->...<!-- /name -->``), which is made before the trials when missing;
    a second call replaces the first's section."""
    opening, closing = f"<!-- {name} -->", f"<!-- /{name} -->"
    start, end = page.find(opening), page.find(closing)
    if start < 0 or end < start:
        return page.replace("<h3>Trials</h3>", f"{opening}{section}{closing}\n<h3>Trials</h3>", 1)
    return page[:start] + opening + section + page[end:]


def with_plan(page: str, section: str) -> str:
    """``page`` with the plan's ``section`` in its plan slot."""
    return with_section(page, "plan", section)
