"""``python -m tiny_engine``: generate from a checkpoint on the current (or a named) platform.

``--model DIR [--platform NAME] [--set section.field=value ...] --max-tokens N
(--prompt-ids JSON | --random-prompts COUNTxLEN) [--temperature T --seed N]
[--ignore-eos] [--json]``. Bad input (an empty prompt, missing files, an
unsupported model, a token outside the vocabulary, a prompt longer than
``model.max_model_len``, an invalid setting) exits with status 2 and one line
on stderr; what ``config.json`` and hwplug's resolution can tell is checked
before torch is imported or weights are loaded. A closed output pipe
(``| head -1``) ends the command quietly with status 141, as it ends Unix tools.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import re
import sys
from collections.abc import Iterator
from typing import Any, NoReturn

__all__ = [
    "EXIT_CLOSED_PIPE",
    "EXIT_USAGE",
    "check_random_prompts",
    "main",
    "parse_prompts",
    "parse_random_prompts",
    "run",
]


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


EXIT_USAGE = 2
"""Exit status of every user error."""

EXIT_CLOSED_PIPE = 141
"""Exit status when the reader of stdout has gone (``| head -1``): what a shell reports
for a Unix tool that ``SIGPIPE`` ended (128 + 13), as ``seq 1 99999 | head -1`` gives."""


def _stage_line(stage: dict[str, Any]) -> str:
    """One pipeline stage's line of the stats: its layers and its KV cache."""
    start, end = stage["layers"]
    mib = stage["kv_cache_bytes"] / (1 << 20)
    return (
        f"stage {stage['stage']}: layers {start}..{end - 1}, KV cache of "
        f"{stage['kv_cache_layers']} layers ({mib:.1f} MiB)"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the command; returns the exit status."""
    args = _parser().parse_args(argv)  # malformed options: one line, status 2
    from hwplug.core.errors import one_line

    try:
        return _run(args)
    except BrokenPipeError:
        return _closed_pipe()
    except (ValueError, OSError) as exc:  # ConfigError, CheckpointError, bad prompts
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except RuntimeError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a defect: still one line, with what it was
        print(f"internal error: {type(exc).__name__}: {one_line(str(exc))}", file=sys.stderr)
        return 1


def _closed_pipe() -> int:
    """stdout's reader has gone: stop quietly, as Unix tools do. stdout becomes
    ``/dev/null``, so that the interpreter's last flush of what is still buffered does
    not fail again (with a traceback and status 120)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_CLOSED_PIPE


def run() -> NoReturn:
    """The command as a process (``python -m tiny_engine``, the ``tiny-engine`` script):
    :func:`main`, then the process ends at once.

    Everything the command started is stopped by then (``LLM.close()``: a
    background compilation cancelled and joined, ranks stopped, the process group
    left). The interpreter's exit handlers run, output is flushed, and the process
    ends with ``os._exit``, skipping the interpreter's teardown of torch's modules,
    which takes 0.7-1 s on a small CPU after the last output for nothing.
    """
    status = main()
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BrokenPipeError:
                status = _closed_pipe() if stream is sys.stdout else status
            except (OSError, ValueError):
                pass
        os._exit(status)


def _loggers_for_progress() -> list[tuple[str, int]]:
    """The loggers whose records make the status line, and the least level shown: the
    engine's phases (``tiny_engine``), and each graph captured (``hwplug.core.graphs``
    logs them one by one at DEBUG, with their count)."""
    import logging

    return [("tiny_engine", logging.INFO), ("hwplug.core.graphs", logging.DEBUG)]


@contextlib.contextmanager
def _progress(*, quiet: bool) -> Iterator[None]:
    """Show the engine's start-up phases as one status line on stderr, on a terminal only
    (nothing under ``--json``, when stderr is not a terminal, or on the ranks other than
    0 of a launched job, which share rank 0's terminal)."""
    import logging

    if quiet or not sys.stderr.isatty() or os.environ.get("RANK", "0") != "0":
        yield
        return
    from rich.console import Console

    console = Console(stderr=True)
    with console.status("importing torch") as status:

        class ToStatus(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                # with a spinner given, rich draws the line now, not at its next tick: a
                # phase shorter than a tick is shown too
                status.update(record.getMessage(), spinner="dots")

        handler = ToStatus(logging.DEBUG)
        saved = []
        for name, level in _loggers_for_progress():
            logger = logging.getLogger(name)
            saved.append((logger, logger.level))
            logger.addHandler(handler)
            if logger.getEffectiveLevel() > level:
                logger.setLevel(level)
        try:
            yield
        finally:
            for logger, level in saved:
                logger.removeHandler(handler)
                logger.setLevel(level)


def _check_before_loading(
    args: argparse.Namespace, config: dict[str, Any], prompts: list[list[int]] | None
) -> None:
    """Every check the checkpoint's ``config.json`` and hwplug's resolution allow, without
    torch or weights: the settings against the checkpoint and the platform, the
    prompts' token ids against the vocabulary and their lengths against the context.

    :raises ValueError: ``UsageError``, ``ConfigError``, ``CheckpointError``.
    """
    import hwplug
    from tiny_engine.checkpoint import read_checkpoint
    from tiny_engine.settings import check_prompts, check_temperature, engine_config_for

    check_temperature(args.temperature)
    spec = read_checkpoint(args.model)
    engine_config = engine_config_for(spec, config)
    max_model_len = engine_config.model.max_model_len
    if prompts is None:
        count, length = parse_random_prompts(args.random_prompts)
        check_random_prompts(count, length, max_model_len)
    else:
        check_prompts(
            prompts, args.max_tokens, vocab_size=spec.vocab_size, max_model_len=max_model_len
        )
    hwplug.resolve(engine_config, platform=args.platform)


def _run(args: argparse.Namespace) -> int:
    if args.max_tokens < 1:
        raise UsageError(f"--max-tokens must be a positive integer, got {args.max_tokens}")
    config = _config(args.assignments)
    prompts = parse_prompts(args.prompt_ids) if args.prompt_ids is not None else None
    _check_before_loading(args, config, prompts)
    with _progress(quiet=args.json):
        import torch

        from tiny_engine.engine import LLM
        from tiny_engine.settings import sequence_seed

        with LLM(args.model, config=config, platform=args.platform, device=args.device) as llm:
            if prompts is None:
                count, length = parse_random_prompts(args.random_prompts)
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
    else:
        for i, output in enumerate(outputs):
            print(f"prompt {i} ({len(prompts[i])} tokens) -> {output}")
        parts = {k: stats[k] for k in ("stages", "replicas") if k in stats}
        flat = {k: v for k, v in stats.items() if k not in parts}
        width = max(len(k) for k in flat)
        for key, value in flat.items():
            shown = f"{value:.1f}" if isinstance(value, float) else value
            print(f"  {key:<{width}}  {shown}")
        for stage in parts.get("stages", []) if len(parts.get("stages", [])) > 1 else []:
            print(f"  {_stage_line(stage)}")
        for k, replica in enumerate(parts.get("replicas", [])):
            print(
                f"  replica {k}: {replica['prompt_tokens']} prompt and "
                f"{replica['generated_tokens']} generated tokens in {replica['steps']} steps, "
                f"{replica['generated_tokens_per_s']:.1f} tokens/s"
            )
    sys.stdout.flush()  # a closed pipe is found here, not in the interpreter's exit
    return 0
