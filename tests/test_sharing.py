"""tests/sharing.py on a real pytest-xdist run of three tiny modules: two shared tests run at the
same time (each waits to see the other start), and an ``alone`` test overlaps neither — though
xdist gives it to the worker whose shared test ends first, while the other's still runs."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SHARED = """
import json, os, time
from pathlib import Path

def test_{name}():
    log = Path(os.environ["SHARING_LOG"])
    with log.open("a") as out:
        out.write(json.dumps({{"name": "{name}", "at": time.monotonic(), "event": "start"}}) + "\\n")
    deadline = time.monotonic() + 20
    while '"name": "{other}"' not in log.read_text():  # the other shared test must be running too
        assert time.monotonic() < deadline, "the two shared tests never ran at the same time"
        time.sleep(0.05)
    time.sleep({hold})
    with log.open("a") as out:
        out.write(json.dumps({{"name": "{name}", "at": time.monotonic(), "event": "end"}}) + "\\n")
"""

ALONE = """
import json, os, time
from pathlib import Path
import pytest

pytestmark = pytest.mark.alone

def _run(name):
    log = Path(os.environ["SHARING_LOG"])
    with log.open("a") as out:
        out.write(json.dumps({"name": name, "at": time.monotonic(), "event": "start"}) + "\\n")
    time.sleep(0.5)
    with log.open("a") as out:
        out.write(json.dumps({"name": name, "at": time.monotonic(), "event": "end"}) + "\\n")

def test_alone():
    _run("alone")

def test_alone_too():  # the worker keeps the machine from one alone test to the next
    _run("alone too")
"""


@pytest.mark.slow
def test_shared_tests_overlap_and_an_alone_test_overlaps_none(pytester: pytest.Pytester,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    log = pytester.path / "events.jsonl"
    monkeypatch.setenv("SHARING_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    pytester.makepyfile(test_a=textwrap.dedent(SHARED.format(name="a", other="b", hold=0.3)),
                        test_b=textwrap.dedent(SHARED.format(name="b", other="a", hold=2.5)),
                        test_c=ALONE)
    pytester.makeini("[pytest]\nmarkers =\n    alone: no other test beside it\n")
    result = pytester.runpytest_subprocess("-p", "tests.sharing", "-p", "no:randomly", "-p", "no:cacheprovider",
                                           "-n", "2", "--dist", "loadfile", "--no-loadscope-reorder")
    result.assert_outcomes(passed=4)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    spans = {name: (next(e["at"] for e in events if e["name"] == name and e["event"] == "start"),
                    next(e["at"] for e in events if e["name"] == name and e["event"] == "end"))
             for name in ("a", "b", "alone", "alone too")}
    for alone in ("alone", "alone too"):
        alone_start, alone_end = spans[alone]
        for name in ("a", "b"):
            start, end = spans[name]
            assert end <= alone_start or alone_end <= start, (alone, name, spans)
