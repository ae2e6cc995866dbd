"""Run tiny_engine's command line and its torchrun example in a loop: does every run exit
cleanly, and how long after its last output?

Each run is a fresh process with the platform's defaults (on a CPU: the model
compiles in the background while the engine serves eagerly, so most runs end
with a compilation still running). A run counts as an abort when it dies of
``SIGABRT`` (status 134) or prints "terminate called"; any other non-zero
status counts as a failure. The exit delay is the time from the last byte the
run wrote on stdout to its exit. A torchrun job's exit includes the
launcher's own (its agent polls the ranks and tears torch down): the same
launcher running ``echo`` on its ranks is measured as a baseline. Prints one
JSON object; exits 1 when a run aborted or failed, or the slowest exit delay
is over ``--max-exit-delay`` (for torchrun: over it plus the baseline's
slowest).

    python scripts/exit_loop.py --cli-runs 200 --torchrun-runs 50

On a two-core machine that takes about an hour; ``--cli-runs 20
--torchrun-runs 5`` is a quick check.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ENGINE_SRC = REPO / "examples" / "tiny_engine" / "src"
ABORT = "terminate called"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_once(command: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run ``command``; its status, stderr, and the seconds from its last stdout byte
    to its exit (None when it wrote nothing)."""
    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    assert proc.stderr is not None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ, "out")
    selector.register(proc.stderr, selectors.EVENT_READ, "err")
    last_output: float | None = None
    err = bytearray()
    open_pipes = 2
    while open_pipes:
        if time.monotonic() - start > timeout:
            proc.kill()
            break
        for key, _ in selector.select(timeout=1.0):
            data = os.read(key.fd, 65536)
            if not data:
                selector.unregister(key.fileobj)
                open_pipes -= 1
            elif key.data == "out":
                last_output = time.monotonic()
            else:
                err += data
    status = proc.wait()
    end = time.monotonic()
    stderr = err.decode(errors="replace")
    return {
        "status": status,
        "seconds": end - start,
        "exit_delay": None if last_output is None else end - last_output,
        "aborted": status in (134, -6) or ABORT in stderr,
        "stderr": stderr[-2000:],
    }


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    delays = sorted(r["exit_delay"] for r in runs if r["exit_delay"] is not None)
    failed = [r for r in runs if r["status"] != 0 and not r["aborted"]]
    return {
        "runs": len(runs),
        "aborts": sum(r["aborted"] for r in runs),
        "other_failures": len(failed),
        "first_failure": (failed[0]["stderr"][-500:] if failed else None),
        "silent_runs": len(runs) - len(delays),
        "exit_delay_s": {
            "median": round(statistics.median(delays), 3) if delays else None,
            "p95": round(delays[math.ceil(0.95 * len(delays)) - 1], 3) if delays else None,
            "max": round(delays[-1], 3) if delays else None,
        },
        "run_seconds_median": round(statistics.median(r["seconds"] for r in runs), 2)
        if runs
        else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cli-runs", type=int, default=200)
    parser.add_argument("--torchrun-runs", type=int, default=50)
    parser.add_argument("--model", type=Path, default=None, help="a checkpoint (default: made)")
    parser.add_argument("--max-exit-delay", type=float, default=0.5)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a run may take")
    args = parser.parse_args()

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ENGINE_SRC), env.get("PYTHONPATH")]))
    python = sys.executable
    work = Path(tempfile.mkdtemp(prefix="hwplug-exit-loop-"))
    try:
        model = args.model
        if model is None:
            model = work / "model"
            make = [python, "-m", "tiny_engine.make_checkpoint", str(model), "--arch", "qwen2"]
            make += ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2"]
            subprocess.run(
                make,
                env=env,
                check=True,
                capture_output=True,
            )
        cli: list[dict[str, Any]] = []
        for i in range(args.cli_runs):
            tokens, length = 1 + i % 4, 2 + i % 7
            command = [python, "-m", "tiny_engine", "--model", str(model), "--json"]
            command += ["--max-tokens", str(tokens), "--random-prompts", f"2x{length}"]
            command += ["--seed", str(i)]
            cli.append(run_once(command, env, args.timeout))
            print(f"cli {i + 1}/{args.cli_runs}: status {cli[-1]['status']}", file=sys.stderr)
        torchrun = shutil.which("torchrun", path=str(Path(python).parent)) or ""
        launcher = [torchrun] if torchrun else [python, "-m", "torch.distributed.run"]
        launched: list[dict[str, Any]] = []
        for i in range(args.torchrun_runs):
            command = [*launcher, "--nproc-per-node", "2", "--master-port", str(_free_port())]
            command += ["-m", "tiny_engine", "--model", str(model), "--json"]
            command += ["--set", "parallel.tensor_parallel_size=2"]
            command += ["--set", "parallel.distributed_executor_backend=external_launcher"]
            command += ["--set", "model.enforce_eager=true", "--max-tokens", "4"]
            command += ["--prompt-ids", "[[1,2,3]]"]
            launched.append(run_once(command, env, args.timeout))
            status = launched[-1]["status"]
            print(f"torchrun {i + 1}/{args.torchrun_runs}: status {status}", file=sys.stderr)
        baseline: list[dict[str, Any]] = []
        for _ in range(min(5, args.torchrun_runs)):
            command = [*launcher, "--nproc-per-node", "2", "--master-port", str(_free_port())]
            command += ["--no-python", "echo", "ready"]
            baseline.append(run_once(command, env, args.timeout))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "benchmark": "exit_loop",
        "cli": _summary(cli),
        "torchrun": _summary(launched),
        "torchrun_echo_baseline": _summary(baseline),
        "max_exit_delay_goal_s": args.max_exit_delay,
    }
    print(json.dumps(report, indent=2))
    clean = all(
        part["aborts"] == 0 and part["other_failures"] == 0
        for part in (report["cli"], report["torchrun"])
    )
    limits = {
        "cli": args.max_exit_delay,
        "torchrun": args.max_exit_delay
        + (report["torchrun_echo_baseline"]["exit_delay_s"]["max"] or 0.0),
    }
    fast = all(
        report[part]["exit_delay_s"]["max"] is None or report[part]["exit_delay_s"]["max"] <= limit
        for part, limit in limits.items()
    )
    return 0 if clean and fast else 1


if __name__ == "__main__":
    sys.exit(main())
