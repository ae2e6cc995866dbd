"""How long ``hwplug.resolve()`` takes: the default config on the detected platform and on
a simulated H100 (every hook and guard included). Prints JSON (median of repeats)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be positive")
    import hwplug

    report: dict[str, object] = {"benchmark": "resolve", "repeats": args.repeats}
    for label, platform in (("detected", None), ("h100", "h100")):
        hwplug.resolve(platform=platform)  # warm: plugins loaded, profiles built
        samples = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            hwplug.resolve(platform=platform)
            samples.append(time.perf_counter() - start)
        report[f"{label}_ms"] = 1e3 * statistics.median(samples)
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
