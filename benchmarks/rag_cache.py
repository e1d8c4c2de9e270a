"""RAG answers with and without KV-cache reuse, on a Zipf-popular query trace.

    python -m benchmarks.rag_cache                 # ~8 min on 2 cores
    python -m benchmarks.rag_cache --requests 40   # quicker
    python -m benchmarks.rag_cache --passages      # passage-level reuse: benchmarks/rag_passages.py
    python -m benchmarks.rag_cache --routing       # cache-affinity routing: benchmarks/rag_routing.py

The trace: queries of ../shared/data (msmarco + dbpedia) drawn with Zipf(s) popularity, so
popular questions repeat. Each request's prompt is the real RAG prompt (serving.rag: system
prompt + the top-3 passages of an exact search over the 10k MiniLM vectors + the question).
The generators are real `shardrag generator` processes running SmolLM2-135M-Instruct (greedy,
1 torch thread each), sent the trace round robin by 2 concurrent clients — the worst case for
locality, so the local pools miss what the other process prefilled. Three set-ups, the same
processes otherwise:

  off          2 generators, --no-cache (every prompt prefilled in full: the baseline)
  local        2 generators, each with its own in-process pool only
  distributed  2 generators + 2 kv-nodes (local pool, then the nodes)

Reported per set-up: TTFT p50/p99 (all requests; hits = at least half the prompt cached, i.e.
the passages and not only the system prompt; partial hits; misses), requests/s, prompt-token
hit rate per tier, bytes fetched from / written to kv-nodes; and whether every request's
answer equals the `off` answer token for token. JSON in benchmarks/results/rag_cache.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.common import data_dir, load_corpus, machine_info, percentiles_ms, scratch_dir, write_result
from retrieval.datasets import load_beir
from serving.answer.prompt import build_messages
from serving.local.launcher import Child

PYTHON = sys.executable


def zipf_trace(num_queries: int, requests: int, s: float, seed: int) -> list[int]:
    weights = 1.0 / np.arange(1, num_queries + 1) ** s
    rng = np.random.default_rng(seed)
    return rng.choice(num_queries, size=requests, p=weights / weights.sum()).tolist()


def retrievals_for(num_queries: int, seed: int, k: int = 3) -> list[tuple[str, list[dict[str, str]]]]:
    """(question, its top-k passages by exact search) for ``num_queries`` msmarco + dbpedia questions."""
    corpus = load_corpus()
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(corpus.query_vectors), size=num_queries, replace=False)
    texts = []
    for name in ("msmarco", "dbpedia"):
        dataset = load_beir(data_dir() / name)
        texts.extend(dataset.queries[q] for q in sorted(dataset.queries))
    retrievals = []
    for index in chosen:
        scores = corpus.vectors @ corpus.query_vectors[index]
        top = np.argsort(-scores)[:k]
        hits = [{"doc_id": corpus.documents[i].doc_id, "title": corpus.documents[i].title,
                 "text": corpus.documents[i].text} for i in top]
        retrievals.append((texts[index], hits))
    return retrievals


def prompts_for(num_queries: int, seed: int) -> list[list[dict[str, str]]]:
    return [build_messages(question, hits) for question, hits in retrievals_for(num_queries, seed)]


def start(name: str, argv: list[str], workdir: Path) -> Child:
    child = Child(name, lambda port: [PYTHON, "-m", "serving", *argv, "--port", str(port)], workdir / f"{name}.log")
    child.start({**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    return child


def closed_loop(count: int, clients: int,
                send: Callable[[httpx.Client, int], dict[str, Any]]) -> tuple[list[dict[str, Any]], float]:
    """Requests 0..count-1 from ``clients`` threads, each sending the next one when its last
    answer is back; returns the answers in request order and the wall time."""
    results: list[dict[str, Any]] = [{} for _ in range(count)]
    cursor = {"next": 0}
    lock = threading.Lock()

    def client() -> None:
        with httpx.Client(timeout=300) as http:
            while True:
                with lock:
                    index = cursor["next"]
                    cursor["next"] += 1
                if index >= count:
                    return
                results[index] = send(http, index)

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, time.perf_counter() - started


def run_setup(name: str, prompts: list[list[dict[str, str]]], trace: list[int], workdir: Path, *,
              max_new_tokens: int, model: str) -> dict[str, Any]:
    nodes: list[Child] = []
    generators: list[Child] = []
    try:
        if name == "distributed":
            nodes = [start(f"{name}-kv-{i}", ["kv-node", "--budget-mb", "256"], workdir) for i in range(2)]
            for node in nodes:
                node.wait_ready(time.monotonic() + 60)
        cache_args = {"off": ["--no-cache"], "local": [],
                      "distributed": ["--kv-nodes", ",".join(n.ready["url"] for n in nodes)]}[name]
        generators = [start(f"{name}-gen-{i}", ["generator", "--model", model, "--threads", "1", *cache_args], workdir)
                      for i in range(2)]
        for generator in generators:
            generator.wait_ready(time.monotonic() + 300)
        urls = [g.ready["url"] for g in generators]
        def send(http: httpx.Client, index: int) -> dict[str, Any]:
            url = urls[index % len(urls)]  # round robin: no locality help
            body = {"messages": prompts[trace[index]], "max_new_tokens": max_new_tokens}
            response = http.post(f"{url}/v1/generate", json=body)
            response.raise_for_status()
            answer: dict[str, Any] = response.json()
            return answer

        print(f"[{name}] {len(trace)} requests ...", flush=True)
        results, wall = closed_loop(len(trace), 2, send)
        infos = [httpx.get(f"{u}/v1/info", timeout=10).json() for u in urls]
        node_stats = [httpx.get(f"{n.ready['url']}/v1/stats", timeout=10).json() for n in nodes]
    finally:
        for child in generators + nodes:
            child.stop()
    caches = [r["cache"] for r in results]
    ttft = [c["ttft_ms"] / 1000 for c in caches]
    # A hit: at least half the prompt came from the cache (the passages, not only the system prompt).
    hit = [c["ttft_ms"] / 1000 for c in caches if c["hit_tokens"] >= 0.5 * c["prompt_tokens"]]
    partial = [c["ttft_ms"] / 1000 for c in caches if 0 < c["hit_tokens"] < 0.5 * c["prompt_tokens"]]
    miss = [c["ttft_ms"] / 1000 for c in caches if c["hit_tokens"] == 0]
    prompt_tokens = sum(c["prompt_tokens"] for c in caches)
    kv_stats = [i["kv_stats"] or {} for i in infos]
    return {
        "requests": len(trace), "wall_s": wall, "requests_per_s": len(trace) / wall,
        "ttft": percentiles_ms(ttft), "ttft_hits": percentiles_ms(hit), "ttft_misses": percentiles_ms(miss),
        "ttft_partial": percentiles_ms(partial), "hit_requests": len(hit), "partial_requests": len(partial),
        "hit_rate": sum(c["hit_tokens"] for c in caches) / prompt_tokens,
        "local_hit_rate": sum(c["local_hit_tokens"] for c in caches) / prompt_tokens,
        "remote_hit_rate": sum(c["remote_hit_tokens"] for c in caches) / prompt_tokens,
        "prompt_tokens_mean": prompt_tokens / len(caches),
        "bytes_fetched": sum(s.get("bytes_fetched", 0) for s in kv_stats),
        "bytes_written": sum(s.get("bytes_written", 0) for s in kv_stats),
        "kv_nodes": node_stats,
        "tokens_per_s_decode": float(np.mean([c["tokens_per_s"] for c in caches])),
        "token_ids": [r["token_ids"] for r in results],
    }


def main() -> None:
    for flag, module in (("--passages", "benchmarks.rag_passages"), ("--routing", "benchmarks.rag_routing")):
        if flag in sys.argv:
            import importlib

            sys.argv.remove(flag)
            importlib.import_module(module).main()
            return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=60, help="trace length (default 60)")
    parser.add_argument("--queries", type=int, default=24, help="distinct questions (default 24)")
    parser.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent (default 1.1)")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="answer tokens (default 16)")
    parser.add_argument("--model", default="smollm2", help="generator model (default smollm2)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    prompts = prompts_for(args.queries, args.seed)
    trace = zipf_trace(args.queries, args.requests, args.zipf, args.seed)
    workdir = scratch_dir("rag-cache-")
    setups = {}
    for name in ("off", "local", "distributed"):
        setups[name] = run_setup(name, prompts, trace, workdir, max_new_tokens=args.max_new_tokens,
                                 model=args.model)
    baseline = setups["off"]
    identical = {name: s["token_ids"] == baseline["token_ids"] for name, s in setups.items()}
    cold_p50 = baseline["ttft"]["p50_ms"]
    print(f"\ntrace: {args.requests} requests over {args.queries} questions (Zipf {args.zipf}), "
          f"{len(set(trace))} distinct; prompt ≈ {baseline['prompt_tokens_mean']:.0f} tokens; "
          f"{args.max_new_tokens} new tokens, greedy")
    print(f"{'set-up':<12} {'TTFT p50':>9} {'p99':>8} {'hit p50':>8} {'partial':>8} {'hits':>5} {'cold/hit':>9} "
          f"{'req/s':>7} "
          f"{'×off':>6} {'hit rate':>9} {'local':>6} {'remote':>7} {'MB fetched':>11} {'MB written':>11} identical")
    for name, s in setups.items():
        hit_p50 = s["ttft_hits"]["p50_ms"]
        speedup = cold_p50 / hit_p50 if hit_p50 == hit_p50 else float("nan")
        s["cold_over_hit_ttft_p50"] = speedup
        s["throughput_vs_off"] = s["requests_per_s"] / baseline["requests_per_s"]
        print(f"{name:<12} {s['ttft']['p50_ms']:>7.0f}ms {s['ttft']['p99_ms']:>6.0f}ms {hit_p50:>6.0f}ms "
              f"{s['ttft_partial']['p50_ms']:>6.0f}ms {s['hit_requests']:>5} {speedup:>8.2f}× "
              f"{s['requests_per_s']:>7.3f} "
              f"{s['throughput_vs_off']:>5.2f}× {s['hit_rate']:>8.1%} {s['local_hit_rate']:>6.1%} "
              f"{s['remote_hit_rate']:>7.1%} {s['bytes_fetched'] / 1e6:>11.1f} {s['bytes_written'] / 1e6:>11.1f} "
              f"{identical[name]}")
    for s in setups.values():
        del s["token_ids"]
    path = write_result("rag_cache", {"machine": machine_info(), "settings": vars(args), "distinct": len(set(trace)),
                                      "identical_answers": identical, "setups": setups})
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
