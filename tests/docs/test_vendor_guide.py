"""docs/vendor-plugin.md shows examples/acme_npu's code itself, identical to the files.

A listing in the page is the code fence right after a ``<!-- listing: PATH -->``
line (the whole file) or a ``<!-- listing: PATH#NAME -->`` line (the section of
the file from its ``# [vendor-guide: NAME]`` line to the next such line or the
end, without the marker and the blank lines around it). After changing the
example, rewrite the page's listings from the files with::

    .venv/bin/python tests/docs/test_vendor_guide.py          # --check: only report
"""

from __future__ import annotations

import ast
import difflib
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = "docs/vendor-plugin.md"
PLUGIN = "examples/acme_npu/src/acme_npu/plugin.py"
PYPROJECT = "examples/acme_npu/pyproject.toml"
REFRESH = "python tests/docs/test_vendor_guide.py"

LISTING = re.compile(r"^<!-- listing: (?P<path>[^#\s]+)(?:#(?P<section>[\w-]+))? -->$")
SECTION = re.compile(r"^# \[vendor-guide: (?P<name>[\w-]+)\]$")


@dataclass(frozen=True)
class Listing:
    """One listing of the page: what it shows, and where its body lies (line indices)."""

    path: str
    section: str | None
    start: int
    end: int
    body: str

    @property
    def label(self) -> str:
        return self.path if self.section is None else f"{self.path}#{self.section}"


def listings(page: str) -> list[Listing]:
    """Every listing of the page text, in order."""
    lines = page.splitlines()
    found = []
    for i, line in enumerate(lines):
        mark = LISTING.match(line.strip())
        if mark is None:
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
            raise ValueError(f"{PAGE}:{i + 1}: a listing mark must precede a code fence")
        end = next((j for j in range(i + 2, len(lines)) if lines[j] == "```"), None)
        if end is None:
            raise ValueError(f"{PAGE}:{i + 2}: the listing's code fence is never closed")
        body = "\n".join(lines[i + 2 : end])
        found.append(Listing(mark["path"], mark["section"], i + 2, end, body))
    return found


def sections(text: str) -> dict[str, str]:
    """A file's sections by name: from each marker line to the next, blank lines trimmed."""
    lines = text.splitlines()
    starts = [(i, m["name"]) for i, line in enumerate(lines) if (m := SECTION.match(line))]
    found: dict[str, str] = {}
    for (i, name), (end, _) in zip(starts, [*starts[1:], (len(lines), "")], strict=True):
        if name in found:
            raise ValueError(f"section {name!r} is marked twice")
        found[name] = "\n".join(lines[i + 1 : end]).strip("\n")
    return found


def shown(root: Path, path: str, section: str | None) -> str:
    """What a listing of ``path`` (or of its ``section``) must show."""
    text = (root / path).read_text(encoding="utf-8")
    if section is None:
        return text.rstrip("\n")
    found = sections(text)
    if section not in found:
        raise ValueError(
            f"{path} has no '# [vendor-guide: {section}]' line (its sections: "
            f"{', '.join(found) or 'none'})"
        )
    return found[section]


def stale(root: Path) -> list[str]:
    """Each listing of the page that differs from the example, with the difference."""
    problems = []
    for listing in listings((root / PAGE).read_text(encoding="utf-8")):
        want = shown(root, listing.path, listing.section)
        if listing.body != want:
            diff = difflib.unified_diff(
                listing.body.splitlines(),
                want.splitlines(),
                f"{PAGE} (line {listing.start + 1})",
                listing.label,
                lineterm="",
            )
            problems.append(f"{listing.label} differs from the page:\n" + "\n".join(diff))
    return problems


def refreshed(root: Path) -> str:
    """The page with every listing rewritten from the example."""
    lines = (root / PAGE).read_text(encoding="utf-8").splitlines()
    for listing in reversed(listings("\n".join(lines))):
        body = shown(root, listing.path, listing.section).splitlines()
        lines[listing.start : listing.end] = body
    return "\n".join(lines) + "\n"


def main(argv: list[str], root: Path = ROOT) -> int:
    """Rewrite the page's listings from the example (``--check``: only report); 1 if stale."""
    problems = stale(root)
    for problem in problems:
        print(problem, end="\n\n")
    if problems and "--check" not in argv:
        (root / PAGE).write_text(refreshed(root), encoding="utf-8")
        print(f"rewrote {len(problems)} listing(s) of {PAGE}")
        return 0
    return 1 if problems else 0


# --------------------------------------------------------------------------- the page


def test_the_guide_includes_no_file_so_plain_markdown_shows_the_code() -> None:
    page = (ROOT / PAGE).read_text(encoding="utf-8")
    includes = [line for line in page.splitlines() if line.lstrip().startswith("--8<--")]
    assert includes == [], "show the code in the page (a listing), not a snippet include"


def test_the_guide_lists_the_platform_the_hooks_and_the_entry_point() -> None:
    page = (ROOT / PAGE).read_text(encoding="utf-8")
    labels = [listing.label for listing in listings(page)]
    assert sorted(labels) == sorted(
        [f"{PLUGIN}#{name}" for name in sections((ROOT / PLUGIN).read_text())] + [PYPROJECT]
    ), "the guide shows every section of plugin.py and the whole pyproject.toml, each once"
    for code in (
        "class NpuPlatform(VendorPlatform):",
        "@hwplug.hookimpl\ndef hwplug_platforms()",
        '[project.entry-points."hwplug.platforms"]\nacme_npu = "acme_npu.plugin"',
    ):
        assert code in page


def test_every_listing_is_the_example_as_it_is() -> None:
    problems = stale(ROOT)
    assert not problems, (
        f"{PAGE} no longer shows examples/acme_npu as it is; refresh its listings with "
        f"`{REFRESH}` and reread the prose around them:\n\n" + "\n\n".join(problems)
    )


def test_plugin_py_has_nothing_before_its_sections_but_the_docstring() -> None:
    text = (ROOT / PLUGIN).read_text(encoding="utf-8")
    module = ast.parse(text)
    docstring_end = module.body[0].end_lineno if ast.get_docstring(module) else 0
    assert docstring_end is not None
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if SECTION.match(line))
    before = [line for line in lines[docstring_end:first] if line.strip()]
    assert all(line.startswith("#") for line in before), (
        f"{PLUGIN}: code before the first '# [vendor-guide: ...]' line is in no listing: {before}"
    )


# --------------------------------------------------------------------------- the check itself


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A copy of the page and the example's listed files, to change (the page's listings
    refreshed, so that these tests do not depend on the real page being current)."""
    for path in (PAGE, PLUGIN, PYPROJECT):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    (tmp_path / PAGE).write_text(refreshed(tmp_path), encoding="utf-8")
    return tmp_path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new), encoding="utf-8")


def test_a_changed_example_or_page_fails_and_the_script_rewrites_it(
    copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert stale(copy) == [] and main(["--check"], copy) == 0
    _edit(copy / PLUGIN, "    priority = 60\n", "    priority = 61\n")
    _edit(copy / PYPROJECT, 'acme_npu = "acme_npu.plugin"', 'acme = "acme_npu.plugin"')
    _edit(copy / PAGE, '    name = "acme"\n', '    name = "acme2"\n')
    problems = stale(copy)
    assert sorted(p.split(" ", 1)[0] for p in problems) == sorted(
        [f"{PLUGIN}#platform", PYPROJECT, f"{PLUGIN}#backend"]
    )
    assert "+    priority = 61" in "\n".join(problems)
    assert main(["--check"], copy) == 1
    assert main([], copy) == 0
    assert stale(copy) == []
    page = (copy / PAGE).read_text(encoding="utf-8")
    assert "    priority = 61\n" in page and 'acme = "acme_npu.plugin"' in page
    assert "rewrote 3 listing(s)" in capsys.readouterr().out


def test_a_missing_section_marker_is_named(copy: Path) -> None:
    _edit(copy / PLUGIN, "# [vendor-guide: hooks]\n", "")
    with pytest.raises(ValueError, match=r"no '# \[vendor-guide: hooks\]' line"):
        stale(copy)


def test_a_section_runs_to_the_next_marker_without_the_blank_lines_around() -> None:
    text = "x = 1\n# [vendor-guide: a]\n\nA = 1\n\n\n# [vendor-guide: b]\ndef b():\n    pass\n"
    assert sections(text) == {"a": "A = 1", "b": "def b():\n    pass"}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
