"""Cold start of ``import hwplug; hwplug.current_platform`` against ``import torch``.

Both commands run in fresh interpreters, alternated so that drift on a shared
machine hits both alike; the figure that matters is the ratio of medians.
Prints one JSON object. Goal: ratio <= 0.30.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HWPLUG = "import hwplug; hwplug.current_platform"
TORCH = "import torch"


def run_once(code: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWPLUG_")}
    run_once(TORCH, env)  # warm the page cache for both
    run_once(HWPLUG, env)
    hw: list[float] = []
    th: list[float] = []
    for _ in range(args.repeats):
        hw.append(run_once(HWPLUG, env))
        th.append(run_once(TORCH, env))
    hw_med, th_med = statistics.median(hw), statistics.median(th)
    print(
        json.dumps(
            {
                "benchmark": "cold_start",
                "hwplug_current_platform_s": round(hw_med, 4),
                "import_torch_s": round(th_med, 4),
                "ratio": round(hw_med / th_med, 3),
                "goal": "<= 0.30",
                "repeats": args.repeats,
            }
        )
    )


if __name__ == "__main__":
    main()
