"""Every documented command and snippet marked runnable works as shown, on this machine.

A code block preceded by ``<!-- runnable -->`` (or ``<!-- runnable: exit N -->``
for a command that must fail with status N) in README.md or docs/ is run:
Python blocks in a fresh interpreter, ``console`` blocks line by line (the
``$ `` lines) in a shell, from the repository root with the environment's
commands (``hwplug``, ``pytest``) on PATH.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
MARK = re.compile(r"^<!-- runnable(?::\s*exit (\d+))? -->$")
FENCE = re.compile(r"^```(\w+)")


def snippets() -> list[tuple[str, str, str, int]]:
    found = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            mark = MARK.match(line.strip())
            if mark is None:
                continue
            fence = FENCE.match(lines[i + 1].strip()) if i + 1 < len(lines) else None
            assert fence, f"{page.name}:{i + 1}: a runnable mark must precede a code fence"
            end = next(j for j in range(i + 2, len(lines)) if lines[j].strip() == "```")
            body = textwrap.dedent("\n".join(lines[i + 2 : end]))  # (a block in a list item)
            where = f"{page.relative_to(REPO)}:{i + 2}"
            found.append((where, fence.group(1), body, int(mark.group(1) or 0)))
    return found


SNIPPETS = snippets()


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HWPLUG_", "ACME_"))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["COLUMNS"] = "120"
    return env


def test_the_docs_mark_snippets_to_run() -> None:
    kinds = {kind for _, kind, _, _ in SNIPPETS}
    assert {"python", "console"} <= kinds
    assert len(SNIPPETS) >= 10


@pytest.mark.slow
@pytest.mark.parametrize(
    ("where", "kind", "body", "status"), SNIPPETS, ids=[s[0] for s in SNIPPETS]
)
def test_snippet_runs_as_documented(where: str, kind: str, body: str, status: int) -> None:
    if kind == "python":
        result = subprocess.run(
            [sys.executable, "-c", body],
            cwd=REPO,
            env=environment(),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert result.returncode == status, f"{where}\n{result.stderr[-3000:]}"
        return
    assert kind == "console", f"{where}: runnable blocks are python or console"
    commands = [line.strip()[2:] for line in body.splitlines() if line.strip().startswith("$ ")]
    assert commands, f"{where}: no $ command in the block"
    for command in commands:
        result = subprocess.run(
            ["bash", "-c", command],
            cwd=REPO,
            env=environment(),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert result.returncode == status, f"{where}: {command}\n{result.stderr[-3000:]}"
        if status == 2:
            assert len(result.stderr.strip().splitlines()) == 1, result.stderr
