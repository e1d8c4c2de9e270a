"""``shardrag build``: encode a corpus (or re-embed a collection's slices) into a sharded collection."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from retrieval.embedding_cache import default_cache_dir
from serving.cli.common import root_of


def make_encoder(args: argparse.Namespace) -> Any:
    from retrieval.embedding_cache import CachingEncoder, EmbeddingCache
    from retrieval.encoders import load_encoder

    print(f"loading encoder {args.model or 'all-MiniLM-L6-v2'} ...", file=sys.stderr, flush=True)
    # demo builds with the runtime its gateway will serve with (onnx-int8 is a version of its own)
    runtime = str(getattr(args, "runtime", None) or getattr(args, "encoder_runtime", "torch"))
    encoder = load_encoder(args.model, device=args.device, batch_size=args.batch_size, runtime=runtime)
    if args.no_cache:
        return encoder
    return CachingEncoder(encoder, EmbeddingCache(args.cache_dir or default_cache_dir()))


def cmd_build(args: argparse.Namespace) -> int:
    from index_shards.build import BuildConfig, encode_and_build, live_documents_of_version
    from index_shards.layout import resolve_version
    from retrieval.analysis import DEFAULT_LANGUAGE, describe_language, languages
    from retrieval.datasets import load_documents

    if args.lexical_language == "list":
        print("\n".join(f"{language:<13} {describe_language(language)}" for language in languages()))
        return 0
    shards, partitioner, factory, metric = args.shards, args.partitioner, args.factory or "Flat", args.metric
    language = args.lexical_language or DEFAULT_LANGUAGE
    ef_construction = args.ef_construction
    built_from: tuple[str | None, tuple[int, ...] | None] = (None, None)
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
        _, existing = resolve_version(root_of(args), collection, args.from_version)
        # the live documents (the build's plus every write since), and the seq of each shard read:
        # the rollout of the new version replays only the writes after that cut
        documents, seqs, source_version = live_documents_of_version(root_of(args), collection,
                                                                    existing.embedding_version.id)
        built_from = (source_version, seqs)
        shards = existing.num_shards
        partitioner = existing.partitioner if args.partitioner is None else partitioner
        factory, metric = args.factory or existing.factory, existing.metric  # --factory: a new structure
        if ef_construction is None and args.factory is None:
            ef_construction = existing.ef_construction  # the same structure, built as it was
        language = args.lexical_language or existing.lexical_language
        source = f"{collection} @ {existing.embedding_version.id}"
    if args.max_docs:
        documents = documents[: args.max_docs]
    config = BuildConfig(collection=collection, num_shards=shards, partitioner=partitioner or "hash",
                         factory=factory, metric=metric, overwrite=args.overwrite, source_version=built_from[0],
                         source_seqs=built_from[1], lexical_language=language, ef_construction=ef_construction)
    config.validate()
    print(f"{len(documents)} documents from {source}", file=sys.stderr)
    manifest = encode_and_build(root_of(args), documents, make_encoder(args), config)
    out = root_of(args) / collection / manifest.embedding_version.id
    print(json.dumps({"collection": collection, "version": manifest.embedding_version.id, "path": str(out),
                      "count": manifest.count, "shards": manifest.num_shards}, indent=1))
    return 0


def cmd_export_onnx(args: argparse.Namespace) -> int:
    from retrieval.onnx_export import export_onnx

    print(f"exporting {args.model or 'all-MiniLM-L6-v2'} to {args.out} ({'int8' if args.int8 else 'fp32'}) ...",
          file=sys.stderr, flush=True)
    manifest = export_onnx(args.model, args.out, int8=args.int8)
    print(json.dumps({"out": str(args.out), "version": manifest.version().id, "precision": manifest.precision}))
    return 0
