"""``python -m hwplug``: the ``hwplug`` command."""

from __future__ import annotations

from hwplug.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
