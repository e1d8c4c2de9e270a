"""The quality gate's pacing: it yields the host to live traffic between its query pairs."""

from __future__ import annotations

import asyncio
import time

import pytest

from serving.versions.gate import GateSettings, quality_gate

# alone (tests/sharing.py): the pacing is measured in real time
pytestmark = pytest.mark.alone
QUERIES = [f"question {i}" for i in range(6)]


async def _timed_gate(busy_share: float) -> tuple[float, float, dict]:
    busy = 0.0

    async def search(text: str, version: str, k: int) -> list[str]:
        nonlocal busy
        started = time.monotonic()
        await asyncio.sleep(0.03)  # a search that takes 30 ms, the same ranking for both versions
        if version == "new":
            busy += time.monotonic() - started  # the pair runs concurrently: count one of the two
        return [f"doc-{text}-{i}" for i in range(k)]

    started = time.monotonic()
    verdict = await quality_gate("old", "new", QUERIES, None, search=search,
                                 settings=GateSettings(busy_share=busy_share), recent=[], encoders_loaded=True)
    return time.monotonic() - started, busy, verdict


def test_the_gate_waits_as_long_as_it_searched_at_half_share():
    elapsed, busy, verdict = asyncio.run(_timed_gate(0.5))
    assert verdict["passed"] and verdict["overlap_at_10"] == 1.0
    assert elapsed >= 2 * busy * 0.95  # searching at most half of the time


def test_a_full_share_adds_no_wait():
    elapsed, busy, verdict = asyncio.run(_timed_gate(1.0))
    assert verdict["passed"]
    assert elapsed < busy + 0.5 * busy  # no pause between the pairs (scheduling slack only)


@pytest.mark.parametrize("share", [0.0, 1.5])
def test_a_share_outside_0_1_is_refused(share):
    from retrieval.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        GateSettings(busy_share=share).validate()
    assert caught.value.field == "gate.busy_share"
