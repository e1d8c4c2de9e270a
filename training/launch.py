"""Launchers: torchrun (one process per slice on this machine; ``--standalone``: a rendezvous
store torchrun binds on a free port itself; ``--max-restarts`` for fault tolerance; across hosts,
:class:`Nodes`: every host runs ``shardrag train --nnodes N --node-rank R --master-addr A`` and
torchrun's static rendezvous at the master joins them, with gloo/NCCL bound to the interface that
reaches the master) and Ray Train (``TorchTrainer`` with one worker per slice, GPUs when the cluster has them).
A Kubernetes Indexed Job runs ``python -m torch.distributed.run ... -m training.train`` itself
with the rendezvous from its environment; nothing here is needed there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retrieval.errors import ConfigError
from training.config import TrainConfig


def config_args(config: TrainConfig) -> list[str]:
    """The flags of ``python -m training.train`` that reproduce ``config``."""
    args = []
    for name, value in config.to_dict().items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + name.replace("_", "-"))
        elif value is not None:
            args += [flag, str(value)]
    return args


@dataclass(frozen=True, slots=True)
class Nodes:
    """This host's place in a job across ``count`` hosts (ranks: node_rank × nproc + local rank)."""

    count: int
    rank: int
    master_addr: str
    master_port: int = 29500

    def validate(self) -> Nodes:
        if self.count < 1 or not 0 <= self.rank < self.count:
            raise ConfigError(f"--node-rank must be in 0..{self.count - 1}, got {self.rank}", field="node_rank")
        if self.count > 1 and not self.master_addr:
            raise ConfigError("a job across hosts needs --master-addr (node 0's address)", field="master_addr")
        return self


def torchrun_command(config: TrainConfig, nproc: int, *, max_restarts: int = 3, nodes: Nodes | None = None
                     ) -> list[str]:
    where = ["--nnodes=1", "--standalone"] if nodes is None or nodes.count == 1 else [
        f"--nnodes={nodes.count}", f"--node-rank={nodes.rank}", f"--master-addr={nodes.master_addr}",
        f"--master-port={nodes.master_port}"]
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", *where,
            f"--max-restarts={max_restarts}", "--monitor-interval=0.5",
            # the ranks' log folders in the run directory (torchrun's default: a new /tmp folder per run, never removed)
            f"--log-dir={Path(config.out) / 'torchrun-logs'}", "-m", "training.train", *config_args(config)]


def interface_towards(address: str) -> str | None:
    """The network interface this host reaches ``address`` through (``ip route get``), so gloo and
    NCCL bind it rather than whatever the host name resolves to (hosts that share a name — network
    namespaces, containers — would all resolve to one address)."""
    try:
        route = subprocess.run(["ip", "-o", "route", "get", address], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = route.stdout.split()
    return words[words.index("dev") + 1] if "dev" in words[:-1] else None


def _die_with_parent() -> None:
    """In the torchrun child, before exec: SIGTERM it when the launching process dies (Linux), so
    a ``shardrag train`` killed with SIGKILL takes its training job down (torchrun stops its
    workers on SIGTERM) instead of leaving an orphan that the re-run would race."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def launch_local(config: TrainConfig, nproc: int, *, max_restarts: int = 3, env: dict[str, str] | None = None,
                 capture: bool = False, nodes: Nodes | None = None) -> subprocess.CompletedProcess[str]:
    """Run the job (this host's part of it, with ``nodes``) under torchrun and wait for it. Raises
    when it fails after its restarts."""
    command = torchrun_command(config.validate(), nproc, max_restarts=max_restarts,
                               nodes=nodes.validate() if nodes else None)
    run_env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **(env or {})}
    if nodes is not None and nodes.count > 1 and (interface := interface_towards(nodes.master_addr)):
        run_env.setdefault("GLOO_SOCKET_IFNAME", interface)
        run_env.setdefault("NCCL_SOCKET_IFNAME", interface)
    result = subprocess.run(command, env=run_env, text=True, capture_output=capture, preexec_fn=_die_with_parent)
    if result.returncode != 0:
        tail = (result.stderr or "")[-3000:] if capture else ""
        raise RuntimeError(f"training failed (exit {result.returncode}) after up to {max_restarts} restarts\n{tail}")
    return result


def launch_ray(config: TrainConfig, nproc: int, *, address: str | None = None) -> dict[str, Any]:
    """Run the same training loop as Ray Train workers (one per slice)."""
    try:
        import ray
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer
    except ImportError as exc:
        raise ConfigError("--backend ray needs Ray Train: pip install -e '.[ray]'", field="backend") from exc
    import torch

    def worker(payload: dict[str, Any]) -> None:
        from training.train import run  # inside the worker process; Ray set up torch.distributed

        run(TrainConfig.from_dict(payload))

    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, include_dashboard=False)
    trainer = TorchTrainer(worker, train_loop_config=config.validate().to_dict(),
                           scaling_config=ScalingConfig(num_workers=nproc, use_gpu=torch.cuda.is_available()),
                           run_config=RunConfig(storage_path=os.path.abspath(os.path.join(config.out, "ray")),
                                                name="shardrag-train"))
    result = trainer.fit()
    summary_path = os.path.join(config.out, "summary.json")
    summary = json.loads(open(summary_path).read()) if os.path.exists(summary_path) else {}
    return {"ray_result": str(result), **summary}
