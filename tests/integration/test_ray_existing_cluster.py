"""`shardrag serve --backend ray --ray-address` joins an existing Ray cluster (started here by
`ray start --head --block`) instead of starting its own, and leaves it running when it stops."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from index_shards.build import BuildConfig, build_collection

pytestmark = pytest.mark.slow


def test_serve_against_an_existing_ray_cluster(tmp_path, msmarco):
    root = tmp_path / "root"
    build_collection(root, msmarco.documents, msmarco.vectors, msmarco.version, BuildConfig("rayx", 2),
                     show_progress=False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ray_cli = str(Path(sys.executable).with_name("ray"))
    import tempfile

    ray_tmp = tempfile.mkdtemp(prefix="rx-", dir="/tmp")  # Ray's socket paths must stay under 107 bytes
    import secrets

    # token auth on (what `ray start` sets up by default), with a token of this test's own
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "PYTHONUNBUFFERED": "1", "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    env.pop("RAY_ADDRESS", None)
    address = f"127.0.0.1:{port}"
    # --block keeps the head's processes in one process group we own: stopping it stops only them.
    head = subprocess.Popen([ray_cli, "start", "--head", "--block", "--port", str(port), "--num-cpus", "2",
                             "--include-dashboard=false", "--disable-usage-stats"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    serve = None
    try:
        deadline = time.monotonic() + 120
        while subprocess.run([ray_cli, "status", "--address", address], capture_output=True, env=env,
                             timeout=60).returncode != 0:
            assert head.poll() is None, head.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "the Ray head did not come up"
            time.sleep(1.0)
        serve = subprocess.Popen([sys.executable, "-m", "serving", "serve", "--backend", "ray", "--ray-address",
                                  address, "--collection", "rayx", "--root", str(root), "--replicas", "1",
                                  "--port", "0", "--no-encoder", "--open"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                 start_new_session=True)
        url = None
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            line = serve.stdout.readline()
            if not line and serve.poll() is not None:
                raise AssertionError(serve.stderr.read()[-2000:])
            if line.startswith("SHARDRAG_READY "):
                url = json.loads(line.split(" ", 1)[1])["url"]
        assert url, "the Ray-backed gateway never became ready"
        response = httpx.post(f"{url}/v1/query", json={"vector": msmarco.query_vectors[1].tolist(), "k": 3},
                              timeout=30)
        assert response.status_code == 200 and len(response.json()["hits"]) == 3
        os.killpg(serve.pid, signal.SIGINT)
        assert serve.wait(60) == 0
        # the cluster we joined is still up: it was not ours to stop
        assert subprocess.run([ray_cli, "status", "--address", address], capture_output=True, env=env,
                              timeout=60).returncode == 0
    finally:
        for process in (serve, head):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
        import shutil

        shutil.rmtree(ray_tmp, ignore_errors=True)
