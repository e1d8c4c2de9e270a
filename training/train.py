"""The DDP training loop — what ``torchrun`` (or Ray Train, or a Kubernetes Indexed Job) runs:

    python -m torch.distributed.run --nproc-per-node 2 -m training.train --root R --collection C ...

One rank per slice: rank r trains on shard r of the collection (training.data). NCCL and bf16
autocast on CUDA (fp16 + GradScaler where the GPU has no bf16), gloo and fp32 on CPU
(training.precision; ``--amp`` overrides). One
forward per micro-step over queries and passages together; in-batch negatives gathered across
ranks (training.loss). Rank 0 alone logs (progress bar with loss and samples/s) and writes
checkpoints; every rank restores its own RNG state on resume, so a run restarted by
``torchrun --max-restarts`` ends where an uninterrupted one would.

Rendezvous comes from the environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT),
as torchrun and Kubernetes set it. Fault injection for tests and game days:
SHARDRAG_TRAIN_KILL_RANK and SHARDRAG_TRAIN_KILL_AT_STEP make that rank SIGKILL itself at that
step on the first attempt only; SHARDRAG_TRAIN_SLOW_RANK (and SHARDRAG_TRAIN_SLOW_S, default 0.5)
make that rank sleep in every micro-step's compute — a straggler, to see it reported.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import fields
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from retrieval import env
from retrieval.atomic import atomic_write_bytes
from training.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from training.config import TrainConfig
from training.data import SliceData
from training.loss import contrastive_loss
from training.metrics import TrainMetrics
from training.model import BiEncoder
from training.precision import resolve_precision
from training.stragglers import StragglerDetector, summarise_spread

logger = logging.getLogger("shardrag.train")


def _comm_hook(model: DistributedDataParallel, name: str) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if name == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif name == "bf16":
        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif name == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2)
        hook = powerSGD_hook.powerSGD_hook
        model.register_comm_hook(state, _one_bucket_at_a_time(hook) if dist.get_backend() == "gloo" else hook)


def _one_bucket_at_a_time(hook: Any) -> Any:
    """PowerSGD starts its P and Q all-reduces from callbacks of the bucket's first collective; on
    gloo those callbacks run on gloo's threads, so with several buckets the two ranks can issue
    bucket 1's collective and bucket 0's Q in different orders — a size mismatch that aborts the
    run (seen with MiniLM's 4 buckets). DDP calls the hook in bucket order on every rank, so
    finishing each bucket before returning keeps the order identical everywhere (CPU has no
    compute/communication overlap to lose)."""

    @functools.wraps(hook)  # DDP checks the hook's signature: it follows __wrapped__ to PowerSGD's
    def serialised(state: Any, bucket: Any) -> Any:
        future = hook(state, bucket)
        future.wait()
        return future

    return serialised


def _optimizer(model: BiEncoder, config: TrainConfig) -> tuple[torch.optim.Optimizer, Any]:
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, parameter in model.named_parameters():
        (no_decay if parameter.ndim < 2 or "LayerNorm" in name else decay).append(parameter)
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=config.lr)

    def schedule(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        return max(0.0, (config.max_steps - step) / max(1, config.max_steps - config.warmup_steps))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def _grad_checksum(model: torch.nn.Module) -> float:
    return float(sum(p.grad.double().abs().sum() for p in model.parameters() if p.grad is not None))


def _init_process_group(backend: str) -> None:
    """Join the group from the environment. Under torchrun the workers share the agent's store,
    which outlives a restart: namespace it by restart attempt, or a restarted rank reads the dead
    rank's old address and the new group never connects."""
    timeout = timedelta(seconds=300)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),  # type: ignore[attr-defined]
                              int(os.environ["WORLD_SIZE"]), is_master=False, timeout=timeout)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        prefixed = dist.PrefixStore(f"shardrag/attempt-{attempt}", store)  # type: ignore[attr-defined]
        dist.init_process_group(backend, store=prefixed,
                                rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                                timeout=timeout)
    else:
        dist.init_process_group(backend, timeout=timeout)


def _synthetic_pairs(config: TrainConfig, data: SliceData, model: BiEncoder, device: torch.device, rank: int,
                     master: bool) -> dict[str, Any]:
    """Each rank writes queries for its own slice's passages (cached), keeps those that pass the
    round trip with the initial encoder, and trains on them."""
    import random

    from retrieval.embedding_cache import default_cache_dir
    from training.data import Pair
    from training.model import encode_texts
    from training.synthetic_queries import QueryGenerator, describe, round_trip

    started = time.perf_counter()
    documents = list(data.documents)
    if config.synthetic_max and len(documents) > config.synthetic_max:
        documents = random.Random(f"{config.seed}/synthetic/{rank}").sample(documents, config.synthetic_max)
    passages = [f"{d.title} {d.text}" if d.title else d.text for d in documents]
    cache = Path(config.synthetic_cache) if config.synthetic_cache else default_cache_dir().parent
    generator = QueryGenerator(str(config.synthetic_queries), cache_dir=cache)
    written = generator.queries(passages, progress=master)
    generate_s = time.perf_counter() - started
    del generator.model  # free it before training
    rows = [i for i, q in enumerate(written) if q]
    slice_passages = [f"{d.title} {d.text}" if d.title else d.text for d in data.documents]
    row_of = {d.doc_id: i for i, d in enumerate(data.documents)}
    vectors = encode_texts(model, slice_passages, device)
    keep = round_trip([str(written[i]) for i in rows], [row_of[documents[i].doc_id] for i in rows], vectors,
                      lambda texts: encode_texts(model, texts, device), config.round_trip_k)
    pairs = [Pair(str(written[i]), passages[i], documents[i].doc_id) for i, ok in zip(rows, keep) if ok]
    data.use_pairs(pairs)
    report = {**describe(generator), "passages": len(passages), "written": len(rows), "kept": len(pairs),
              "generate_s": round(generate_s, 2), "total_s": round(time.perf_counter() - started, 2)}
    logger.warning("rank %d: %d synthetic queries for %d passages, %d kept by the round trip (top-%d)", rank,
                   len(rows), len(passages), len(pairs), config.round_trip_k)
    return report


def run(config: TrainConfig) -> dict[str, Any]:
    """Train; returns rank 0's summary (other ranks return theirs without the export)."""
    config.validate()
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1 or dist.is_initialized()
    if distributed and not dist.is_initialized():
        _init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    master = rank == 0
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        torch.set_num_threads(config.threads or max(1, (os.cpu_count() or 1) // max(1, local_world)))
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(config.seed + rank)

    data = SliceData(config.root, config.collection, rank, world, version=config.version, seed=config.seed,
                     crop=(config.crop_min, config.crop_max), train_queries=config.train_queries,
                     train_qrels=config.train_qrels)
    raw_model = BiEncoder.from_checkpoint(config.model, scale=config.scale, learn_scale=config.learn_scale,
                                          max_length=config.max_length).to(device)
    synthetic = _synthetic_pairs(config, data, raw_model, device, rank, master) if config.synthetic_queries else None
    optimizer, scheduler = _optimizer(raw_model, config)
    start_step = 0
    history: dict[str, list[Any]] = {"loss": [], "step_s": []}
    checkpoint = load_checkpoint(out)
    if checkpoint is not None:
        raw_model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        start_step = int(checkpoint["step"])
        history = checkpoint.get("history", history)
        set_rng_state(checkpoint["rng"][rank])
        if master:
            logger.warning("resumed from %s at step %d", out / "checkpoint.pt", start_step)
    model: torch.nn.Module = raw_model
    if distributed:
        model = DistributedDataParallel(raw_model, device_ids=[local_rank] if device.type == "cuda" else None,
                                        bucket_cap_mb=config.bucket_cap_mb)
        _comm_hook(model, config.comm_hook)

    precision = resolve_precision(config.amp, device)
    scaler = precision.scaler
    stragglers = StragglerDetector(world, factor=config.straggler_factor, window=config.straggler_window)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    kill_rank = env.read("SHARDRAG_TRAIN_KILL_RANK")
    kill_step = int(env.read("SHARDRAG_TRAIN_KILL_AT_STEP", "-1") or -1)
    slow_rank = int(env.read("SHARDRAG_TRAIN_SLOW_RANK", "-1") or -1)
    slow_s = float(env.read("SHARDRAG_TRAIN_SLOW_S", "0.5") or 0.5)
    diagnostics: dict[str, Any] = {"rank": rank, "world": world, "shard_dir": str(data.shard_directory),
                                   "slice_docs": len(data.documents), "doc_ids": set(), "global_batch": [],
                                   "grad_checksums": [], "losses": [], "start_step": start_step, "restart": restart}
    miner: Any = None
    if config.hard_negatives_url:
        from training.hard_negatives import HardNegativeMiner

        miner = HardNegativeMiner(config.hard_negatives_url, refresh_every=config.hard_negatives_every)
    elif config.refresh_every:
        from training.slice_negatives import SliceNegatives

        miner = SliceNegatives(data.documents, raw_model, device, refresh_every=config.refresh_every,
                               depth=config.negatives_depth, rank=rank, world=world, record=config.diagnostics)
    metrics = TrainMetrics(rank) if master else None
    from tqdm.auto import tqdm

    progress = tqdm(total=config.max_steps, initial=start_step, desc="training", unit="step", disable=not master)
    model.train()
    per_step_samples = config.batch_size * config.grad_accum * world
    for step in range(start_step, config.max_steps):
        if kill_rank is not None and int(kill_rank) == rank and step == kill_step and restart == 0:
            logger.warning("fault injection: rank %d kills itself at step %d", rank, step)
            os.kill(os.getpid(), signal.SIGKILL)
        started = time.perf_counter()
        local_s = 0.0
        loss_value = torch.zeros((), device=device)
        for micro in range(config.grad_accum):
            batch = data.batch(step * config.grad_accum + micro, config.batch_size)
            if config.diagnostics:
                diagnostics["doc_ids"].update(pair.doc_id for pair in batch)
            texts = [p.query for p in batch] + [p.passage for p in batch]
            if miner is not None:
                mined = miner.negatives(step, batch)
                # where the index gave nothing usable, a random passage of the slice stands in
                fallback = data.random_passages(f"{step}/{micro}", len(batch))
                texts += [negative or other for negative, other in zip(mined, fallback)]
            tokens: dict[str, Any] = raw_model.tokenize(texts, device)
            # (DDP.no_sync: the module's __getattr__ hides it from mypy)
            sync = model.no_sync() if distributed and micro < config.grad_accum - 1 else nullcontext()  # type: ignore[operator]
            with sync:
                micro_started = time.perf_counter()
                with precision.autocast():
                    embeddings = model(**tokens)  # one forward over queries and passages
                if slow_rank == rank:
                    time.sleep(slow_s)  # fault injection: this rank computes slower
                local_s += time.perf_counter() - micro_started  # before any collective: this rank's own speed
                n = len(batch)
                queries, passages = embeddings[:n], embeddings[n:2 * n]
                negatives = embeddings[2 * n:] if miner is not None else None
                loss, value, global_batch = contrastive_loss(queries, passages, raw_model.scale,
                                                             gather=config.gather_negatives, negatives=negatives)
                loss = loss / config.grad_accum
                (scaler.scale(loss) if scaler else loss).backward()
                loss_value += value / config.grad_accum
        if config.diagnostics:
            diagnostics["global_batch"].append(global_batch)
            diagnostics["grad_checksums"].append(_grad_checksum(raw_model))
        if scaler:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(raw_model.parameters(), 1.0)
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if distributed:
            # NCCL only moves CUDA tensors: the step times travel on the training device
            times = [torch.zeros(1, device=device) for _ in range(world)]
            dist.all_gather(times, torch.tensor([local_s], device=device))
            rank_times = [float(t) for t in times]
            reduced = loss_value.detach().clone()
            dist.all_reduce(reduced)
            loss_global = float(reduced) / world
        else:
            rank_times, loss_global = [local_s], float(loss_value)
        slow = stragglers.record(rank_times)
        if metrics is not None:
            metrics.observe(step + 1, loss_global, rank_times, per_step_samples / (time.perf_counter() - started), slow)
        if slow and master:
            means = stragglers.means_s()
            logger.warning("straggler ranks %s: mean local step %s s over %d steps (all ranks: %s s)", slow,
                           [round(means[r], 3) for r in slow], config.straggler_window, [round(m, 3) for m in means])
            history.setdefault("stragglers", []).append({"step": step, "ranks": slow})
        step_s = time.perf_counter() - started
        history["loss"].append(loss_global)
        history["step_s"].append(step_s)
        history.setdefault("rank_local_s", []).append(rank_times)
        diagnostics["losses"].append(loss_global)
        if master and (step + 1) % config.log_every == 0:
            progress.set_postfix(loss=f"{loss_global:.4f}", samples_s=f"{per_step_samples / step_s:.1f}")
        progress.update(1)
        done = step + 1
        if done % config.checkpoint_every == 0 or done == config.max_steps:
            rngs: list[Any] = [None] * world
            if distributed:
                dist.all_gather_object(rngs, rng_state())
            else:
                rngs = [rng_state()]
            if master:
                if metrics is not None:
                    metrics.write(out)
                save_checkpoint(out, {"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                                      "scheduler": scheduler.state_dict(), "step": done, "rng": rngs,
                                      "history": history, "config": config.to_dict(),
                                      "base_version": data.version.id})
            if distributed:
                dist.barrier()
    progress.close()
    summary: dict[str, Any] = {"rank": rank, "world": world, "steps": config.max_steps, "start_step": start_step,
                               "base_version": data.version.id, "loss_first": history["loss"][0] if history["loss"]
                               else None, "loss_last": history["loss"][-1] if history["loss"] else None,
                               "samples_per_step": per_step_samples, "history": history,
                               "device": str(device), "backend": dist.get_backend() if distributed else None,
                               "precision": precision.name, "comm_hook": config.comm_hook if distributed else None,
                               "rank_spread": summarise_spread(history.get("rank_local_s", []),
                                                               len(history.get("stragglers", [])))}
    if synthetic is not None:
        diagnostics["synthetic"] = synthetic
        summary["synthetic"] = synthetic  # rank 0's; every rank's in its diagnostics
    if miner is not None:
        diagnostics["hard_negatives"] = {"mined": miner.mined, "failures": miner.failures}
        summary["hard_negatives"] = dict(diagnostics["hard_negatives"])
        if config.refresh_every:
            diagnostics["refreshes"] = miner.refreshes
            diagnostics["negative_pairs"] = miner.pairs
            summary["hard_negatives"]["refreshes"] = [{k: v for k, v in r.items() if k != "doc_ids"}
                                                      for r in miner.refreshes]
        miner.close()
    if config.diagnostics:
        diagnostics["doc_ids"] = sorted(diagnostics["doc_ids"])
        (out / f"diagnostics-rank{rank}.json").write_text(json.dumps(diagnostics))
    if master:
        if config.export:
            from training.export import export_encoder

            version = export_encoder(raw_model, config.model, out, config.export_name)
            summary["exported"] = {"path": str(out / config.export_name), "version": version.id}
            logger.warning("exported %s as embedding version %s", out / config.export_name, version.id)
        atomic_write_bytes(out / "summary.json", json.dumps(summary, indent=1).encode())
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return summary


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m training.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for field in fields(TrainConfig):
        flag = "--" + field.name.replace("_", "-")
        if field.type in ("bool", bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=field.default)
        else:
            kind = {"int": int, "float": float}.get(str(field.type), str)
            required = field.name in ("root", "collection")
            parser.add_argument(flag, type=kind, default=None if required else field.default, required=required)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = vars(build_parser().parse_args(argv))
    config = TrainConfig(**args)
    summary = run(config)
    if summary.get("exported"):
        print(json.dumps({"exported": summary["exported"], "loss_first": summary["loss_first"],
                          "loss_last": summary["loss_last"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
