"""Collection specs and placement in the cluster state (a real LocalKV)."""

from __future__ import annotations

import pytest

from clusterstate.collections import Collections, CollectionSpec, Quotas, check_name, place, spec_version, spec_versions
from clusterstate.local import LocalKV
from clusterstate.state import ClusterState, ShardRecord
from retrieval.errors import Conflict, InvalidRequest, NotFound, ShardUnavailable
from retrieval.types import EmbeddingVersion


def test_placement_spreads_each_shards_replicas_over_distinct_least_loaded_nodes():
    placement = place(4, 2, ["a", "b", "c"], {"a": 5})
    assert all(len(set(group)) == 2 for group in placement)
    assert sum(group.count("a") for group in placement) < sum(group.count("b") for group in placement)
    counts = {n: sum(n in g for g in place(6, 2, ["a", "b", "c"], {})) for n in "abc"}
    assert counts == {"a": 4, "b": 4, "c": 4}
    assert place(2, 1, ["b", "a"], {}) == place(2, 1, ["a", "b"], {})  # every caller places alike


def test_placement_refuses_what_the_live_nodes_cannot_hold():
    with pytest.raises(InvalidRequest) as too_many:
        place(1, 3, ["a", "b"], {})
    assert too_many.value.field == "replicas" and "2 live" in too_many.value.message
    with pytest.raises(ShardUnavailable):
        place(1, 1, [], {})


@pytest.mark.parametrize("name", ["", "UPPER", "-dash", "a/b", "x" * 64, "dot.ted"])
def test_bad_names_are_refused_naming_the_field(name):
    with pytest.raises(InvalidRequest) as refused:
        check_name(name)
    assert refused.value.field == "name"


def test_create_list_drop_and_a_new_incarnation_starts_afresh(tmp_path):
    kv = LocalKV(tmp_path / "state.json")
    collections = Collections(kv)
    lease = kv.grant(30)
    collections.register_node("n1", "http://127.0.0.1:1", lease)
    collections.register_node("n2", "http://127.0.0.1:2", lease)
    spec = collections.create(CollectionSpec("docs", dim=8, shards=2, replicas=2, quotas=Quotas(10, 2.5),
                                             tenant_field="tenant"))
    assert spec.placement == (("n1", "n2"), ("n1", "n2")) and spec.uid
    assert CollectionSpec.from_dict(spec.to_dict()) == spec
    assert collections.get("docs") == spec and [s.name for s in collections.list()] == ["docs"]
    with pytest.raises(Conflict):
        collections.create(CollectionSpec("docs", dim=4))
    ClusterState(kv, spec.state_name).update_shard(0, lambda r: ShardRecord(term=3, primary="n1"))
    assert collections.drop("docs") and collections.get("docs") is None and not collections.drop("docs")
    assert kv.prefix(f"/shardrag/{spec.state_name}/") == []  # the shards' state went with it
    again = collections.create(CollectionSpec("docs", dim=8))
    assert again.uid != spec.uid and again.state_name != spec.state_name
    assert ClusterState(kv, again.state_name).shard(0).term == 0


def test_a_rollout_adds_versions_to_a_collection_once_and_only_to_its_own_incarnation(tmp_path):
    kv = LocalKV(tmp_path / "state.json")
    collections = Collections(kv)
    collections.register_node("n1", "http://127.0.0.1:1", kv.grant(30))
    spec = collections.create(CollectionSpec("docs", dim=8))
    tuned = EmbeddingVersion(encoder_name="tuned", weights_sha256="ab" * 32, dim=16)
    changed = collections.add_version("docs", spec.uid, tuned)
    assert [v.id for v in spec_versions(changed)] == [spec_version(spec).id, tuned.id]
    assert collections.add_version("docs", spec.uid, tuned) == changed == collections.get("docs")
    assert CollectionSpec.from_dict(changed.to_dict()) == changed
    assert changed.placement == spec.placement and changed.uid == spec.uid
    first = spec_version(spec).id  # retired: its files go from the nodes; staged again: it comes back
    retired = collections.retire_version("docs", spec.uid, first)
    assert [v.id for v in spec_versions(retired)] == [tuned.id] and retired.retired == (first,)
    assert collections.retire_version("docs", spec.uid, first) == retired
    back = collections.add_version("docs", spec.uid, spec_version(spec))
    assert [v.id for v in spec_versions(back)] == [first, tuned.id] and back.versions == changed.versions
    with pytest.raises(NotFound):  # a rollout of a dropped incarnation must not touch the new one
        collections.add_version("docs", "another-uid", tuned)
    with pytest.raises(NotFound):
        collections.add_version("gone", spec.uid, tuned)
