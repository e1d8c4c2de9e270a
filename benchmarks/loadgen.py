"""HTTP load generator, run as its own process so its CPU is measurable.

    python -m benchmarks.loadgen --url URL/v1/query --bodies FILE --concurrency 32 --duration 10
    python -m benchmarks.loadgen --url URL/v1/query --bodies FILE --rate 300 --duration 60 --latencies-out x.npy

Closed loop (``--concurrency``): that many clients, each sending its next request when the last
one returns. Open loop (``--rate``): requests leave on a fixed schedule whatever the answers do,
and latency counts from the *scheduled* send time (no coordinated omission) — the right way to
see a tail. ``FILE``: JSON list of request bodies (sent round-robin), or a .npy matrix sent as
float32 rows. Prints one JSON line: p50/p99/p99.9 over the measured window (after --warmup s),
QPS, errors, partial answers and this process's CPU seconds.

Open loop with ``--url`` given more than once: request i goes to URL i mod n, so the targets (say
two gateways with different policies over the same shards) are measured in the same instants,
each at rate/n; the summary adds ``per_url`` (the same figures for each), and the timeline a
fourth column, the URL's index.
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


def _percentiles(values: np.ndarray) -> dict:
    return {"p50_ms": float(np.percentile(values, 50)) if len(values) else None,
            "p99_ms": float(np.percentile(values, 99)) if len(values) else None,
            "p999_ms": float(np.percentile(values, 99.9)) if len(values) else None,
            "max_ms": float(values.max()) if len(values) else None}


async def run_open_loop(urls: list[str], bodies: list[bytes], rate: float, duration_s: float, warmup_s: float,
                        content_type: str, timeout_s: float) -> tuple[dict, np.ndarray, np.ndarray]:
    import aiohttp

    clock = time.perf_counter  # uvloop's loop.time() ticks in whole milliseconds: too coarse for a tail
    connector = aiohttp.TCPConnector(limit=0)
    session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s))
    headers = {"content-type": content_type}
    latencies: list[float] = []
    timeline: list[tuple[float, float, float, int]] = []  # (scheduled wall time, latency s, ok, url index)
    outcome = {"errors": 0, "partial": 0, "statuses": {}}
    per_url = [{"errors": 0, "partial": 0} for _ in urls]
    wall_offset = time.time() - clock()
    start = clock() + 0.05
    measure_from = start + warmup_s
    end = measure_from + duration_s
    interval = 1.0 / rate
    pending: set[asyncio.Future] = set()

    async def one(body: bytes, scheduled: float, target: int) -> None:
        try:
            async with session.post(urls[target], data=body, headers=headers) as response:
                payload = await response.read()
                status = response.status
        except (TimeoutError, aiohttp.ClientError):
            status, payload = -1, b""
        if scheduled < measure_from:
            return
        latencies.append(clock() - scheduled)
        timeline.append((scheduled + wall_offset, latencies[-1], 1.0 if status == 200 else 0.0, target))
        if status != 200:
            outcome["errors"] += 1
            per_url[target]["errors"] += 1
            outcome["statuses"][str(status)] = outcome["statuses"].get(str(status), 0) + 1
        elif b'"partial":true' in payload:
            outcome["partial"] += 1
            per_url[target]["partial"] += 1

    cpu_before = time.process_time()
    i = 0
    while True:
        scheduled = start + i * interval
        if scheduled >= end:
            break
        delay = scheduled - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.ensure_future(one(bodies[i % len(bodies)], scheduled, i % len(urls)))
        pending.add(task)
        task.add_done_callback(pending.discard)
        i += 1
    if pending:
        await asyncio.gather(*pending)
    await session.close()
    values = np.asarray(latencies) * 1000.0
    rows = np.asarray(timeline, dtype=np.float64).reshape(-1, 4)
    summary = {
        "requests": len(latencies),
        "rate": rate,
        "qps": len(latencies) / duration_s,
        **_percentiles(values),
        **outcome,
        "loadgen_cpu_s": time.process_time() - cpu_before,
    }
    if len(urls) > 1:
        summary["per_url"] = [
            {"url": url, "requests": int((rows[:, 3] == n).sum()), **_percentiles(rows[rows[:, 3] == n, 1] * 1000.0),
             **per_url[n]}
            for n, url in enumerate(urls)]
    return summary, values, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, action="append",
                        help="target; open loop: may be given more than once (request i goes to URL i mod n)")
    parser.add_argument("--bodies", required=True, help="JSON list of bodies, or a .npy matrix sent as float32 rows")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rate", type=float, default=0.0, help="open loop: requests per second (default: closed loop)")
    parser.add_argument("--timeout", type=float, default=10.0, help="open loop: client timeout per request, s")
    parser.add_argument("--latencies-out", help="open loop: save every measured latency (ms) to this .npy")
    parser.add_argument("--timeline-out",
                        help="open loop: save (scheduled wall-clock time, latency s, ok) rows to this .npy")
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
    if len(args.url) > 1 and args.rate <= 0:
        parser.error("several --url need the open loop (--rate)")
    if args.rate > 0:
        summary, values, timeline = asyncio.run(run_open_loop(args.url, bodies, args.rate, args.duration,
                                                              args.warmup, content_type, args.timeout))
        if args.latencies_out:
            np.save(args.latencies_out, values)
        if args.timeline_out:
            np.save(args.timeline_out, timeline if len(args.url) > 1 else timeline[:, :3])
        print(json.dumps(summary))
        return
    print(json.dumps(asyncio.run(run(args.url[0], bodies, args.concurrency, args.duration, args.warmup, content_type))))


if __name__ == "__main__":
    main()
