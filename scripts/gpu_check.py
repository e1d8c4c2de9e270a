"""One-shot GPU check of the CUDA code paths (run on a machine with a GPU; CI never needs it).

    python scripts/gpu_check.py --tiny DIR --docs corpus.jsonl [--out results.json]

Checks, each reported as ok/failed with figures:
  encoder   SentenceTransformerEncoder picks CUDA on its own and matches the CPU vectors
  faiss     whether this FAISS has GPUs; a built shard loads with device=auto either way
  training  one NCCL rank (DDP, world 1) with bf16 autocast trains, loss falls, exports a version
  generator the tiny Llama on CUDA: greedy output with the KV cache equals output without it
DIR is a tiny sentence-transformers checkpoint (training.model.make_tiny_checkpoint).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from retrieval.types import EmbeddingVersion  # noqa: E402


def check_encoder(tiny: Path) -> dict[str, Any]:
    from retrieval.encoders import SentenceTransformerEncoder

    texts = ["how do I open a file", "the sun is a star", "gradient descent"] * 20
    gpu = SentenceTransformerEncoder(tiny)
    cpu = SentenceTransformerEncoder(tiny, device="cpu")
    a, b = gpu.encode_queries(texts), cpu.encode_queries(texts)
    return {"device": str(gpu.device), "max_abs_diff_vs_cpu": float(np.abs(a - b).max()),
            "ok": "cuda" in str(gpu.device) and np.allclose(a, b, atol=1e-3)}


def build_slices(root: Path, docs: Path) -> None:
    from index_shards.build import BuildConfig, build_collection
    from retrieval.datasets import load_documents

    documents = load_documents(docs)
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((len(documents), 32)).astype(np.float32)  # training reads text, not vectors
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    build_collection(root, documents, vectors, EmbeddingVersion("synthetic", "0" * 64, 32),
                     BuildConfig("gpu", 1), show_progress=False)  # one slice: one GPU, one NCCL rank


def check_faiss(root: Path) -> dict[str, Any]:
    import faiss

    from index_shards.layout import resolve_version, shard_dir
    from index_shards.shard import Shard

    version_dir, _ = resolve_version(root, "gpu", None)
    shard = Shard.load(shard_dir(version_dir, 0), device="auto")
    gpus = getattr(faiss, "get_num_gpus", lambda: 0)()
    return {"faiss_version": faiss.__version__, "faiss_gpus": gpus, "shard_loaded": True,
            "note": "faiss-cpu here: the shard fell back to CPU" if gpus == 0 else "index on GPU",
            "ok": True, "shard": repr(shard)[:120]}


def check_training(root: Path, tiny: Path, out: Path) -> dict[str, Any]:
    import torch.distributed as dist

    from training.config import TrainConfig
    from training.train import run

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("nccl", rank=0, world_size=1)
    started = time.perf_counter()
    summary = run(TrainConfig(root=str(root), collection="gpu", model=str(tiny), out=str(out), max_steps=60,
                              batch_size=32, lr=1e-3, warmup_steps=5, checkpoint_every=10, export_name="tiny-gpu"))
    losses = summary["history"]["loss"]
    return {"device": summary["device"], "backend": summary["backend"], "precision": summary["precision"],
            "loss_first": losses[0], "loss_last": losses[-1], "seconds": time.perf_counter() - started,
            "exported": summary["exported"]["version"],
            "loss_first5": float(np.mean(losses[:5])), "loss_last5": float(np.mean(losses[-5:])),
            "ok": bool(summary["backend"] == "nccl" and summary["precision"] == "bf16"
                       and np.mean(losses[-5:]) < np.mean(losses[:5]))}


def check_generator() -> dict[str, Any]:
    from serving.answer.generator import load_generator
    from serving.kvcache.client import KVClient

    plain = load_generator("tiny:1")
    cached = load_generator("tiny:1", kv=KVClient([], local_budget_bytes=64 << 20))
    prompt = np.random.default_rng(0).integers(0, 256, 150).tolist()
    reference = plain.generate(prompt, max_new_tokens=24, keep_logits=True)
    cached.generate(prompt, max_new_tokens=1)
    warm = cached.generate(prompt, max_new_tokens=24, keep_logits=True)
    diff = float((warm.first_logits - reference.first_logits).abs().max())
    return {"device": str(plain.device), "hit_tokens": warm.hit_tokens,
            "same_tokens": warm.token_ids == reference.token_ids,
            "max_logit_diff": diff, "ok": plain.device.type == "cuda" and warm.hit_tokens > 0
            and warm.token_ids == reference.token_ids and diff < 1e-3}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", type=Path, required=True)
    parser.add_argument("--docs", type=Path, required=True, help="JSONL corpus (a few hundred passages)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    report: dict[str, Any] = {"cuda": torch.cuda.is_available(),
                              "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                              "torch": torch.__version__,
                              "bf16": torch.cuda.is_available() and torch.cuda.is_bf16_supported()}
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    checks: dict[str, Callable[[], dict[str, Any]]] = {
        "encoder": lambda: check_encoder(args.tiny),
        "faiss": lambda: (build_slices(work / "root", args.docs), check_faiss(work / "root"))[1],
        "generator": check_generator,
        "training": lambda: check_training(work / "root", args.tiny, work / "train"),
    }
    for name, check in checks.items():
        try:
            report[name] = check()
        except Exception as exc:  # noqa: BLE001 - report every check
            report[name] = {"ok": False, "error": f"{exc!r}", "trace": traceback.format_exc()[-1500:]}
        print(name, json.dumps(report[name], default=str), flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1, default=str))
    return 0 if all(report[n].get("ok") for n in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
