"""Passage-level KV reuse (CacheBlend) vs prefix reuse vs full prefill, on a trace where the same
passages recur in different orders and combinations.

    python -m benchmarks.rag_cache --passages        # ~12 min on 2 cores
    python -m benchmarks.rag_passages --groups 4     # quicker

The trace: ``--groups`` real questions (half msmarco, half dbpedia); each retrieves its top 6
passages by exact search over the 10k MiniLM vectors. Each question is asked ``--variants``
times, as a paraphrase would retrieve it: the top 4 in rank order, then a random 4 of the top 6
in a random order (passages swap ranks, enter and leave). SmolLM2-135M-Instruct, in process,
greedy, fp32, 2 torch threads; the real RAG prompt (serving.answer.prompt).

Two measurements:
  * the trace in order, from an empty cache: prefix reuse vs passage reuse (default fraction) —
    prompt-token hit rate and TTFT p50/p99 (what a generator sees in use);
  * the recompute-fraction curve, every passage already cached: for each fraction, TTFT and the
    agreement of the first ``--tokens`` answer tokens with the full prefill — exact greedy
    match rate, token F1 and ROUGE-L (LCS). Fraction 1.0 must match exactly.
JSON in benchmarks/results/rag_passages.json, the curve in rag_passages.png.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from typing import Any

import numpy as np

from benchmarks.common import RESULTS, load_corpus, machine_info, percentiles_ms, write_result

FRACTIONS = (0.0, 0.05, 0.15, 0.3, 1.0)


def token_f1(candidate: list[int], reference: list[int]) -> float:
    common = sum((Counter(candidate) & Counter(reference)).values())
    if not candidate or not reference or not common:
        return float(candidate == reference)
    precision, recall = common / len(candidate), common / len(reference)
    return 2 * precision * recall / (precision + recall)


def rouge_l(candidate: list[int], reference: list[int]) -> float:
    if not candidate or not reference:
        return float(candidate == reference)
    previous = [0] * (len(reference) + 1)
    for token in candidate:
        current = [0]
        for index, other in enumerate(reference):
            current.append(previous[index] + 1 if token == other else max(previous[index + 1], current[index]))
        previous = current
    lcs = previous[-1]
    if not lcs:
        return 0.0
    precision, recall = lcs / len(candidate), lcs / len(reference)
    return 2 * precision * recall / (precision + recall)


def make_trace(groups: int, variants: int, seed: int) -> list[tuple[str, list[dict[str, str]]]]:
    from benchmarks.common import data_dir
    from retrieval.datasets import load_beir

    corpus = load_corpus()
    texts = []
    boundaries = []
    for name in ("msmarco", "dbpedia"):
        dataset = load_beir(data_dir() / name)
        boundaries.append((len(texts), len(texts) + len(dataset.queries)))
        texts.extend(dataset.queries[q] for q in sorted(dataset.queries))
    rng = np.random.default_rng(seed)
    chosen = [int(i) for lo, hi in boundaries for i in rng.choice(np.arange(lo, hi), groups // 2, replace=False)]
    trace = []
    for index in chosen:
        top = np.argsort(-(corpus.vectors @ corpus.query_vectors[index]))[:6]
        hits = [{"doc_id": corpus.documents[i].doc_id, "title": corpus.documents[i].title,
                 "text": corpus.documents[i].text} for i in top]
        trace.append((texts[index], hits[:4]))
        for _ in range(variants - 1):
            picked = rng.choice(6, 4, replace=False)
            trace.append((texts[index], [hits[i] for i in picked]))
    order = rng.permutation(len(trace))  # questions interleave, as they would in traffic
    return [trace[i] for i in order]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=8, help="distinct questions (default 8)")
    parser.add_argument("--variants", type=int, default=3, help="retrievals per question (default 3)")
    parser.add_argument("--tokens", type=int, default=64, help="answer tokens compared (default 64)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from serving.answer.generator import load_generator
    from serving.answer.passages import segment_chat
    from serving.answer.prompt import build_messages, passage_texts
    from serving.kvcache.client import KVClient

    trace = make_trace(args.groups, args.variants, args.seed)

    def fresh_generator() -> Any:
        return load_generator("smollm2", kv=KVClient([], local_budget_bytes=2 << 30), threads=args.threads)

    generator = fresh_generator()
    prompts = [segment_chat(generator.tokenizer, build_messages(q, hits), passage_texts(hits)) for q, hits in trace]
    unique = {tuple(s.ids) for p in prompts for s in p.segments if s.passage}
    lengths = [len(p.ids()) for p in prompts]
    print(f"trace: {len(trace)} requests, {args.groups} questions × {args.variants} retrievals, {len(unique)} distinct "
          f"passages, prompt {np.mean(lengths):.0f} tokens mean", flush=True)

    in_order: dict[str, Any] = {}
    for mode in ("prefix", "passage"):
        runner = fresh_generator()
        results = [runner.generate(p, max_new_tokens=1, kv_reuse=mode) for p in prompts]
        tokens = sum(r.prompt_tokens for r in results)
        in_order[mode] = {"hit_rate": sum(r.hit_tokens for r in results) / tokens,
                          "recomputed_share": sum(r.recomputed_tokens for r in results) / tokens,
                          "ttft": percentiles_ms([r.ttft_s for r in results])}
        print(f"[in order, {mode}] hit rate {in_order[mode]['hit_rate']:.1%}, TTFT p50 "
              f"{in_order[mode]['ttft']['p50_ms']:.0f} ms p99 {in_order[mode]['ttft']['p99_ms']:.0f} ms", flush=True)
        del runner

    for prompt in prompts:  # every passage cached before the curve
        generator.generate(prompt, max_new_tokens=1, kv_reuse="passage")
    full_runs = [generator.generate(p.ids(), max_new_tokens=args.tokens, use_cache=False) for p in prompts]
    curve: list[dict[str, Any]] = [{"fraction": "full prefill", "ttft": percentiles_ms([r.ttft_s for r in full_runs]),
                                    "exact_match": 1.0, "token_f1": 1.0, "rouge_l": 1.0}]
    print(f"[full prefill] TTFT p50 {curve[0]['ttft']['p50_ms']:.0f} ms", flush=True)
    for fraction in FRACTIONS:
        runs = [generator.generate(p, max_new_tokens=args.tokens, kv_reuse="passage", recompute_fraction=fraction)
                for p in prompts]
        pairs = [(r.token_ids[: args.tokens], f.token_ids[: args.tokens]) for r, f in zip(runs, full_runs, strict=True)]
        row = {"fraction": fraction, "ttft": percentiles_ms([r.ttft_s for r in runs]),
               "hit_rate": float(np.mean([r.hit_tokens / r.prompt_tokens for r in runs])),
               "recomputed_share": float(np.mean([r.recomputed_tokens / r.prompt_tokens for r in runs])),
               "exact_match": float(np.mean([a == b for a, b in pairs])),
               "token_f1": float(np.mean([token_f1(a, b) for a, b in pairs])),
               "rouge_l": float(np.mean([rouge_l(a, b) for a, b in pairs]))}
        row["ttft_speedup_p50"] = curve[0]["ttft"]["p50_ms"] / row["ttft"]["p50_ms"]
        curve.append(row)
        print(f"[fraction {fraction:.2f}] TTFT p50 {row['ttft']['p50_ms']:.0f} ms ({row['ttft_speedup_p50']:.2f}× "
              f"faster), exact {row['exact_match']:.2f}, F1 {row['token_f1']:.3f}, ROUGE-L {row['rouge_l']:.3f}",
              flush=True)

    print(f"\n{'fraction':<14} {'TTFT p50':>9} {'p99':>8} {'×full':>7} {'recomputed':>11} {'exact':>6} {'F1':>6} "
          f"{'ROUGE-L':>8}")
    for row in curve:
        name = row["fraction"] if isinstance(row["fraction"], str) else f"{row['fraction']:.0%}"
        speed = row.get("ttft_speedup_p50", 1.0)
        print(f"{name:<14} {row['ttft']['p50_ms']:>7.0f}ms {row['ttft']['p99_ms']:>6.0f}ms {speed:>6.2f}× "
              f"{row.get('recomputed_share', 1.0):>10.1%} {row['exact_match']:>6.2f} {row['token_f1']:>6.3f} "
              f"{row['rouge_l']:>8.3f}")
    print(f"\nin trace order from an empty cache: prefix reuse hit rate {in_order['prefix']['hit_rate']:.1%} "
          f"(TTFT p50 {in_order['prefix']['ttft']['p50_ms']:.0f} ms) vs passage reuse "
          f"{in_order['passage']['hit_rate']:.1%} (TTFT p50 {in_order['passage']['ttft']['p50_ms']:.0f} ms)")
    plotted = plot(curve)
    path = write_result("rag_passages", {
        "machine": machine_info(), "settings": vars(args), "requests": len(trace), "distinct_passages": len(unique),
        "prompt_tokens_mean": float(np.mean(lengths)), "in_trace_order": in_order, "curve": curve, "plot": plotted})
    print(f"written {path}")


def plot(curve: list[dict[str, Any]]) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plot", file=sys.stderr)
        return None
    rows = [r for r in curve if not isinstance(r["fraction"], str)]
    fractions = [r["fraction"] * 100 for r in rows]
    figure, left = plt.subplots(figsize=(7, 4))
    left.plot(fractions, [r["ttft"]["p50_ms"] for r in rows], "o-", color="tab:blue", label="TTFT p50 (passage reuse)")
    left.axhline(curve[0]["ttft"]["p50_ms"], color="tab:blue", linestyle="--", label="TTFT p50, full prefill")
    left.set_xlabel("recomputed share of reused tokens (%)")
    left.set_ylabel("TTFT p50 (ms)", color="tab:blue")
    right = left.twinx()
    right.plot(fractions, [r["token_f1"] for r in rows], "s-", color="tab:red", label="token F1 vs full prefill")
    right.plot(fractions, [r["exact_match"] for r in rows], "^:", color="tab:orange", label="exact 64-token match")
    right.set_ylim(0, 1.05)
    right.set_ylabel("agreement with full prefill", color="tab:red")
    lines = left.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    labels = left.get_legend_handles_labels()[1] + right.get_legend_handles_labels()[1]
    left.legend(lines, labels, loc="center right", fontsize=8)
    left.set_title(f"SmolLM2-135M, passage KV reuse (CacheBlend) — {time.strftime('%Y-%m-%d')}")
    figure.tight_layout()
    path = RESULTS / "rag_passages.png"
    figure.savefig(path, dpi=110)
    return str(path.name)


if __name__ == "__main__":
    main()
