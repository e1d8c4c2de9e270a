"""Which replica of a running shard is its primary (the tests that kill or stop a replica pick it
or pick another on purpose), read from the replicas' own ``/v1/info``."""

from __future__ import annotations

import time

import httpx


def role_of(url: str) -> dict | None:
    try:
        return httpx.get(f"{url}/v1/info", timeout=5).json().get("role")
    except (httpx.HTTPError, ValueError):
        return None


def primary_index(urls: list[str], timeout_s: float = 30.0) -> int:
    """The index in ``urls`` of the replica that is its shard's primary (waits for an election)."""
    deadline = time.monotonic() + timeout_s
    while True:
        roles = [role_of(url) for url in urls]
        found = [(r["term"], i) for i, r in enumerate(roles) if r and r["is_primary"]]
        if found:
            return max(found)[1]
        assert time.monotonic() < deadline, f"no primary among {urls}: {roles}"
        time.sleep(0.1)


def in_sync(urls: list[str], timeout_s: float = 30.0) -> list[str]:
    """The in-sync set (replica ids) as the shard's primary reports it."""
    return list(role_of(urls[primary_index(urls, timeout_s)])["in_sync"])


def replica_id(url: str, timeout_s: float = 30.0) -> str:
    """The stable id a replica goes by in its shard's in-sync set."""
    deadline = time.monotonic() + timeout_s
    while (role := role_of(url)) is None:
        assert time.monotonic() < deadline, f"{url} does not answer"
        time.sleep(0.1)
    return str(role["replica"])


def wait_all_in_sync(urls: list[str], timeout_s: float = 60.0) -> None:
    """Until every replica of the shard is in the in-sync set (caught up and brought back in)."""
    deadline = time.monotonic() + timeout_s
    ids = {replica_id(url, timeout_s) for url in urls}
    while set(in_sync(urls, timeout_s)) != ids:
        assert time.monotonic() < deadline, f"not every replica is in sync: {in_sync(urls)} of {sorted(ids)}"
        time.sleep(0.2)
