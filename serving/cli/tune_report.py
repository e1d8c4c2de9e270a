"""What ``shardrag tune`` prints and plots: a knob's candidates (``print_report``), the structures
``--rebuild`` compared (``print_structures``), recall against QPS as a PNG (``plot_frontier``),
and the pieces of the build it suggests when another structure wins (``best_of``, ``breadth_flag``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from index_shards.tuning import StructureReport
from retrieval.tuning_choice import TuneReport


def print_structures(reports: list[StructureReport], best: StructureReport | None) -> None:
    print(f"\n{'structure':22} {'build s':>8} {'index MiB':>10} {'knob':>14} {'recall@k':>9} {'95% low':>8} "
          f"{'held-out':>8} {'QPS(c=1)':>9}")
    for structure in reports:
        report, chosen = structure.report, structure.report.chosen
        build = f"{structure.build_s:8.1f}" if structure.build_s else f"{'(built)':>8}"
        if not report.candidates:  # every value of its knob is above --max-value
            print(f"{structure.label:22} {build} {structure.index_bytes / 2**20:10.1f} "
                  f"{'(over --max-value)':>14}")
            continue
        shown = chosen or max(report.candidates, key=lambda c: c.recall)  # the best it did, when it missed
        knob = f"{report.knob}={shown.value}" if report.knob else "exact"
        held = f"{shown.holdout_recall:8.4f}" if shown.holdout_recall is not None else f"{'-':>8}"
        mark = "  <- chosen" if structure is best else ("" if chosen else "  (misses the target)")
        print(f"{structure.label:22} {build} {structure.index_bytes / 2**20:10.1f} {knob:>14} {shown.recall:9.4f} "
              f"{shown.recall_low:8.4f} {held} {shown.qps:9.0f}{mark}")
    print("\nper structure: the cheapest knob value that meets the target (or its best, when none does); build s "
          "on one core, the slowest shard; QPS one query at a time, the slowest shard's rate; efC N: an HNSW "
          "graph linked with ef_construction N (a wider build is chosen only where it needs a smaller knob value "
          "than the narrower one)")


def print_report(report: TuneReport) -> None:
    if report.knob is None:
        print(f"{report.factory} is an exact index: there is nothing to tune (recall is 1.0 at any setting).")
        return
    print(f"\n{report.knob:>9}  recall@{report.k}  95% low  held-out   QPS(c=1)  pareto")
    for c in report.candidates:
        mark = "  <- chosen" if report.chosen and c.value == report.chosen.value else ""
        held = f"{c.holdout_recall:8.4f}" if c.holdout_recall is not None else "       -"
        print(f"{c.value:>9}  {c.recall:9.4f}  {c.recall_low:7.4f}  {held}  {c.qps:9.0f}  "
              f"{'yes' if c.pareto else '':>6}{mark}")
    print(f"\n{report.tune_queries} tuning queries, {report.holdout_queries} held out; QPS: one query at a time "
          "on one core, the slowest shard's rate (a fan-out waits for it)")
    if report.lossy:
        print(f"note: {report.factory} stores compressed codes; recall is measured against the decoded vectors "
              "(the probe's recall), not the original embeddings")


def plot_frontier(report: TuneReport, path: Path, others: Sequence[TuneReport] = (),
                  labels: Sequence[str] = ()) -> bool:
    """Recall vs QPS as a PNG (needs matplotlib: pip install 'shardrag[bench]'); ``others``: more
    structures' curves on the same axes (``--rebuild``), ``labels`` naming ``report`` then each of
    them (default: their factories)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = list(labels) if labels else [r.factory for r in (report, *others)]
    fig, ax = plt.subplots(figsize=(6, 4))
    for other, name in zip(others, names[1:], strict=True):
        ax.plot([c.qps for c in other.candidates], [c.recall for c in other.candidates], ".--", alpha=0.7,
                label=name)
    ax.plot([c.qps for c in report.candidates], [c.recall for c in report.candidates], "o-",
            label=names[0] if others else "candidates")
    for c in report.candidates:
        ax.annotate(str(c.value), (c.qps, c.recall), fontsize=7, textcoords="offset points", xytext=(3, 3))
    if report.chosen:
        ax.plot([report.chosen.qps], [report.chosen.recall], "r*", markersize=14, label=f"chosen {report.knob}")
    ax.axhline(report.target, color="grey", linestyle="--", label=f"target {report.target}")
    ax.set_xscale("log")
    ax.set_xlabel("QPS, one query at a time (slowest shard)")
    ax.set_ylabel(f"recall@{report.k}")
    ax.set_title(f"{report.factory}: {report.knob}" if not others else "structures × knob (--rebuild)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def breadth_flag(ef_construction: int | None) -> str:
    """The build flag for a chosen structure's HNSW breadth (``--factory`` alone builds a graph
    with FAISS's 40; None: that is the breadth it was tuned with)."""
    return f" --ef-construction {ef_construction}" if ef_construction is not None else ""


def best_of(structure: StructureReport) -> str:
    chosen = structure.report.chosen
    if chosen is None:
        return "misses the target"
    return f"{chosen.qps:.0f} QPS" + (f" at {structure.report.knob}={chosen.value}" if structure.report.knob else "")
