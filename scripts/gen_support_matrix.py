#!/usr/bin/env python3
"""Regenerate docs/support-matrix.md from the built-in platforms' rules.

Usage: ``python scripts/gen_support_matrix.py [--check]``. With ``--check`` the
page is not written; the exit status is 1 when it is stale. The same page is
printed by ``HWPLUG_PLUGINS= hwplug matrix --format markdown``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "support-matrix.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the page is current")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    from hwplug.matrix import support_matrix_page

    text = support_matrix_page()
    current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else None
    if args.check:
        if current != text:
            print(f"{PAGE.relative_to(ROOT)} is stale; run python scripts/gen_support_matrix.py")
            return 1
        return 0
    if current != text:
        PAGE.write_text(text, encoding="utf-8")
        print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
