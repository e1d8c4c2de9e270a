"""``shardrag ask "question"``: an answer from a running gateway (``POST /v1/answer``), its tokens
printed as they are generated, then the passages it cites and where the time went."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from serving.cli.common import DEFAULT_URL, count_argument, gateway_url

ASK_DESCRIPTION = """\
shardrag ask "question" [--collection NAME] [--mode hybrid]
  Retrieves k passages (dense, lexical or hybrid, as a query would) and asks the
  cluster's generators for an answer grounded in them: the tokens are printed as they
  come, then the cited passages ([n] doc id, title) and the timings (retrieval, time
  to first token, total) with the KV-cache reuse. --json prints the whole answer
  (citations, timings, cache statistics) as JSON instead. Needs a cluster started with
  generators (`shardrag demo --generators 1`, or `serve`; without them the gateway answers
  404, saying so).
"""


def cmd_ask(args: argparse.Namespace) -> int:
    from retrieval.client import ShardragClient
    from retrieval.client_types import Answer, DoneEvent, RetrievalEvent, TokenEvent

    options: dict[str, Any] = {"k": args.k, "max_new_tokens": args.max_new_tokens, "kv_reuse": args.kv_reuse,
                               "mode": args.mode, "fusion": args.fusion, "group_by": args.group_by}
    with ShardragClient(gateway_url(args), timeout_s=args.timeout, api_key=args.api_key,
                        retries=args.retries) as client:
        target = client.collection(args.collection) if args.collection else client
        if args.json:
            print(json.dumps(target.answer(args.question, **options).raw, indent=1))
            return 0
        answer: Answer | None = None
        for event in target.answer_stream(args.question, **options):
            if isinstance(event, RetrievalEvent) and not event.passages:
                print("(no passage was retrieved: the answer is the model's alone)", file=sys.stderr)
            elif isinstance(event, TokenEvent):
                sys.stdout.write(event.text)
                sys.stdout.flush()
            elif isinstance(event, DoneEvent):
                answer = event.answer
    if answer is None:  # the stream ended without its done event
        print("\nerror: the answer stream ended before the answer was done", file=sys.stderr)
        return 1
    print()
    for passage in answer.passages:  # the passages the prompt cited, [n] as the answer refers to them
        print(f"[{passage.n}] {passage.doc_id}  {passage.title}")
    timings, cache = answer.timings, answer.cache
    reused = (f", {cache['hit_tokens']} of {cache['prompt_tokens']} prompt tokens from the KV cache"
              if "hit_tokens" in cache and "prompt_tokens" in cache else "")
    partial = ", partial retrieval: a shard did not answer" if answer.partial_retrieval else ""
    print(f"retrieval {timings.get('retrieval_ms', 0.0):.0f} ms, first token {timings.get('ttft_ms', 0.0):.0f} ms, "
          f"total {timings.get('total_ms', 0.0):.0f} ms{reused} ({answer.version}{partial})", file=sys.stderr)
    return 0


def add_ask_command(commands: Any) -> None:
    ask = commands.add_parser("ask", help="an answer from a running gateway's generators, streamed, with citations",
                              formatter_class=argparse.RawDescriptionHelpFormatter, description=ASK_DESCRIPTION)
    ask.add_argument("question", help="the question")
    ask.add_argument("--url", help=f"gateway URL [env SHARDRAG_URL, default {DEFAULT_URL}]")
    ask.add_argument("--api-key", default=None, help="API key [env SHARDRAG_API_KEY]")
    ask.add_argument("--collection", default=None,
                     help="a collection the gateway serves: its passages, and its query defaults for the "
                          "retrieval (default: the collection the gateway was started with)")
    ask.add_argument("-k", "--k", type=int, default=3, help="passages retrieved into the prompt, 1-10 (default 3)")
    ask.add_argument("--max-new-tokens", type=int, default=64, help="the answer's length in tokens (default 64)")
    ask.add_argument("--mode", choices=("dense", "lexical", "hybrid"), default=None,
                     help="how the passages are retrieved (default: the collection's query defaults, dense unless "
                          "set; docs/hybrid.md)")
    ask.add_argument("--fusion", choices=("rrf", "weighted"), default=None, help="hybrid: how the legs are fused")
    ask.add_argument("--group-by", default=None, metavar="KEY",
                     help="a metadata key: the k passages come from the k best groups sharing its value, one each "
                          "(e.g. source: k different files; docs/filters.md)")
    ask.add_argument("--kv-reuse", choices=("prefix", "passage"), default=None,
                     help="prefix: reuse the longest cached prompt prefix; passage: each passage's cached KV "
                          "wherever it ranks (default: the generators' setting; docs/rag-cache.md)")
    ask.add_argument("--json", action="store_true", help="print the whole answer as JSON (not streamed)")
    ask.add_argument("--timeout", type=float, default=120.0, help="seconds (default 120)")
    ask.add_argument("--retries", type=count_argument, default=2,
                     help="how many more times the request is sent where that is safe, before the answer starts "
                          "(a refused connection, a 429, a 503) (default 2)")
    ask.set_defaults(func=cmd_ask)
