"""GatewayConfig: nested per component, same defaults as the flat config of earlier releases, whose
JSON keys are still read (with a deprecation warning); errors name the field."""

import dataclasses
import json
import warnings

import pytest

from retrieval.errors import ConfigError
from serving.gateway.config import FLAT_KEYS, ClusterSpec, GatewayConfig

# The flat config's defaults, as the previous release shipped them.
PREVIOUS_DEFAULTS = {
    "default_k": 10, "max_k": 100, "max_text_chars": 4096, "max_body_bytes": 1 << 20, "default_timeout_ms": 5000,
    "max_timeout_ms": 60000, "max_vector_abs": 1e6, "min_timeout_ms": 1, "transport": "pooled",
    "balancer": "p2c_peak_ewma", "hedging": True, "hedge_percentile": 95.0, "hedge_floor_ms": 2.0,
    "hedge_cap_ms": 250.0, "max_hedges": 1, "hedge_budget_ratio": 0.05, "hedge_budget_burst": 10.0,
    "eject_after_failures": 3, "eject_base_s": 1.0, "eject_max_s": 30.0, "probe_interval_s": 0.5,
    "allow_partial": True, "rollout_state_path": None, "poll_interval_s": 1.0, "rollout_min_ready_replicas": 0,
    "drain_s": 30.0, "gate_min_overlap": 0.5, "gate_max_ndcg_drop": 0.02, "gate_sample": 50,
    "answer_timeout_s": 300.0, "rate_limit_qps": 0.0, "rate_limit_burst": 50.0, "supervision_path": None,
    "coalesce": True, "max_batch": 64, "max_inflight_per_replica": 2, "encoder_model": None,
    "encoder_device": "auto", "load_encoder": True, "discovery_timeout_s": 60.0, "probe_timeout_s": 1.0,
}


def nested_value(config: GatewayConfig, flat_key: str):
    if flat_key in FLAT_KEYS:
        section, name = FLAT_KEYS[flat_key]
        return getattr(getattr(config, section), name)
    return getattr(config, flat_key)


def test_every_previous_key_has_a_home_and_the_same_default():
    config = GatewayConfig()
    for key, default in PREVIOUS_DEFAULTS.items():
        assert nested_value(config, key) == default, key


def test_flat_keys_are_still_read_with_a_deprecation_warning():
    flat = {"max_k": 20, "hedging": False, "hedge_cap_ms": 120.0, "rollout_state_path": "/tmp/state.json",
            "load_encoder": False, "gate_sample": 7, "balancer": "round_robin", "probe_timeout_s": 2.0}
    with pytest.warns(DeprecationWarning) as caught:
        config = GatewayConfig.from_dict(flat)
    for key, value in flat.items():
        assert nested_value(config, key) == value, key
    messages = " ".join(str(w.message) for w in caught)
    assert "'max_k' is deprecated: use limits.max_k" in messages and "hedging.enabled" in messages
    assert "probe_timeout_s" not in messages  # still a top-level key, nothing deprecated


def test_the_nested_form_round_trips_without_warnings():
    config = GatewayConfig.from_dict({"limits": {"max_k": 70}, "hedging": {"enabled": False, "cap_ms": 100.0},
                                      "rollout": {"drain_s": 1.0}, "encoder": {"load": False}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = GatewayConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config and again.limits.max_k == 70 and not again.hedging.enabled
    assert dataclasses.replace(config.limits, max_k=100) == GatewayConfig().limits  # only what was given changed


@pytest.mark.parametrize("data, field", [
    ({"limits": {"max_k": 0}}, "limits.max_k"),
    ({"limits": {"default_k": 200}}, "limits.default_k"),
    ({"hedging": {"floor_ms": 300.0}}, "hedging.floor_ms"),
    ({"hedging": {"percentile": 100.0}}, "hedging.percentile"),
    ({"ejection": {"after_failures": 0}}, "ejection.after_failures"),
    ({"rollout": {"drain_s": -1}}, "rollout.min_ready_replicas"),
    ({"gate": {"min_overlap": 2}}, "gate.min_overlap"),
    ({"gate": {"busy_share": 0}}, "gate.busy_share"),
    ({"calls": {"balancer": "fastest"}}, "calls.balancer"),
    ({"calls": {"transport": "aiohttp"}}, "calls.transport"),
    ({"encoder": {"device": "tpu"}}, "encoder.device"),
    ({"limits": {"max_kk": 5}}, "limits.max_kk"),
    ({"bogus": 1}, "bogus"),
])
def test_bad_values_name_the_field(data, field):
    with pytest.raises(ConfigError) as caught:
        GatewayConfig.from_dict(data)
    assert caught.value.field == field


def test_cluster_specs_written_by_the_previous_release_still_load(tmp_path):
    spec = tmp_path / "cluster.json"
    spec.write_text(json.dumps({"collection": "c", "shards": [["http://a"], ["http://b"]], "generators": [],
                                "gateway": dict(PREVIOUS_DEFAULTS, load_encoder=False, max_k=42)}))
    with pytest.warns(DeprecationWarning):
        loaded = ClusterSpec.load(spec)
    assert loaded.shards == (("http://a",), ("http://b",)) and loaded.gateway.limits.max_k == 42
    assert not loaded.gateway.encoder.load
    spec.write_text(loaded.to_json().decode())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ClusterSpec.load(spec) == loaded
