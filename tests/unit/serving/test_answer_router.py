"""The answer router alone: affinity by passage owners, the load bound, generators marked down."""

from __future__ import annotations

import pytest

from serving.answer.routing import AffinityRouter, owner_of

URLS = [f"http://127.0.0.1:{9000 + i}" for i in range(4)]
DOC_SETS = [[f"d{n}", f"d{n + 1}", f"d{n + 2}"] for n in range(0, 600, 3)]


def test_the_preference_is_the_owner_of_most_passages_and_spreads_requests():
    router = AffinityRouter(URLS)
    for docs in DOC_SETS[:50]:
        owners = [owner_of(d, URLS) for d in docs]
        top = router.preference(docs)[0]
        assert owners.count(top) == max(owners.count(o) for o in owners)
        assert sorted(router.preference(docs)) == sorted(URLS)
    counts = {url: sum(router.preference(d)[0] == url for d in DOC_SETS) for url in URLS}
    assert min(counts.values()) > len(DOC_SETS) / 4 * 0.6, counts


def test_losing_a_generator_moves_few_requests():
    before = AffinityRouter(URLS)
    after = AffinityRouter(URLS[:3])
    stayed = [d for d in DOC_SETS if before.preference(d)[0] != URLS[3]]
    moved = sum(before.preference(d)[0] != after.preference(d)[0] for d in stayed)
    assert moved < 0.25 * len(stayed), moved


def test_a_generator_over_its_load_bound_goes_after_the_others():
    router = AffinityRouter(URLS, load_factor=1.0)
    docs = DOC_SETS[0]
    preferred = router.preference(docs)[0]
    with router.call(preferred, preferred):
        order, first = router.order(docs)
        assert first == preferred and order[0] != preferred and preferred in order
        with router.call(order[0], preferred):
            assert router.stats.spilled == 1
    order, _ = router.order(docs)
    assert order[0] == preferred  # load gone: affinity again
    assert router.snapshot()["in_flight"] == dict.fromkeys(URLS, 0)


def test_a_generator_marked_down_is_tried_last_until_its_time_is_up():
    router = AffinityRouter(URLS, down_for_s=0.0)
    docs = DOC_SETS[1]
    preferred = router.preference(docs)[0]
    router.down_for_s = 60.0
    router.mark_down(preferred)
    order, _ = router.order(docs)
    assert order[-1] == preferred and preferred in router.snapshot()["down"]
    with router.call(order[0], preferred):
        pass
    assert router.stats.failed_over == 1 and router.stats.spilled == 0


def test_round_robin_mode_turns_and_bad_settings_are_refused():
    router = AffinityRouter(URLS, affinity=False)
    firsts = [router.order(DOC_SETS[0])[0][0] for _ in range(8)]
    assert set(firsts) == set(URLS)
    with pytest.raises(Exception, match="load_factor"):
        AffinityRouter(URLS, load_factor=0.5)
