"""How long ``hwplug.resolve()`` takes: the default config on the detected platform and on
a simulated H100 (every hook and guard included). Prints JSON (median of repeats).

``--baseline REV`` also measures git revision ``REV`` (exported to a temporary
folder) in the same run: each side runs in its own process, rounds alternate
between them, and the report adds the baseline's medians and the speed-up
(baseline time / this tree's time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LABELS = {"detected": None, "h100": "h100"}


def _measure(repeats: int) -> dict[str, list[float]]:
    """Seconds per ``hwplug.resolve()`` of the default config, per label."""
    import hwplug

    samples: dict[str, list[float]] = {}
    for label, platform in LABELS.items():
        hwplug.resolve(platform=platform)  # warm: plugins loaded, profiles built
        times = samples[label] = []
        for _ in range(repeats):
            start = time.perf_counter()
            hwplug.resolve(platform=platform)
            times.append(time.perf_counter() - start)
    return samples


def _worker() -> int:
    """Serve rounds: say where hwplug comes from, then read a repeat count per line and
    answer with a JSON line of samples."""
    import hwplug

    print(json.dumps(hwplug.__file__), flush=True)
    for line in sys.stdin:
        print(json.dumps(_measure(int(line))), flush=True)
    return 0


def _source_path(root: Path) -> str:
    """PYTHONPATH for a worker that imports hwplug (and the example engine) from ``root``."""
    inherited = [
        p
        for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if p and not Path(p).resolve().is_relative_to(ROOT)
    ]
    return os.pathsep.join(
        [str(root / "src"), str(root / "examples" / "tiny_engine" / "src"), *inherited]
    )


def _export(rev: str, into: Path) -> None:
    archive = into / "rev.tar"
    subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), rev], check=True
    )
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")


def _side_by_side(rev: str, repeats: int, rounds: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="hwplug-bench-") as tmp:
        _export(rev, Path(tmp))
        trees = {"current": ROOT, "baseline": Path(tmp) / "tree"}
        workers = {
            side: subprocess.Popen(
                [sys.executable, __file__, "--worker"],
                env={**os.environ, "PYTHONPATH": _source_path(root)},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                cwd=root,
            )
            for side, root in trees.items()
        }
        for side, worker in workers.items():
            assert worker.stdout is not None
            source = json.loads(worker.stdout.readline() or "null")
            if source is None or not Path(source).is_relative_to(trees[side]):
                raise RuntimeError(f"the {side} worker imported hwplug from {source}")
        samples: dict[str, dict[str, list[float]]] = {s: {k: [] for k in LABELS} for s in trees}
        try:
            per_round = max(1, repeats // rounds)
            for number in range(rounds):
                # alternate which side goes first, so drift hits both alike
                order = list(workers) if number % 2 == 0 else list(reversed(workers))
                for side in order:
                    worker = workers[side]
                    assert worker.stdin is not None
                    assert worker.stdout is not None
                    worker.stdin.write(f"{per_round}\n")
                    worker.stdin.flush()
                    answer = worker.stdout.readline()
                    if not answer:
                        raise RuntimeError(f"the {side} worker ({trees[side]}) stopped")
                    for label, times in json.loads(answer).items():
                        samples[side][label].extend(times)
        finally:
            for worker in workers.values():
                if worker.stdin is not None:
                    worker.stdin.close()
                worker.wait(timeout=60)
    medians = {
        side: {f"{label}_ms": 1e3 * statistics.median(t) for label, t in by_label.items()}
        for side, by_label in samples.items()
    }
    return {
        **medians["current"],
        "baseline": {"rev": rev, **medians["baseline"]},
        "speedup": {
            label: medians["baseline"][f"{label}_ms"] / medians["current"][f"{label}_ms"]
            for label in LABELS
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument(
        "--baseline", metavar="REV", help="also measure git revision REV, side by side"
    )
    parser.add_argument("--rounds", type=int, default=10, help="alternating rounds with --baseline")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker()
    if args.repeats < 1 or args.rounds < 1:
        parser.error("--repeats and --rounds must be positive")
    report: dict[str, object] = {"benchmark": "resolve", "repeats": args.repeats}
    if args.baseline:
        report.update(_side_by_side(args.baseline, args.repeats, args.rounds))
    else:
        medians = _measure(args.repeats)
        report.update({f"{k}_ms": 1e3 * statistics.median(t) for k, t in medians.items()})
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
