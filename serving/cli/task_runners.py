"""Where `shardrag tune`'s shard tasks run: spawned worker processes on this machine, or Ray tasks
on a cluster — each with a progress bar over the tasks (a ``--rebuild`` runs shards × structures)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from typing import Any

from retrieval.errors import ConfigError

Runner = Callable[[Callable[..., Any], Sequence[tuple[Any, ...]]], list[Any]]


def _progress(total: int, what: str) -> Any:
    """A progress bar on stderr for ``total`` shard tasks (a --rebuild runs shards × structures)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=what, unit="task", disable=total < 2, file=sys.stderr)


def local_runner(workers: int) -> Runner:
    """Each call's argument tuples run in ``workers`` spawned processes (fresh FAISS, no forked locks)."""
    def run(function: Callable[..., Any], calls: Sequence[tuple[Any, ...]]) -> list[Any]:
        workers_used = max(1, min(workers, len(calls)))
        with ProcessPoolExecutor(max_workers=workers_used, mp_context=get_context("spawn")) as pool, \
                _progress(len(calls), function.__name__.replace("_", " ")) as bar:
            futures = [pool.submit(function, *call) for call in calls]
            for _ in as_completed(futures):
                bar.update()
            return [future.result() for future in futures]
    return run


def ray_runner(address: str | None) -> Runner:
    """Each call is a Ray task of one CPU, on the cluster at ``address`` (default: a local Ray)."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError("--backend ray needs Ray: pip install 'shardrag[ray]'", field="backend") from exc
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)

    def run(function: Callable[..., Any], calls: Sequence[tuple[Any, ...]]) -> list[Any]:
        remote = ray.remote(num_cpus=1)(function)
        refs = [remote.remote(*call) for call in calls]
        with _progress(len(refs), function.__name__.replace("_", " ")) as bar:
            pending = list(refs)
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                bar.update(len(done))
        return list(ray.get(refs))
    return run
