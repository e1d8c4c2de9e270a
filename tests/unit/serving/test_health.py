"""Outlier ejection with exponential back-off, reinstated only by a good probe (fake clock)."""

from serving.shardcall.ejection import OutlierDetector
from tests.unit.serving.fakes import Clock


def make(clock):
    ejected = []
    detector = OutlierDetector(consecutive_failures=3, base_ejection_s=1.0, max_ejection_s=8.0, clock=clock,
                               on_eject=lambda replica, seconds: ejected.append((replica, seconds)))
    return detector, ejected


def test_consecutive_failures_eject_and_success_resets_the_count():
    clock = Clock()
    detector, ejected = make(clock)
    detector.record_failure("a")
    detector.record_failure("a")
    detector.record_success("a")
    detector.record_failure("a")
    detector.record_failure("a")
    assert not detector.is_ejected("a")
    detector.record_failure("a")
    assert detector.is_ejected("a") and ejected == [("a", 1.0)]


def test_back_off_doubles_and_only_a_good_probe_reinstates():
    clock = Clock()
    detector, ejected = make(clock)
    for _ in range(3):
        detector.record_failure("a")
    assert detector.due_for_probe() == []
    clock.t = 1.0
    assert detector.due_for_probe() == ["a"]
    detector.probe_result("a", ok=False)  # still bad: ejected again, twice as long
    assert ejected[-1] == ("a", 2.0) and detector.due_for_probe() == []
    clock.t = 2.9
    assert detector.due_for_probe() == []
    clock.t = 3.0
    detector.probe_result("a", ok=False)
    assert ejected[-1] == ("a", 4.0)
    clock.t = 7.0
    detector.probe_result("a", ok=False)
    clock.t = 15.0
    detector.probe_result("a", ok=False)
    assert ejected[-1] == ("a", 8.0)  # capped
    clock.t = 23.0
    detector.probe_result("a", ok=True)
    assert not detector.is_ejected("a")
    for _ in range(3):  # fails again right away: the back-off continues from where it was
        detector.record_failure("a")
    assert ejected[-1] == ("a", 8.0)


def test_back_off_forgotten_after_a_healthy_stretch():
    clock = Clock()
    detector, ejected = make(clock)
    for _ in range(3):
        detector.record_failure("a")
    clock.t = 1.0
    detector.probe_result("a", ok=True)
    clock.t = 100.0
    detector.record_success("a")
    for _ in range(3):
        detector.record_failure("a")
    assert ejected[-1] == ("a", 1.0)


def test_available_prefers_healthy_and_is_never_empty():
    detector, _ = make(Clock())
    for _ in range(3):
        detector.record_failure("a")
    assert list(detector.available(["a", "b"])) == ["b"]
    for _ in range(3):
        detector.record_failure("b")
    assert list(detector.available(["a", "b"])) == ["a", "b"]
    assert detector.snapshot()["a"]["ejected"] is True
