"""The token bucket every gateway request with a rate limit or a quota passes
(``httpkit.auth.RateLimiter.take``): nanoseconds per call, this tree against the same class at a
baseline commit, side by side in one run — without a share (the per-caller limit,
``limits.rate_limit_qps``) and with one (a cluster-wide quota split over the live gateways).

    python -m benchmarks.rate_limiter [--baseline ae93d27~1] [--runs 2]

JSON: benchmarks/results/rate_limiter.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks.common import machine_info, write_result

CALLS = 200_000


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def ns_per_take(limiter: Any) -> float:
    return min(timeit.repeat(lambda: limiter.take("k"), number=CALLS, repeat=5)) / CALLS * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="ae93d27~1", help="commit whose RateLimiter is the baseline")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as scratch:
        old_source = Path(scratch) / "auth_baseline.py"
        old_source.write_bytes(subprocess.run(["git", "show", f"{args.baseline}:httpkit/auth.py"], cwd=root,
                                              check=True, capture_output=True).stdout)
        old = load(old_source, "auth_baseline")
    from httpkit.auth import RateLimiter

    runs: list[dict[str, float]] = []
    for run in range(args.runs):
        row = {"baseline": ns_per_take(old.RateLimiter(1e9, 1e9)),
               "no_share": ns_per_take(RateLimiter(1e9, 1e9)),
               "share": ns_per_take(RateLimiter(1e9, 1e9, share=lambda: 0.5))}
        runs.append(row)
        print(f"run {run + 1}: baseline {row['baseline']:.0f} ns  this tree, no share {row['no_share']:.0f} ns "
              f"({row['no_share'] / row['baseline']:.2f}x)  with a share {row['share']:.0f} ns "
              f"({row['share'] / row['baseline']:.2f}x)")
    path = write_result("rate_limiter", {"machine": machine_info(), "baseline": args.baseline, "calls": CALLS,
                                         "runs": runs})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
