"""``python -m tiny_engine``: generate from a checkpoint on the current (or a named) platform.

``--model DIR [--platform NAME] [--set section.field=value ...] --max-tokens N
(--prompt-ids JSON | --random-prompts COUNTxLEN) [--temperature T --seed N]
[--ignore-eos] [--json]``. Bad input (an empty prompt, missing files, an
unsupported model, a prompt longer than ``model.max_model_len``, an invalid
setting) exits with status 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from collections.abc import Iterator
from typing import Any, NoReturn

__all__ = ["check_random_prompts", "main", "parse_prompts", "parse_random_prompts"]


class UsageError(ValueError):
    """Bad command-line input (exit status 2)."""


def parse_prompts(text: str) -> list[list[int]]:
    """``--prompt-ids``: a JSON list of token-id lists (a flat list is one prompt)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--prompt-ids is not valid JSON ({exc})") from None
    if isinstance(data, list) and data and all(isinstance(t, int) for t in data):
        data = [data]
    if not isinstance(data, list) or not data or not all(isinstance(p, list) for p in data):
        raise UsageError(
            "--prompt-ids must be a JSON list of token-id lists, as in [[1,2,3],[4,5]]"
        )
    return data


MAX_RANDOM_PROMPTS = 1 << 16
"""The most prompts ``--random-prompts`` makes."""


def parse_random_prompts(text: str) -> tuple[int, int]:
    """``--random-prompts COUNTxLEN`` -> ``(count, length)``; the length is checked
    against the model's ``max_model_len`` (:func:`check_random_prompts`) before any
    prompt is made."""
    match = re.fullmatch(r"\s*([0-9]{1,12})\s*[xX]\s*([0-9]{1,12})\s*", text)
    if match is None or int(match[1]) < 1 or int(match[2]) < 1:
        raise UsageError(
            f"--random-prompts {text!r}: expected COUNTxLEN with positive numbers, as in 4x32"
        )
    count, length = int(match[1]), int(match[2])
    if count > MAX_RANDOM_PROMPTS:
        raise UsageError(
            f"--random-prompts {text!r}: at most {MAX_RANDOM_PROMPTS} prompts, got {count}"
        )
    return count, length


def check_random_prompts(count: int, length: int, max_model_len: int) -> None:
    """A ``UsageError`` when prompts of ``length`` tokens cannot run (checked before
    they are made)."""
    if length >= max_model_len:
        raise UsageError(
            f"--random-prompts {count}x{length}: model.max_model_len={max_model_len} leaves "
            f"room for prompts of at most {max_model_len - 1} tokens"
        )


def _config(assignments: list[str]) -> dict[str, Any]:
    from hwplug.cli import parse_set_option

    data: dict[str, Any] = {}
    for text in assignments:
        path, value = parse_set_option(text)
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise UsageError(f"--set {text!r}: {part} is already a value")
            node = child
        node[path[-1]] = value
    return data


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors on one line (status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see python -m tiny_engine --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m tiny_engine",
        description="Generate token ids from a Llama/Qwen2/Qwen3 checkpoint on hwplug.",
    )
    parser.add_argument("--model", required=True, help="checkpoint directory")
    parser.add_argument("--platform", default=None, help="platform name or profile (h100)")
    parser.add_argument(
        "--device", default=None, help="torch device (cpu for a simulated platform)"
    )
    parser.add_argument(
        "--set",
        dest="assignments",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="a config value (repeatable)",
    )
    parser.add_argument(
        "--max-tokens", type=int, required=True, help="tokens to generate per prompt"
    )
    prompts = parser.add_mutually_exclusive_group(required=True)
    prompts.add_argument("--prompt-ids", metavar="JSON", help="token ids: [[ids...], ...]")
    prompts.add_argument(
        "--random-prompts", metavar="COUNTxLEN", help="COUNT random prompts of LEN tokens (4x32)"
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sampling temperature; below 1e-5 (the default, 0) is greedy",
    )
    parser.add_argument(
        "--seed", type=int, default=None, help="sampling seed, any int (default: fresh entropy)"
    )
    parser.add_argument(
        "--ignore-eos", action="store_true", help="keep generating past end-of-sequence tokens"
    )
    parser.add_argument("--json", action="store_true", help="print outputs and stats as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command; returns the exit status."""
    args = _parser().parse_args(argv)  # malformed options: one line, status 2
    from hwplug.core.errors import one_line

    try:
        return _run(args)
    except (ValueError, OSError) as exc:  # ConfigError, CheckpointError, bad prompts
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a defect: still one line, with what it was
        print(f"internal error: {type(exc).__name__}: {one_line(str(exc))}", file=sys.stderr)
        return 1


@contextlib.contextmanager
def _progress(*, quiet: bool) -> Iterator[None]:
    """Show the engine's start-up phases as one status line on stderr, on a terminal only
    (nothing under ``--json`` or when stderr is not a terminal)."""
    import logging

    if quiet or not sys.stderr.isatty():
        yield
        return
    from rich.console import Console

    console = Console(stderr=True)
    engine_logger = logging.getLogger("tiny_engine")

    with console.status("starting") as status:

        class ToStatus(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                status.update(record.getMessage())

        handler = ToStatus(logging.INFO)
        level = engine_logger.level
        engine_logger.addHandler(handler)
        engine_logger.setLevel(logging.INFO)
        try:
            yield
        finally:
            engine_logger.removeHandler(handler)
            engine_logger.setLevel(level)


def _run(args: argparse.Namespace) -> int:
    import torch

    from tiny_engine.engine import LLM, sequence_seed

    if args.max_tokens < 1:
        raise UsageError(f"--max-tokens must be a positive integer, got {args.max_tokens}")
    config = _config(args.assignments)
    if args.prompt_ids is not None:
        prompts = parse_prompts(args.prompt_ids)
    else:
        count, length = parse_random_prompts(args.random_prompts)
        prompts = None
    with (
        _progress(quiet=args.json),
        LLM(args.model, config=config, platform=args.platform, device=args.device) as llm,
    ):
        if prompts is None:
            check_random_prompts(count, length, llm.config.model.max_model_len)
            generator = torch.Generator().manual_seed(sequence_seed(args.seed or 0, -1))
            vocab = llm.spec.vocab_size
            prompts = torch.randint(0, vocab, (count, length), generator=generator).tolist()
        outputs = llm.generate(
            prompts,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            seed=args.seed,
            ignore_eos=args.ignore_eos,
        )
        stats = llm.stats
        if not llm.prints_results:
            return 0  # another rank of a launched job prints them (they are the same)
    if args.json:
        print(json.dumps({"outputs": outputs, "stats": stats}))
        return 0
    for i, output in enumerate(outputs):
        print(f"prompt {i} ({len(prompts[i])} tokens) -> {output}")
    width = max(len(k) for k in stats)
    for key, value in stats.items():
        shown = f"{value:.1f}" if isinstance(value, float) else value
        print(f"  {key:<{width}}  {shown}")
    return 0
