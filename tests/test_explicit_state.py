"""The detectors' explicit state: ``from_state(x.to_state())`` goes on exactly as ``x`` does (issue 45).

The fallback detector, its baseline and the step statistics each say what they hold as a frozen dataclass of named
fields; the backlog's array path and the supervisor's saved fold go through it. Each class is cut at points of
every kind (warm-up, steady, suspected, flagged, a variable width, saves and evaluations), copied through its state,
and both copies are fed the same further steps: every verdict and every figure they report stays the same.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from conftest import step_controls

from stepwatch.monitors.detectors.baseline import Baseline, BaselineState
from stepwatch.monitors.detectors.fallback import FallbackDetector
from stepwatch.monitors.detectors.fallbackstate import FallbackState
from stepwatch.monitors.stats.stepstats import StepStats

CONTROLS = [c for c in step_controls().all_controls(0) if c.name in (
    "partial_fallback_15pct", "full_fallback", "variable_width_fallback", "save_spikes", "warmup_plateau",
    "variable_width_no_tokens")]


def _rows(control) -> list[tuple]:
    return [(r["step"], r["dt"], r["flags"], r.get("tokens"), r.get("padded_tokens"), r.get("t"))
            for r in control.records]


def _detector_says(d: FallbackDetector) -> tuple:
    return (d.state, d.onset_step, d.slow_steps, d.warmup(), d.snapshot(), d.details(), d.trip_ratio, d.spread())


def _stats_say(s: StepStats) -> tuple:
    return (s.summary(), s.seen, s.excluded_first, s.excluded_phase, s.last_step, s.recent(), s.recent_p50(),
            s.throughput(), s.histogram(), s.canonical_line())


def _cuts(n: int, seed: int) -> list[int]:
    r = random.Random(seed)
    return sorted({1, n // 3, n // 2, n - 5, *(r.randrange(1, n) for _ in range(3))})


def _detector_cuts(rows: list[tuple], seed: int) -> list[int]:
    """Random cuts, and each cut just after the detector's state or warm-up moved (suspected, flagged, steady)."""
    d, last, moved = FallbackDetector(), None, []
    for i, row in enumerate(rows):
        d.add(*row[:5])
        now = (d.state, d.warmup()["state"])
        if now != last:
            moved.append(i + 1)
            last = now
    return sorted(set(_cuts(len(rows), seed) + moved[:6]))


def test_the_control_set_holds_every_kind_of_state():
    """The cuts below meet the detector warming, steady and ok, suspected and flagged (else the copies prove less)."""
    seen = set()
    for c in CONTROLS:
        rows = _rows(c)
        for cut in _detector_cuts(rows, 1):
            d = FallbackDetector()
            d.add_many(rows[:cut])
            seen.add((d.warmup()["state"], d.state))
    assert {("warming", "ok"), ("steady", "ok"), ("steady", "flagged")} <= seen, seen
    assert any(s == "suspected" for _, s in seen), seen


@pytest.mark.parametrize("name", [c.name for c in CONTROLS])
def test_a_detector_made_from_its_state_judges_every_further_step_as_the_original(name: str):
    c = next(c for c in CONTROLS if c.name == name)
    rows = _rows(c)
    for cut in _detector_cuts(rows, 1):
        d = FallbackDetector()
        d.add_many(rows[:cut])
        st = d.to_state()
        copy = FallbackDetector.from_state(st)
        assert type(st) is FallbackState and copy.to_state() == st and _detector_says(copy) == _detector_says(d)
        # the rest one step at a time (every verdict), then as a backlog (its array path) on two more copies
        assert [copy.add(*r[:5]) for r in rows[cut:]] == [d.add(*r[:5]) for r in rows[cut:]], (name, cut)
        assert _detector_says(copy) == _detector_says(d) and copy.to_state() == d.to_state()
        a, b = FallbackDetector.from_state(st), FallbackDetector.from_state(st)
        assert a.add_many(rows[cut:] * 3) == b.add_many(rows[cut:] * 3) and _detector_says(a) == _detector_says(b)
        assert d.to_state() != st or cut == len(rows)  # a copy: feeding the detector leaves the state it gave


def test_a_copy_cut_inside_a_run_s_own_tail_keeps_its_valley_and_its_cluster():
    """Steady steps, then 3 in the valley (4x, under the 6x trip) and 3 slow ones: suspected, with 3 valley steps
    counted. A copy cut at each step of it says the same and flags at the same step as the original."""
    rows = [(s, 2.0, ["first"] if s == 0 else [], None, None) for s in range(30)]
    rows += [(30 + i, 8.0, [], None, None) for i in range(3)] + [(33 + i, 40.0, [], None, None) for i in range(3)]
    rows += [(36, 40.0, [], None, None)] + [(37 + i, 2.0, [], None, None) for i in range(10)]
    d = FallbackDetector()
    for cut in range(29, len(rows)):
        d = FallbackDetector()
        for row in rows[:cut]:
            d.add(*row)
        copy = FallbackDetector.from_state(d.to_state())
        assert _detector_says(copy) == _detector_says(d), cut
        assert [copy.add(*row) for row in rows[cut:]] == [d.add(*row) for row in rows[cut:]], cut
        assert _detector_says(copy) == _detector_says(d), cut
    assert d.state == "flagged" and d.details()["valley"] == 3 and d.details()["flagged_at_step"] == 36


def test_a_long_steady_backlog_after_a_copy_takes_the_array_path_to_the_same_state():
    """10,000 steady steps of one width after the copy: the array path (monitors/detectors/steadyspan.py) reads the
    copy's state and hands back the next; every figure equals the per-step original's."""
    r = random.Random(5)
    rows = [(s, (3.0 if s == 1 else 1.0) * r.lognormvariate(0, 0.02), ["first"] if s == 1 else
             (["save"] if s % 997 == 0 else []), 4000, 4096, None) for s in range(1, 12_000)]
    d = FallbackDetector()
    d.add_many(rows[:1500])
    copy = FallbackDetector.from_state(d.to_state())
    for row in rows[1500:]:
        d.add(*row[:5])
    assert copy.add_many(rows[1500:]) == []
    assert _detector_says(copy) == _detector_says(d) and copy.to_state() == d.to_state()


@pytest.mark.parametrize("name", [c.name for c in CONTROLS])
def test_step_statistics_made_from_their_state_report_what_the_original_reports(name: str):
    c = next(c for c in CONTROLS if c.name == name)
    rows = _rows(c)
    for cut in _cuts(len(rows), 2):
        for read_first in (False, True):  # durations waiting to be sorted in, or sorted in already
            s = StepStats(recent_maxlen=300, window=50)
            s.add_many(rows[:cut])
            if read_first:
                s.summary()
            copy = StepStats.from_state(s.to_state())
            assert copy.to_state() == s.to_state() and _stats_say(copy) == _stats_say(s)
            assert [copy.add(*row) for row in rows[cut:]] == [s.add(*row) for row in rows[cut:]]
            assert _stats_say(copy) == _stats_say(s), (name, cut)


def test_a_baseline_made_from_its_state_expects_what_the_original_expects():
    r = random.Random(7)
    widths = [1024.0, 2048.0, 3000.0, None, 4096.0]
    b = Baseline(60)
    copy = Baseline.from_state(b.to_state())
    for _ in range(150):
        b.add(r.lognormvariate(0, 0.3), r.choice(widths))
        st = b.to_state()
        copy = Baseline.from_state(st)
        assert type(st) is BaselineState and copy.to_state() == st and len(st.steps) == min(60, len(st.steps))
        for w in widths + [1500.0]:
            assert copy.expected(w) == b.expected(w)
        assert (copy.median_s(), copy.level(), copy.n_width, len(copy)) == (b.median_s(), b.level(), b.n_width, len(b))
    more = [(r.lognormvariate(0, 0.3), r.choice(widths)) for _ in range(100)]
    for dt, w in more:
        b.add(dt, w)
        copy.add(dt, w)
        assert [copy.expected(x) for x in widths] == [b.expected(x) for x in widths]


def test_every_field_of_the_detector_state_is_named_and_typed():
    """No private attribute is the format: the state's fields are public names, each with a declared type."""
    fields = dataclasses.fields(FallbackState)
    assert all(not f.name.startswith("_") and f.type for f in fields)
    assert {"state", "steady", "base", "warm", "scores", "window", "slow", "onset", "history"} <= {f.name for f in fields}
    assert dataclasses.is_dataclass(FallbackState) and FallbackState.__dataclass_params__.frozen  # type: ignore[attr-defined]
    st = FallbackDetector().to_state()
    with pytest.raises(dataclasses.FrozenInstanceError):
        st.state = "flagged"  # type: ignore[misc]
    assert math.isclose(st.trip_ratio_min, 6.0)


def test_the_saved_fold_s_code_digest_covers_the_state_modules(monkeypatch):
    """A saved fold is refused when the code that made it changed: its digest reads the source of every module
    whose state it holds, the explicit states' own modules included."""
    from pathlib import Path

    from stepwatch.monitors.detectors import fallbackstate
    from stepwatch.monitors.fold import savedstate
    from stepwatch.monitors.stats import stepstate

    read: list[str] = []
    real = Path.read_bytes

    def reading(self: Path) -> bytes:
        read.append(self.name)
        return real(self)

    savedstate.code_digest.cache_clear()
    monkeypatch.setattr(Path, "read_bytes", reading)
    try:
        digest = savedstate.code_digest()
    finally:
        monkeypatch.undo()
        savedstate.code_digest.cache_clear()
    assert digest == savedstate.code_digest()
    for mod in (fallbackstate, stepstate, savedstate):
        assert Path(mod.__file__ or "").name in read, read
    assert {"fallback.py", "baseline.py", "steadyspan.py", "stepstats.py", "stepbacklog.py", "statecheck.py"} <= set(read)
