"""The local launcher's answer path: kv-node processes (the shared KV cache) first, since the
generators are given their URLs, then the answer generator workers."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from serving.local.child import Child

logger = logging.getLogger(__name__)


def start_answer_path(kv_node_count: int, kv_node_budget_mb: float, generator_count: int, generator_model: str,
                      generator_args: tuple[str, ...], place: Callable[[str], tuple[str, list[str]]], python: str,
                      workdir: Path, env: dict[str, str], ready_timeout_s: float) -> tuple[list[Child], list[Child]]:
    """Start and wait for the kv-nodes, then the generators; returns (kv-nodes, generators). When
    one fails to start, the ones already started are stopped before the error goes up."""
    kv_nodes: list[Child] = []
    generators: list[Child] = []
    try:
        for index in range(kv_node_count):
            def kv_argv(port: int, name: str = f"kv-node-{index}") -> list[str]:
                address, prefix = place(name)
                return [*prefix, python, "-m", "serving", "kv-node", "--host", address, "--port", str(port),
                        "--budget-mb", str(kv_node_budget_mb)]

            child = Child(f"kv-node-{index}", kv_argv, workdir / f"kv-node-{index}.log")
            child.start(env)
            kv_nodes.append(child)
        deadline = time.monotonic() + ready_timeout_s
        for child in kv_nodes:
            child.wait_ready(deadline)
        # A restarted kv-node comes back on its old port, so these URLs stay valid.
        node_urls = ",".join(str(c.url) for c in kv_nodes)
        for index in range(generator_count):
            def gen_argv(port: int, name: str = f"generator-{index}") -> list[str]:
                address, prefix = place(name)
                return [*prefix, python, "-m", "serving", "generator", "--model", generator_model,
                        "--host", address, "--port", str(port), "--kv-nodes", node_urls, *generator_args]

            child = Child(f"generator-{index}", gen_argv, workdir / f"generator-{index}.log")
            child.start(env)
            generators.append(child)
        deadline = time.monotonic() + max(ready_timeout_s, 300.0)  # the first SmolLM2 load converts the GGUF
        for child in generators:
            child.wait_ready(deadline)
    except BaseException:
        for child in [*generators, *kv_nodes]:
            child.stop()
        raise
    if generators:
        logger.info("%d kv-nodes and %d generators ready", len(kv_nodes), len(generators))
    return kv_nodes, generators
