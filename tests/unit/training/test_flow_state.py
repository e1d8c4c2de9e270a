"""The flow's journal: a stable id per recipe, atomic records, one runner at a time."""

import json
import multiprocessing

import pytest

from retrieval.errors import ConfigError
from training.flow_state import STEPS, FlowState, FlowStore, flow_id


def test_the_id_follows_the_recipe_not_where_files_go():
    recipe = {"lr": 2e-5, "max_steps": 100, "out": "a", "root": "/x", "diagnostics": False}
    same = {**recipe, "out": "b", "root": "/y", "diagnostics": True}
    assert flow_id("docs", "<active>", "<active>", recipe, 2) == flow_id("docs", "<active>", "<active>", same, 2)
    assert flow_id("docs", "<active>", "<active>", recipe, 2) != flow_id("docs", "<active>", "<active>",
                                                                         {**recipe, "lr": 3e-5}, 2)
    assert flow_id("docs", "<active>", "<active>", recipe, 2) != flow_id("docs", "<active>", "<active>", recipe, 4)


def test_records_are_journalled_in_step_order(tmp_path):
    store = FlowStore(tmp_path / "docs", "flow-1")
    state = FlowState(flow="flow-1", collection="docs", base_version="v1", base_model="default")
    assert store.load() is None and state.next_step() == "train"
    store.record(state, "train", steps=10)
    store.record(state, "export", version="v2", path="/p")
    loaded = store.load()
    assert loaded is not None and list(loaded.steps) == ["train", "export"] and loaded.next_step() == "build"
    assert loaded.steps["export"]["version"] == "v2" and "at" in loaded.steps["export"]
    assert [p.name for p in store.directory.iterdir() if p.name.endswith(".tmp")] == []  # no temp left behind
    assert STEPS.index(loaded.next_step()) == 2


def test_a_foreign_edit_is_a_clear_error(tmp_path):
    store = FlowStore(tmp_path / "docs", "flow-1")
    store.directory.mkdir(parents=True)
    store.path.write_text(json.dumps({"not": "a flow"}))
    with pytest.raises(ConfigError, match="not a flow record"):
        store.load()


def _hold(directory, ready, release):
    store = FlowStore(directory, "flow-1")
    with store.locked():
        ready.set()
        release.wait(30)


def test_one_runner_at_a_time_and_a_dead_holder_frees_the_lock(tmp_path):
    context = multiprocessing.get_context("spawn")
    ready, release = context.Event(), context.Event()
    holder = context.Process(target=_hold, args=(tmp_path / "docs", ready, release))
    holder.start()
    assert ready.wait(30)
    store = FlowStore(tmp_path / "docs", "flow-1")
    with pytest.raises(ConfigError, match="another process is running this flow"):
        with store.locked():
            pass
    holder.kill()  # SIGKILL: the kernel drops its lock with the process
    holder.join()
    with store.locked():
        pass
