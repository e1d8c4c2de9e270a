"""The shardrag command as a user runs it: build, serve (Ctrl-C stops everything), query, demo."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from httpkit.serve import parse_ready_line
from tests.conftest import data_dir

pytestmark = pytest.mark.slow
SHARDRAG = [sys.executable, "-m", "serving"]


def run(args, **kwargs):
    return subprocess.run(SHARDRAG + args, capture_output=True, text=True, timeout=600, **kwargs)


def test_help_explains_every_command():
    result = run(["--help"])
    assert result.returncode == 0
    commands = ("demo", "build", "serve", "query", "gateway", "rollout", "train", "eval")
    for command in commands:
        assert command in result.stdout
    for command in commands:
        helped = run([command, "--help"])
        assert helped.returncode == 0 and f"shardrag {command}" in helped.stdout


def test_build_serve_query_and_ctrl_c(tmp_path):
    root = tmp_path / "root"
    built = run(["build", "--corpus", str(data_dir() / "msmarco"), "--root", str(root), "--shards", "2",
                 "--partitioner", "kmeans", "--max-docs", "400", "--collection", "mini"])
    assert built.returncode == 0, built.stderr
    summary = json.loads(built.stdout)
    assert summary["count"] == 400 and summary["shards"] == 2
    assert (Path(summary["path"]) / "collection.json").exists()

    bad = run(["build", "--corpus", str(tmp_path / "missing.jsonl"), "--root", str(root)])
    assert bad.returncode == 2 and "does not exist" in bad.stderr
    graph = run(["build", "--corpus", str(data_dir() / "msmarco"), "--root", str(root), "--shards", "1",
                 "--max-docs", "60", "--collection", "graph", "--factory", "HNSW16", "--ef-construction", "48"])
    assert graph.returncode == 0, graph.stderr
    graph_dir = Path(json.loads(graph.stdout)["path"])
    assert json.loads((graph_dir / "shard-0" / "manifest.json").read_text())["ef_construction"] == 48
    narrow = run(["build", "--corpus", str(data_dir() / "msmarco"), "--root", str(root), "--collection", "narrow",
                  "--factory", "HNSW16", "--ef-construction", "2"])
    assert narrow.returncode == 2 and "ef_construction must be between 4 and 4096" in narrow.stderr

    busy = socket.socket()  # a port someone else holds: the gateway must take another one
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    busy_port = busy.getsockname()[1]
    workdir = tmp_path / "work"
    serve = subprocess.Popen(SHARDRAG + ["serve", "--collection", "mini", "--root", str(root), "--replicas", "1",
                                         "--port", str(busy_port), "--workdir", str(workdir)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        banner = ""
        while "Ctrl-C" not in banner:
            line = serve.stdout.readline()
            assert line or serve.poll() is None, serve.stderr.read()
            banner += line
            assert time.monotonic() < deadline, banner
        port = int(re.search(r"shardrag is up: http://127\.0\.0\.1:(\d+)", banner).group(1))
        assert port != busy_port and "curl" in banner
        read_key = re.search(r"^\s+read\s+(\S+)$", banner, flags=re.M).group(1)  # keys are on by default
        assert (workdir / "api-keys").stat().st_mode & 0o077 == 0  # the key file is private

        anonymous = run(["query", "--url", f"http://127.0.0.1:{port}", "what is the temperature scale"])
        assert anonymous.returncode != 0 and "API key" in anonymous.stderr
        key = ["--api-key", read_key]
        asked = run(["query", "--url", f"http://127.0.0.1:{port}", "what is the temperature scale", "-k", "3", *key])
        assert asked.returncode == 0, asked.stderr
        assert "3 hits" in asked.stdout and "2/2 shards" in asked.stdout
        raw = run(["query", "--url", f"http://127.0.0.1:{port}", "--json", "fahrenheit", "--top-m", "1", *key])
        assert json.loads(raw.stdout)["diagnostics"]["shards_queried"] == 1
        refused = run(["query", "--url", f"http://127.0.0.1:{port}", "x", "-k", "0", *key])
        assert refused.returncode == 2 and "error: k:" in refused.stderr
        # lexical: the line names the terms searched (stemmed, stop words dropped); a fusion without
        # --mode hybrid is refused, naming it
        lexical = run(["query", "--url", f"http://127.0.0.1:{port}", "the temperatures", "--mode", "lexical", *key])
        assert lexical.returncode == 0 and "lexical, terms: temperatur)" in lexical.stdout, lexical.stdout
        unfused = run(["query", "--url", f"http://127.0.0.1:{port}", "x", "--fusion", "rrf", *key])
        assert unfused.returncode == 2 and "error: fusion" in unfused.stderr and "hybrid" in unfused.stderr
        for log in workdir.glob("*.log"):  # keys never reach a log
            assert read_key not in log.read_text()

        # README's game-day recipe, as written, on this `shardrag serve`
        admin_key = re.search(r"^\s+admin\s+(\S+)$", banner, flags=re.M).group(1)
        game_day = {**os.environ, "SHARDRAG_URL": f"http://127.0.0.1:{port}", "SHARDRAG_API_KEY": admin_key}
        recipe = [["faults", "set", "--shard", "0", "--replica", "0", "stall=0.05:100,latency=lognormal:1:0.5"],
                  ["faults", "set", "--shard", "1", "--replica", "0", "errors=0.1:503,slowdown=5"],
                  ["faults", "show"], ["status"], ["faults", "clear"]]
        outputs = []
        for command in recipe:
            done = run(command, env=game_day)
            assert done.returncode == 0, (command, done.stdout, done.stderr)
            outputs.append(done.stdout)
        assert "lognormal:1:0.5" in outputs[2] and outputs[2].count("active") == 2
        assert outputs[4].count("faults off") == 2

        pids = []
        for log in workdir.glob("*.log"):
            for line in log.read_text().splitlines():
                payload = parse_ready_line(line)
                if payload:
                    pids.append(payload["pid"])
        assert len(pids) == 2  # a node (both shards' replicas and the collections made at run time) + gateway
        serve.send_signal(signal.SIGINT)
        assert serve.wait(60) == 0
        for pid in pids:  # every child is gone
            deadline = time.monotonic() + 15
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not _alive(pid), pid
        assert f"port {busy_port} is busy" in serve.stderr.read()
    finally:
        busy.close()
        if serve.poll() is None:
            serve.kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def test_demo_check(tmp_path):
    """The whole demo corpus (every module; the vectors come from the embedding cache after the
    first run): each common question finds the module that answers it in the top 3."""
    result = run(["demo", "--check", "--port", "0", "--root", str(tmp_path / "demo"),
                  "--workdir", str(tmp_path / "work")])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "demo check passed" in result.stdout
    assert len(re.findall(r"^Q: ", result.stdout, flags=re.M)) == 4
    assert "2/2 shards" in result.stdout and "py/csv" in result.stdout and "py/argparse" in result.stdout
