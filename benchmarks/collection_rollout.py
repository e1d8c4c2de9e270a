"""A created text collection re-embedded in place while it serves
(``POST /v1/collections/{name}/rollout/stage|activate``): its queries' latency and errors while
the new version is staged, filled from the live documents and activated, against the same load
before and after, in the same run; and how fast the fill re-embeds.

    python -m benchmarks.collection_rollout [--documents 500] [--phase-s 15] [--repeats 2]

A local cluster with two nodes; the collection (MiniLM, 2 shards × 2 replicas) holds
``--documents`` msmarco passages (``SHARDRAG_DATA_DIR``). Per repeat: a quiet phase, then stage
(a perturbed copy of MiniLM: a new embedding version) and activate — the fill re-embeds every
document with the encoder worker the queries use too — then a quiet phase on the new version,
then the old version retired. One closed-loop text reader and a writer (one document every
100 ms) run throughout. JSON: benchmarks/results/collection_rollout.json.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import data_dir, load_corpus, machine_info, percentiles_ms, write_result
from index_shards.build import BuildConfig, build_collection
from retrieval.datasets import load_beir
from retrieval.encoders import default_model_dir
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster

NAME = "notes"


class Traffic:
    """A closed-loop text reader and a slow writer on the collection; latencies with timestamps."""

    def __init__(self, url: str, texts: list[str]) -> None:
        self.url, self.texts = url, texts
        self.reads: list[tuple[float, float, bool]] = []  # (started, seconds, ok)
        self.write_errors = 0
        self.writes = 0
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._read, daemon=True),
                        threading.Thread(target=self._write, daemon=True)]

    def start(self) -> Traffic:
        for thread in self.threads:
            thread.start()
        return self

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)

    def _read(self) -> None:
        with httpx.Client(base_url=f"{self.url}/v1/collections/{NAME}", timeout=60) as http:
            n = 0
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    ok = http.post("/query", json={"text": self.texts[n % len(self.texts)], "k": 10}).status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.reads.append((started, time.monotonic() - started, ok))
                n += 1

    def _write(self) -> None:
        with httpx.Client(base_url=f"{self.url}/v1/collections/{NAME}", timeout=120) as http:
            n = 0
            while not self.stop.is_set():
                n += 1
                try:
                    reply = http.post("/documents", json={"documents": [
                        {"id": f"live-{n % 200}", "text": f"{self.texts[n % len(self.texts)]} (revision {n})"}]})
                    self.write_errors += reply.status_code != 200
                except httpx.HTTPError:
                    self.write_errors += 1
                self.writes += 1
                time.sleep(0.1)

    def phase(self, start: float, end: float) -> dict[str, Any]:
        rows = [(s, ok) for started, s, ok in self.reads if start <= started < end]
        return {**percentiles_ms([s for s, ok in rows if ok]), "queries": len(rows),
                "errors": sum(not ok for _, ok in rows)}


def one_run(args: argparse.Namespace, scratch: Path, repeat: int, texts: list[str],
            queries: list[str]) -> dict[str, Any]:
    from tests.helpers.checkpoints import perturbed_checkpoint

    corpus = load_corpus(("msmarco",))
    root = scratch / f"root-{repeat}"
    build_collection(root, corpus.documents[:50], corpus.vectors[:50], corpus.version, BuildConfig("base", 1),
                     show_progress=False)
    model = perturbed_checkpoint(default_model_dir(), scratch / "tuned", seed=1, scale=0.02)
    config = GatewayConfig.from_dict({"encoder": {"workers": 1}, "rollout": {"drain_s": 1.0}})
    workdir = scratch / f"work-{repeat}"
    with LocalCluster(root, "base", replicas=1, gateway=config, nodes=2, workdir=workdir) as cluster, \
            httpx.Client(base_url=cluster.gateway_url, timeout=600) as http:
        created = http.put(f"/v1/collections/{NAME}", json={"model": "default", "shards": 2, "replicas": 2})
        created.raise_for_status()
        loaded_at = time.monotonic()
        for start in range(0, args.documents, 200):
            http.post(f"/v1/collections/{NAME}/documents", json={"documents": [
                {"id": f"d-{i}", "text": texts[i]} for i in range(start, min(start + 200, args.documents))]},
            ).raise_for_status()
        load_s = time.monotonic() - loaded_at
        traffic = Traffic(cluster.gateway_url, queries).start()
        try:
            quiet_at = time.monotonic()
            time.sleep(args.phase_s)
            rolling_at = time.monotonic()
            staged = http.post(f"/v1/collections/{NAME}/rollout/stage", json={"model": str(model)})
            staged.raise_for_status()
            old, new = staged.json()["state"]["active"], staged.json()["state"]["staged"]
            staged_at = time.monotonic()
            while True:  # every replica ready, the encoder loaded
                status = http.get(f"/v1/collections/{NAME}/rollout").json()
                rows = [r for shard in status["replicas"].get(new, {}).values() for r in shard]
                if rows and all(r["state"] == "ready" for r in rows) and status["encoders"][new]["state"] == "ready":
                    break
                time.sleep(0.2)
            ready_at = time.monotonic()
            activated = http.post(f"/v1/collections/{NAME}/rollout/activate",
                                  json={"version": new, "queries": queries[:20], "force": True})
            activated.raise_for_status()
            active_at = time.monotonic()
            time.sleep(args.phase_s)
            after_at = time.monotonic()
        finally:
            traffic.close()
        http.post(f"/v1/collections/{NAME}/rollout/retire", json={"version": old, "force": True}).raise_for_status()
        events = activated.json()["state"]["events"]
        synced = next((e for e in reversed(events) if e["kind"] == "VersionSynced"), {})
        result = {
            "documents": args.documents, "load_s": load_s,
            "stage_s": staged_at - rolling_at, "ready_s": ready_at - staged_at, "activate_s": active_at - ready_at,
            "fill_docs_per_s": args.documents / (active_at - ready_at), "synced": synced.get("detail"),
            "quiet_before": traffic.phase(quiet_at, rolling_at), "rollout": traffic.phase(rolling_at, active_at),
            "quiet_after": traffic.phase(active_at, after_at), "writes": traffic.writes,
            "write_errors": traffic.write_errors,
            "documents_after": http.get(f"/v1/collections/{NAME}").json()["documents"]}
    quiet = max(result["quiet_before"]["p99_ms"], result["quiet_after"]["p99_ms"])
    result["p99_rollout_over_quiet"] = result["rollout"]["p99_ms"] / quiet
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=500)
    parser.add_argument("--phase-s", type=float, default=15.0)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    dataset = load_beir(data_dir() / "msmarco")
    texts = [d.text for d in dataset.corpus[50:50 + args.documents]]
    queries = [dataset.queries[q] for q in sorted(dataset.queries)][:200]
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            run = one_run(args, Path(scratch), repeat, texts, queries)
            runs.append(run)
            print(f"run {repeat + 1}: {run['documents']} docs; stage {run['stage_s']:.1f} s, replicas+encoder ready "
                  f"{run['ready_s']:.1f} s, activate (fill + replay + gate) {run['activate_s']:.1f} s = "
                  f"{run['fill_docs_per_s']:.0f} docs/s; query p50/p99 quiet before "
                  f"{run['quiet_before']['p50_ms']:.1f}/{run['quiet_before']['p99_ms']:.1f} ms, rollout "
                  f"{run['rollout']['p50_ms']:.1f}/{run['rollout']['p99_ms']:.1f} ms, quiet after "
                  f"{run['quiet_after']['p50_ms']:.1f}/{run['quiet_after']['p99_ms']:.1f} ms "
                  f"(p99 rollout / quiet {run['p99_rollout_over_quiet']:.2f}x); errors: queries "
                  f"{run['quiet_before']['errors'] + run['rollout']['errors'] + run['quiet_after']['errors']}, "
                  f"writes {run['write_errors']} of {run['writes']}; documents after {run['documents_after']}",
                  flush=True)
    path = write_result("collection_rollout", {"machine": machine_info(), "args": vars(args), "runs": runs})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
