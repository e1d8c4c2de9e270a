"""Closed-loop HTTP load generator, run as its own process so its CPU is measurable.

    python -m benchmarks.loadgen --url URL/v1/query --bodies FILE --concurrency 32 --duration 10

``FILE``: JSON list of request bodies (sent round-robin). Prints one JSON line: latencies
(p50/p99 over the measured window, after --warmup seconds), QPS, errors and this process's
CPU seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import numpy as np


async def run(url: str, bodies: list[bytes], concurrency: int, duration_s: float, warmup_s: float,
              content_type: str = "application/json") -> dict:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0)
    latencies: list[float] = []
    errors = {"count": 0, "statuses": {}}
    start = time.perf_counter()
    measure_from = start + warmup_s
    stop_at = measure_from + duration_s
    headers = {"content-type": content_type}

    async def worker(offset: int) -> None:
        i = offset
        async with aiohttp.ClientSession(connector=connector, connector_owner=False) as session:
            while True:
                now = time.perf_counter()
                if now >= stop_at:
                    return
                body = bodies[i % len(bodies)]
                i += concurrency
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    status = response.status
                end = time.perf_counter()
                if now >= measure_from:
                    latencies.append(end - now)
                    if status != 200:
                        errors["count"] += 1
                        errors["statuses"][str(status)] = errors["statuses"].get(str(status), 0) + 1

    cpu_before = time.process_time()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    await connector.close()
    values = np.asarray(latencies) * 1000.0
    return {
        "requests": len(latencies),
        "qps": len(latencies) / duration_s,
        "p50_ms": float(np.percentile(values, 50)) if len(values) else None,
        "p99_ms": float(np.percentile(values, 99)) if len(values) else None,
        "mean_ms": float(values.mean()) if len(values) else None,
        "errors": errors,
        "loadgen_cpu_s": time.process_time() - cpu_before,
        "wall_s": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--bodies", required=True, help="JSON list of bodies, or a .npy matrix sent as float32 rows")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    args = parser.parse_args()
    content_type = "application/json"
    if args.bodies.endswith(".npy"):
        bodies = [row.astype("<f4").tobytes() for row in np.load(args.bodies)]
        content_type = "application/octet-stream"
    else:
        with open(args.bodies) as handle:
            bodies = [json.dumps(b).encode() for b in json.load(handle)]
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    print(json.dumps(asyncio.run(run(args.url, bodies, args.concurrency, args.duration, args.warmup, content_type))))


if __name__ == "__main__":
    main()
