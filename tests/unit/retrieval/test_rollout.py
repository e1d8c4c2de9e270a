"""The rollout protocol: every transition, every refusal, and idempotent repeats."""

import pytest

from retrieval.rollout import RolloutRefused, RolloutState, abort, activate, retire, rollback, stage, sync

V1, V2, V3 = "enc.w1.p1", "enc.w2.p1", "enc.w3.p1"


def test_full_cycle_and_events():
    state = RolloutState(active=V1, models={V1: "default"})
    staged = stage(state, V2, "/models/v2", now=1.0)
    assert staged.state.staged == V2 and staged.event.kind == "VersionStaged"
    assert staged.state.loaded() == (V1, V2) and staged.state.write_targets() == (V1,)
    synced = sync(staged.state, V2, now=1.5)
    assert synced.state.synced and synced.state.write_targets() == (V1, V2) and synced.event.kind == "VersionSynced"
    assert sync(synced.state, V2, now=1.6).event is None
    active = activate(synced.state, V2, now=2.0)
    assert (active.state.active, active.state.previous, active.state.staged) == (V2, V1, None)
    assert active.state.activated_at == 2.0 and active.event.kind == "VersionActivated"
    retired = retire(active.state, V1, now=100.0, drain_s=30.0)
    assert retired.state.loaded() == (V2,) and retired.event.kind == "VersionRetired"
    assert V1 not in retired.state.models
    assert active.state.write_targets() == (V2, V1) and not active.state.synced
    assert [e.kind for e in retired.state.events] == ["VersionStaged", "VersionSynced", "VersionActivated",
                                                      "VersionRetired"]
    assert retired.state.generation == 4
    assert RolloutState.from_dict(retired.state.to_dict()) == retired.state


def test_every_command_is_idempotent():
    state = RolloutState(active=V1)
    once = stage(state, V2, "m", 1.0).state
    again = stage(once, V2, "m", 5.0)
    assert again.event is None and again.state is once
    active = activate(sync(once, V2, 1.5).state, V2, 2.0).state
    assert activate(active, V2, 3.0).event is None
    retired = retire(active, V1, 100.0, drain_s=0).state
    assert retire(retired, V1, 101.0, drain_s=0).event is None
    assert abort(retired, V3, 1.0).event is None  # never staged: nothing to abort
    staged = stage(retired, V3, "m3", 200.0).state
    aborted = abort(staged, V3, 201.0).state
    assert aborted.staged is None and abort(aborted, V3, 202.0).event is None


def test_refusals_say_why():
    state = RolloutState(active=V1)
    with pytest.raises(RolloutRefused, match="not staged"):
        activate(state, V2, 1.0)
    staged = stage(state, V2, "m", 1.0).state
    with pytest.raises(RolloutRefused, match="already staged"):
        stage(staged, V3, "m", 1.0)
    with pytest.raises(RolloutRefused, match="different|not 'other'"):
        stage(staged, V2, "other", 1.0)
    with pytest.raises(RolloutRefused, match="use abort"):
        retire(staged, V2, 1.0, drain_s=0)
    with pytest.raises(RolloutRefused, match="not synced"):
        activate(staged, V2, 10.0)
    with pytest.raises(RolloutRefused, match="not staged"):
        sync(staged, V3, 10.0)
    active = activate(sync(staged, V2, 9.0).state, V2, 10.0).state
    with pytest.raises(RolloutRefused, match="active version"):
        retire(active, V2, 11.0, drain_s=0)
    with pytest.raises(RolloutRefused, match="draining"):
        retire(active, V1, 11.0, drain_s=30.0)
    assert retire(active, V1, 11.0, drain_s=30.0, force=True).state.previous is None
    with pytest.raises(RolloutRefused, match="retire it first"):
        stage(active, V3, "m", 12.0)
    with pytest.raises(RolloutRefused, match="use rollback"):
        stage(active, V1, "m", 12.0)
    with pytest.raises(RolloutRefused, match="use rollback"):
        abort(active, V2, 12.0)
    assert RolloutRefused("x").status_code == 409


def test_rollback_while_previous_is_loaded():
    active = activate(sync(stage(RolloutState(active=V1), V2, "m", 1.0).state, V2, 1.5).state, V2, 2.0).state
    back = rollback(active, V1, 3.0)
    assert (back.state.active, back.state.previous) == (V1, V2) and back.event.kind == "VersionRolledBack"
    assert rollback(back.state, V1, 4.0).event is None
    forward = rollback(back.state, V2, 5.0).state  # and forward again while both are loaded
    assert forward.active == V2
    gone = retire(forward, V1, 100.0, drain_s=0).state
    with pytest.raises(RolloutRefused, match="not loaded"):
        rollback(gone, V1, 101.0)
