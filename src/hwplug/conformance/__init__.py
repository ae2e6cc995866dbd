"""The conformance kit: does a platform keep hwplug's contract?

Each check has a stable id (``R01``... for rule checks, ``T01``... for runtime
checks), a title and what it protects an engine from. :func:`run_checks` runs
them on a platform and returns a :class:`Report`; ``hwplug conformance NAME``
and ``pytest --hwplug-conformance=NAME`` run the same checks.
"""

from __future__ import annotations

from hwplug.conformance import rules, runtime
from hwplug.conformance.base import (
    CHECKS,
    KINDS,
    Check,
    CheckContext,
    CheckFailed,
    CheckSkipped,
    get_check,
)
from hwplug.conformance.runner import (
    CONFORMANCE_VERSION,
    CheckResult,
    Report,
    load_platform,
    run_checks,
    run_one,
)

__all__ = [
    "CHECKS",
    "CONFORMANCE_VERSION",
    "KINDS",
    "Check",
    "CheckContext",
    "CheckFailed",
    "CheckResult",
    "CheckSkipped",
    "Report",
    "checks_markdown",
    "get_check",
    "load_platform",
    "run_checks",
    "run_one",
]

del rules, runtime  # imported to register their checks


def checks_markdown() -> str:
    """The table of every check (id, kind, title, what it protects an engine from)."""
    lines = ["| id | kind | check | protects an engine from |", "|---|---|---|---|"]
    for item in CHECKS.values():
        lines.append(f"| {item.id} | {item.kind} | {item.title} | {item.protects} |")
    return "\n".join(lines) + "\n"
