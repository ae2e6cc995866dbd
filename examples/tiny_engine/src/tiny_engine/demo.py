"""``python -m tiny_engine.demo``: a random checkpoint, a few prompts, the engine's stats.

Writes a small random Qwen3 checkpoint to a temporary directory (needs
transformers), serves it on the current platform (or ``--platform NAME`` with
``--device cpu`` for a simulated one) with the resolved configuration plus
any ``--set section.field=value``, generates from four prompts and prints
what resolution decided, the outputs and the stats.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tiny_engine.demo", description=__doc__)
    parser.add_argument("--platform", default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--set", dest="assignments", action="append", default=[])
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args(argv)

    from hwplug.core.errors import one_line

    try:
        from tiny_engine.make_checkpoint import make_checkpoint
    except ImportError as exc:  # pragma: no cover - the module itself has no hard deps
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from tiny_engine.cli import _config
    from tiny_engine.engine import LLM

    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = make_checkpoint(
                Path(tmp) / "qwen3-tiny",
                arch="qwen3",
                layers=2,
                hidden=128,
                heads=4,
                kv_heads=2,
                vocab=512,
                max_positions=256,
            )
            llm = LLM(
                path, config=_config(args.assignments), platform=args.platform, device=args.device
            )
        except ImportError as exc:
            print(
                f"error: the demo needs transformers to write its checkpoint ({exc})",
                file=sys.stderr,
            )
            return 2
        except (ValueError, OSError) as exc:
            print(f"error: {one_line(str(exc))}", file=sys.stderr)
            return 2
        print(llm.resolution.explain())
        prompts = [[1, 17, 42, 99], list(range(3, 40)), [7] * 12, list(range(100, 164))]
        outputs = llm.generate(prompts, max_tokens=args.max_tokens)
        print()
        for prompt, output in zip(prompts, outputs):
            print(f"{len(prompt):>3} prompt tokens -> {output}")
        print()
        for key, value in llm.stats.items():
            print(f"  {key:<24} {f'{value:.1f}' if isinstance(value, float) else value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
