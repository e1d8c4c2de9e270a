"""A shard server process started on a damaged WAL: a torn tail (a crash mid-append) is truncated
to the last good record with a warning and the replica serves every record before it; a byte
flipped in the middle of the log stops the replica, naming the file and the offset."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from index_shards.layout import resolve_version, shard_dir
from index_shards.shard import Shard
from index_shards.versions import ShardVersions
from index_shards.wal import UPSERT, WalRecord
from index_shards.writes import accept
from tests.conftest import random_corpus

pytestmark = pytest.mark.slow


@pytest.fixture()
def written(tmp_path):
    documents, vectors, version = random_corpus(n=200, dim=16)
    build_collection(tmp_path / "root", documents, vectors, version, BuildConfig("c", 1), show_progress=False)
    directory = shard_dir(resolve_version(tmp_path / "root", "c")[0], 0)
    replica = ShardVersions(Shard.load(directory, device="cpu"), data_dir=tmp_path / "data")
    rng = np.random.default_rng(1)
    for seq in range(1, 41):  # 40 batches of one record: 40 records in one WAL file
        accept(replica, version.id, 0, None, [WalRecord(seq, UPSERT, f"w-{seq}", "t", "x", {"n": seq},
                                                        rng.standard_normal(16).astype(np.float32))])
    replica.close()
    [wal] = list((tmp_path / "data" / version.id).glob("wal-*.log"))
    return directory, tmp_path / "data", wal


def serve(directory, data_dir, tmp_path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "index_shards", "serve", "--dir", str(directory), "--data-dir",
                             str(data_dir), "--port-file", str(tmp_path / "port.json"), "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_torn_tail_is_truncated_and_the_rest_served(written, tmp_path):
    directory, data_dir, wal = written
    data = wal.read_bytes()
    wal.write_bytes(data[:-7])  # the last record cut short, as by a crash mid-append
    process = serve(directory, data_dir, tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "port.json").exists():
            assert process.poll() is None, process.communicate()[1][-2000:]
            assert time.monotonic() < deadline
            time.sleep(0.1)
        url = json.loads((tmp_path / "port.json").read_text())["url"]
        info = httpx.get(f"{url}/v1/info", timeout=10).json()["versions"][0]
        assert info["applied_seq"] == 39  # every whole record, none of the torn one
        assert httpx.get(f"{url}/v1/documents/w-39", timeout=10).status_code == 200
        assert httpx.get(f"{url}/v1/documents/w-40", timeout=10).status_code == 404
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=30)
    assert "torn tail" in stderr and str(wal) in stderr


def test_a_flipped_byte_mid_log_stops_the_replica_naming_the_offset(written, tmp_path):
    directory, data_dir, wal = written
    data = bytearray(wal.read_bytes())
    middle = len(data) // 2
    data[middle] ^= 0x40
    wal.write_bytes(bytes(data))
    process = serve(directory, data_dir, tmp_path)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode != 0 and not (tmp_path / "port.json").exists()
    assert "is damaged at offset" in stderr and str(wal) in stderr
    offset = int(stderr.split("is damaged at offset ")[1].split(":")[0])
    record_size = len(data) // 40
    assert offset <= middle < offset + record_size + 8  # the record holding the flipped byte
