"""``shardrag demo`` and ``shardrag serve``: a local cluster of processes for a built collection
(Ray actors and the embedded one-process backend: ``serving.cli.backends``), with fresh API keys,
until Ctrl-C."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from retrieval.embedding_cache import default_cache_dir
from retrieval.errors import ShardragError
from serving.cli.build import make_encoder
from serving.cli.common import root_of
from serving.cli.serve_common import access, gateway_config, key_of, print_banner, replicas_of, tls_files


def _start_cluster(args: argparse.Namespace, root: Path, collection: str, version: str | None) -> Any:
    from serving.local.launcher import LocalCluster

    gateway = gateway_config(args)
    keys, token = access(args)
    replicas = replicas_of(args)
    cluster = LocalCluster(root, collection, version=version, replicas=replicas, host=args.host,
                           gateway_port=args.port, gateway_port_fallback=True, gateway=gateway, workdir=args.workdir,
                           faiss_threads=args.faiss_threads,
                           generators=args.generators, generator_model=args.generator_model, kv_nodes=args.kv_nodes,
                           kv_node_budget_mb=args.kv_node_budget_mb,
                           generator_args=("--kv-reuse", getattr(args, "kv_reuse", "prefix")), api_keys=keys,
                           internal_token=token, nodes=max(0, args.nodes), layout=args.layout,
                           tls=tls_files(args))
    extra = f" + {args.generators} generators + {args.kv_nodes} kv-nodes" if args.generators else ""
    where = f"on {cluster.node_count} node(s)" if cluster.built is not None else \
        "as processes" + (f" + {cluster.node_count} node(s)" if cluster.node_count else "")
    print(f"starting {cluster.manifest.num_shards} shards × {replicas} replicas {where}{extra} + gateway "
          f"({cluster.manifest.embedding_version.id}) ...", file=sys.stderr, flush=True)
    cluster.start()
    if args.port and cluster.gateway is not None and cluster.gateway.port != args.port:
        print(f"port {args.port} is busy; the gateway took a free one: {cluster.gateway_url}", file=sys.stderr)
    return cluster


def _run_until_interrupted(cluster: Any) -> int:
    stop = {"now": False}

    def on_signal(signum: int, frame: Any) -> None:
        stop["now"] = True
        cluster.stop()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        cluster.wait()
    finally:
        print("stopping cluster ...", file=sys.stderr)
        cluster.stop()
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    if args.backend in ("ray", "embedded"):
        from serving.cli.backends import serve_embedded, serve_on_ray

        return serve_on_ray(args) if args.backend == "ray" else serve_embedded(args)
    cluster = _start_cluster(args, root_of(args), args.collection, args.version)
    print_banner(cluster, "how do I open a file")
    return _run_until_interrupted(cluster)


# Common questions and where their answer lives: `shardrag demo` prints each one's top hits and
# the rank of the first hit from one of these modules; `--check` fails unless that is in the top
# 3. Measured (MiniLM, Python 3.11, 2026-12-02; `python -m benchmarks.demo_corpus` asks 20 such
# questions): csv and argparse at rank 1, sorted() at rank 2 (after a dict passage about merging
# keys), http.client at rank 3 (http.server's "HTTP request handler" class ranks first).
DEMO_QUERIES: dict[str, tuple[str, ...]] = {
    "read a csv file": ("csv",),
    "parse command line arguments": ("argparse", "optparse", "getopt"),
    "make an HTTP request": ("urllib.request", "http.client", "urllib"),
    "sort a list of dictionaries by key": ("builtins.sorted", "builtins.list.sort", "operator.itemgetter"),
}
DEMO_CHECK_RANK = 3


def answers_question(doc_id: str, expected: tuple[str, ...]) -> bool:
    """Whether a demo hit (``py/http.client.HTTPConnection#0``) comes from one of the ``expected``
    modules or names (``http.client``, ``builtins.sorted``)."""
    name = doc_id.removeprefix("py/").split("#")[0]
    return any(name == e or name.startswith(e + ".") for e in expected)


def cmd_demo(args: argparse.Namespace) -> int:
    from index_shards.build import BuildConfig, build_collection
    from index_shards.layout import list_versions
    from retrieval.encoders import encode_documents
    from serving.local.demo_corpus import python_docs_corpus

    root = Path(args.root) if args.root else default_cache_dir().parent / "demo"
    collection = "pydocs"
    documents = python_docs_corpus(args.max_docs)  # reading the docstrings takes about a second
    existing = list_versions(root, collection)
    version = None
    if existing and not args.rebuild and existing[-1].count == len(documents):
        version = existing[-1].embedding_version.id
        print(f"using the demo collection built before: {root / collection / version}", file=sys.stderr)
    else:
        print(f"building the demo collection from Python's documentation: {len(documents)} passages over every "
              "module and reference topic (the vectors are cached: later runs start in seconds) ...",
              file=sys.stderr, flush=True)
        encoder = make_encoder(args)
        vectors = encode_documents(encoder, documents)
        manifest = build_collection(root, documents, vectors, encoder.version,
                                    BuildConfig(collection, num_shards=2, overwrite=True))
        version = manifest.embedding_version.id
    cluster = _start_cluster(args, root, collection, version)
    try:
        if args.check:
            return _demo_check(cluster)
        _demo_queries(cluster)
        print_banner(cluster, next(iter(DEMO_QUERIES)))
    except BaseException:
        cluster.stop()
        raise
    return _run_until_interrupted(cluster)


def _demo_queries(cluster: Any) -> list[str]:
    """Ask the example questions, print their top hits; the questions whose expected module is not
    in the top ``DEMO_CHECK_RANK``."""
    from retrieval.client import ShardragClient

    wrong = []
    with ShardragClient(cluster.gateway_url, timeout_s=120, api_key=key_of(cluster, "read") or "",
                        verify=cluster.tls[2] if cluster.tls else None) as client:
        for text, expected in DEMO_QUERIES.items():
            started = time.perf_counter()
            response = client.query(text=text, k=3)
            print(f"\nQ: {text}  ({(time.perf_counter() - started) * 1000:.0f} ms, "
                  f"{response['diagnostics']['shards_answered']}/{response['diagnostics']['shards_total']} shards)")
            for hit in response["hits"]:
                snippet = " ".join(hit["text"].split())[:90]
                print(f"   {hit['score']:.3f} {hit['doc_id']:<40} {snippet}")
            ranks = [rank for rank, hit in enumerate(response["hits"], start=1)
                     if answers_question(hit["doc_id"], expected)]
            print(f"   → {', '.join(expected)} at rank {ranks[0]}" if ranks else
                  f"   → none of {', '.join(expected)} in the top {len(response['hits'])}")
            if not ranks or ranks[0] > DEMO_CHECK_RANK:
                wrong.append(f"{text!r}: none of {', '.join(expected)} in the top {DEMO_CHECK_RANK}")
    return wrong


def _demo_check(cluster: Any) -> int:
    """Ask the demo queries, print the answers, stop: proof that the whole path works."""
    from retrieval.client import ShardragClient

    try:
        wrong = _demo_queries(cluster)
        if wrong:
            raise ShardragError("demo check: " + "; ".join(wrong))
        with ShardragClient(cluster.gateway_url, timeout_s=120, api_key=key_of(cluster, "read") or "",
                            verify=cluster.tls[2] if cluster.tls else None) as client:
            if cluster.api_keys:
                import httpx

                refused = httpx.post(f"{cluster.gateway_url}/v1/query", json={"text": "read a csv file"}, timeout=30,
                                     verify=False)  # only the status matters here
                if refused.status_code != 401:
                    raise ShardragError(f"a query without an API key got {refused.status_code}, not 401")
                print(f"\na query without an API key: {refused.status_code} (refused, as it should be)")
            print(f"\ncluster: {json.dumps(client.cluster()['shards'][0]['healthy_replicas'])} healthy replicas "
                  "on shard 0; demo check passed")
    finally:
        cluster.stop()
    return 0
