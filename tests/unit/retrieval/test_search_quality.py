"""The settings, metrics and choice behind ``shardrag eval --url`` (retrieval.search_quality; the
queries through a real gateway: tests/integration/test_hybrid.py)."""

import pytest

from retrieval.errors import ConfigError
from retrieval.ir_metrics import mrr_at_k, ndcg_at_k, recall_at_k
from retrieval.search_quality import best_weight, dense_weights_from, metrics_of, settings_for


def test_settings_name_each_mode_once_then_each_dense_weight():
    settings = settings_for(["weighted", "dense", "lexical", "rrf", "dense"], [0.5, 0.8, 0.8, 1.0])
    assert [s.label for s in settings] == ["hybrid weighted", "dense", "lexical", "hybrid rrf", "weighted w=0.5",
                                           "weighted w=0.8", "weighted w=1"]
    assert [(s.mode, s.fusion) for s in settings[:4]] == [("hybrid", "weighted"), ("dense", None),
                                                          ("lexical", None), ("hybrid", "rrf")]
    assert settings[3].weights is None and settings[0].dense_weight is None  # the gateway's default weights
    assert [dict(s.weights or {}) for s in settings[4:]] == [{"dense": 0.5, "lexical": 0.5},
                                                             {"dense": 0.8, "lexical": 0.2},
                                                             {"dense": 1.0, "lexical": 0.0}]


@pytest.mark.parametrize(("modes", "weights", "field"), [(["hybrid"], [], "modes"), ([], [1.5], "weights"),
                                                         ([], [-0.1], "weights"), ([], [], "modes")])
def test_a_bad_setting_is_refused_naming_the_flag(modes, weights, field):
    with pytest.raises(ConfigError) as refused:
        settings_for(modes, weights)
    assert refused.value.field == field


def test_metrics_are_the_offline_evaluations():
    qrels = {"q1": {"a": 2, "b": 1, "z": 0}, "q2": {"c": 1}, "q3": {"d": 0}}  # q3: no positive, not evaluated
    rankings = {"q1": ["b", "x", "a"] + [f"n{i}" for i in range(20)], "q2": [f"n{i}" for i in range(15)] + ["c"]}
    deep = metrics_of(rankings, qrels, 20)
    assert deep == {"ndcg@10": ndcg_at_k(rankings, qrels, 10), "recall@10": recall_at_k(rankings, qrels, 10),
                    "recall@20": recall_at_k(rankings, qrels, 20), "mrr@10": mrr_at_k(rankings, qrels, 10)}
    assert deep["recall@10"] == pytest.approx(0.5) and deep["recall@20"] == pytest.approx(1.0)
    assert list(metrics_of(rankings, qrels, 10)) == ["ndcg@10", "recall@10", "mrr@10"]  # no recall@k at 10


def test_the_best_weight_is_the_best_ndcg_and_a_tie_keeps_the_larger_dense_weight():
    rows = [{"setting": "dense", "dense_weight": None, "ndcg@10": 0.9},
            {"setting": "weighted w=0.5", "dense_weight": 0.5, "ndcg@10": 0.7},
            {"setting": "weighted w=0.9", "dense_weight": 0.9, "ndcg@10": 0.8},
            {"setting": "weighted w=0.7", "dense_weight": 0.7, "ndcg@10": 0.8}]
    chosen = best_weight(rows)
    assert chosen is not None and chosen["dense_weight"] == 0.9
    assert best_weight(rows[:1]) is None


def test_weights_flag_takes_a_list_or_an_inclusive_range():
    assert dense_weights_from("0.5:0.95:0.05") == [round(0.5 + 0.05 * i, 4) for i in range(10)]
    assert dense_weights_from("0.6, 0.8,1") == [0.6, 0.8, 1.0]
    assert dense_weights_from(None) == [] and dense_weights_from("") == []
    for bad in ("0.9:0.5:0.1", "0.5:0.9:0", "a,b", "0.5:0.9"):
        with pytest.raises(ConfigError) as refused:
            dense_weights_from(bad)
        assert refused.value.field == "weights"
