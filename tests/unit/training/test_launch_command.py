"""The torchrun command the local launcher runs."""

from __future__ import annotations

from pathlib import Path

from training.config import TrainConfig
from training.launch import Nodes, torchrun_command


def test_torchrun_keeps_its_rank_logs_in_the_run_directory(tmp_path):
    out = tmp_path / "run"
    command = torchrun_command(TrainConfig(root=str(tmp_path), collection="c", out=str(out)), 2)
    assert f"--log-dir={out / 'torchrun-logs'}" in command  # torchrun's default: a new /tmp folder per run
    assert command[command.index("-m", 2) + 1] == "training.train"  # the flags before it are torchrun's
    assert "--standalone" in command and "--nproc-per-node=2" in command


def test_a_job_across_hosts_names_its_master_and_this_hosts_rank():
    command = torchrun_command(TrainConfig(root="r", collection="c"), 1, nodes=Nodes(2, 1, "10.0.0.1", 29600))
    assert {"--nnodes=2", "--node-rank=1", "--master-addr=10.0.0.1", "--master-port=29600"} <= set(command)
    assert f"--log-dir={Path('train-out') / 'torchrun-logs'}" in command
