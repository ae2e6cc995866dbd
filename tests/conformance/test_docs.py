"""docs/conformance.md lists every check, as the registry has them."""

from __future__ import annotations

import re
from pathlib import Path

from hwplug.conformance import CHECKS, checks_markdown

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "conformance.md"


def test_the_checks_table_is_the_registry() -> None:
    text = PAGE.read_text(encoding="utf-8")
    match = re.search(r"<!-- checks-table:[^>]*-->\n(.*?)<!-- /checks-table -->", text, re.S)
    assert match, "docs/conformance.md lost its checks-table markers"
    assert match.group(1) == checks_markdown(), (
        "docs/conformance.md is stale: paste hwplug.conformance.checks_markdown() "
        "between the checks-table markers"
    )
    assert re.findall(r"^\| ([RT]\d\d) \|", match.group(1), re.M) == list(CHECKS)


def test_the_page_is_in_the_nav_after_the_vendor_guide() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    vendor = nav.index("vendor-plugin.md")
    assert vendor < nav.index("conformance.md") < nav.index("build-an-engine.md")
    assert "conformance.md" in (ROOT / "docs" / "vendor-plugin.md").read_text(encoding="utf-8")
