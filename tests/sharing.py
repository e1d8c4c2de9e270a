"""Two tests at a time, except those marked ``alone`` (a pytest plugin, loaded by tests/conftest.py).

Why: the suite is real processes and real waits — leases expiring, a replica killed every few
seconds, a nemesis schedule, schemathesis generating cases on one core — so over a whole run the
two cores of the CI machine were busy ~1.1 of 2 (measured per test from /proc/stat). pytest-xdist
runs two workers (``-n 2 --dist loadfile`` in pyproject.toml: a module's tests, and so its
module-scoped cluster, stay on one worker); this plugin keeps a test marked ``alone`` from
sharing the machine with any other: one whose assertion is a latency, a rate or a deadline, or
one that starts a process that is one per machine (a Ray cluster).

How: a readers-writer lock on a file the controller makes, taken around a test's whole protocol
(setup, call, teardown — module- and session-scoped fixtures are set up and torn down inside
some test's protocol, so they are covered too). A shared test takes it shared, an ``alone``
test exclusive. A second file is a turnstile taken first by both, so that a waiting ``alone``
test is not starved by the other worker taking the shared lock test after test. Without xdist
(``-n 0``, or a plain ``pytest`` where it is not installed) nothing is locked.

Order: modules with slow tests go first (in pytest-randomly's order among themselves), the fast
unit modules last, where they fill whichever worker is free while the other ends its last long
module (``--no-loadscope-reorder`` keeps that order; xdist would put modules with more tests first).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

_LOCK_DIR_KEY = "shardrag_lock_dir"  # in each worker's workerinput
_LOCK_DIR = pytest.StashKey[Path]()  # on the controller


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # xdist: called on the controller for each worker it starts
    if _LOCK_DIR not in node.config.stash:
        node.config.stash[_LOCK_DIR] = Path(tempfile.mkdtemp(prefix="shardrag-pytest-locks-"))
    node.workerinput[_LOCK_DIR_KEY] = str(node.config.stash[_LOCK_DIR])


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    slow_modules = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_modules)  # stable: the shuffled order within each


def pytest_unconfigure(config: pytest.Config) -> None:
    lock_dir = config.stash.get(_LOCK_DIR, None)
    if lock_dir is not None:
        for name in ("turnstile", "machine"):
            (lock_dir / name).unlink(missing_ok=True)
        lock_dir.rmdir()


def _alone(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker("alone") is not None


_held: list[int] = []  # this worker's exclusive lock, kept from one alone test to the next


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    lock_dir = getattr(item.config, "workerinput", {}).get(_LOCK_DIR_KEY)
    if lock_dir is None:
        yield
        return
    alone = _alone(item)
    fd = _held.pop() if _held else _take(Path(lock_dir), alone)
    try:
        yield
    finally:
        # An alone test followed by another on this worker keeps the machine: released in between,
        # the other worker would slip a shared test in each time while this one waits.
        if alone and _alone(nextitem):
            _held.append(fd)
        else:
            os.close(fd)  # closing releases the lock


def _take(lock_dir: Path, alone: bool) -> int:
    """The machine lock: exclusive for an ``alone`` test, shared for the others."""
    turnstile = os.open(lock_dir / "turnstile", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fd = os.open(lock_dir / "machine", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        return fd
    finally:
        os.close(turnstile)  # closing releases the turnstile
