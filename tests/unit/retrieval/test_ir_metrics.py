import math

import pytest

from retrieval.ir_metrics import mrr_at_k, ndcg_at_k, overlap_at_k, recall_at_k

QRELS = {
    "q1": {"a": 2, "b": 1, "z": 0},
    "q2": {"c": 1},
    "q3": {"x": 0},  # no positive judgment: skipped, as BEIR does
}
RUN = {"q1": ["b", "z", "a"], "q2": ["x", "y"], "q3": ["x"]}


def test_ndcg_by_hand():
    # q1: DCG = 1/log2(2) + 0 + 2/log2(4) = 2; IDCG = 2/log2(2) + 1/log2(3)
    q1 = 2.0 / (2.0 + 1.0 / math.log2(3))
    assert ndcg_at_k(RUN, QRELS, 10) == pytest.approx((q1 + 0.0) / 2)
    # cut at 1: only "b" counts; ideal at 1 is grade 2
    assert ndcg_at_k(RUN, QRELS, 1) == pytest.approx((0.5 + 0.0) / 2)


def test_recall_and_mrr_by_hand():
    assert recall_at_k(RUN, QRELS, 10) == pytest.approx((1.0 + 0.0) / 2)
    assert recall_at_k(RUN, QRELS, 1) == pytest.approx((0.5 + 0.0) / 2)
    assert mrr_at_k(RUN, QRELS, 10) == pytest.approx((1.0 + 0.0) / 2)
    assert mrr_at_k({"q1": ["z", "a"]}, {"q1": QRELS["q1"]}, 10) == pytest.approx(0.5)


def test_missing_run_scores_zero():
    assert ndcg_at_k({}, QRELS, 10) == 0.0


def test_overlap():
    assert overlap_at_k(["a", "b", "c"], ["c", "a", "d"], 3) == pytest.approx(2 / 3)
    assert overlap_at_k(["a"], [], 3) == 0.0
