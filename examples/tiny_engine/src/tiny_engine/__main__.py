"""``python -m tiny_engine``."""

from tiny_engine.cli import run

run()
