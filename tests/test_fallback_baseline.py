"""The fallback detector's baseline (monitors/detectors/baseline.py), by what it expects a step to
take (issue 21: the mutants a cosmic-ray run left): which token count gives a step its width, a
run whose steps take 0 s, the number of neighbours a width-aware expectation is the median of,
widths that share one log, and the bound of the per-token level the detector's fast path reads.

The expectations are read where a user sees them: ``StepVerdict.expected_s`` of a step in warm-up
(the warm baseline is a ``_Baseline`` of the last STEADY_RUN steps)."""

from __future__ import annotations

import math

import pytest

from stepwatch.monitors.detectors.baseline import NEIGHBORS, _Baseline
from stepwatch.monitors.detectors.fallback import STEADY_RUN, FallbackDetector


def _warm(rows: list[tuple[float, int | None]]) -> FallbackDetector:
    """A detector fed ``(dt seconds, padded tokens)`` rows, still in warm-up afterwards."""
    assert len(rows) < STEADY_RUN
    d = FallbackDetector()
    for i, (dt, padded) in enumerate(rows):
        v = d.add(i, dt, (), None, padded)
        assert v.excused == "warming"
    return d


def _two_widths() -> FallbackDetector:
    """9 steps of 1000 padded tokens at 1.0 s, 10 of 2000 at 4.0 s: a step of width 1 (or 1000)
    is expected at 1.0 s (its 9 nearest widths are the 1000s); a step without a width at the
    median of all 19, 4.0 s."""
    return _warm([(1.0, 1000)] * 9 + [(4.0, 2000)] * 10)


def _expected(tokens, padded) -> float | None:
    return _two_widths().add(99, 1.0, (), tokens, padded).expected_s


@pytest.mark.parametrize("tokens, padded, expected_s", [
    (None, 1000, 1.0),  # padded tokens, an int
    (1000, None, 1.0),  # no padded count: the real one
    (None, 1, 1.0),  # width 1 (the smallest count): nearest are the 1000s
    (None, 1000.0, 1.0),  # a float count
    (None, 1.0, 1.0),  # a float count of 1 (ints take a faster path)
    (None, 0.5, 1.0),  # any positive width, even under one token
    (None, "1000", 1.0),  # a count as text (a JSON line's string)
    (1000, 2000, 4.0),  # both: the padded count wins
    (1000, 0, 1.0),  # a padded count of 0 is no width: the real count is next
    (1000, -3, 1.0),
    (1000, True, 1.0),  # a bool is not a count
    (1000, "many", 1.0),  # text that is not a number (ValueError)
    (1000, [5], 1.0),  # not a number at all (TypeError)
    (1000, 10**400, 1.0),  # beyond a float's range (OverflowError)
    (1000, float("nan"), 1.0),
    (1000, float("inf"), 1.0),
    (None, 0, 4.0),  # no width at all: the median of the step times
    (0, None, 4.0),
    (-5, None, 4.0),
    (False, None, 4.0),
    (True, None, 4.0),
    (None, 0.0, 4.0),
    (None, float("inf"), 4.0),
    (None, float("-inf"), 4.0),
    (None, float("nan"), 4.0),
    (None, "abc", 4.0),
    (None, [1000], 4.0),
    (None, 10**400, 4.0),
    (None, None, 4.0),
])
def test_which_token_count_gives_a_step_its_width(tokens, padded, expected_s):
    assert _expected(tokens, padded) == expected_s


def test_a_run_of_zero_second_steps_expects_zero_and_any_time_is_infinitely_slow():
    """A baseline of 0 s steps (a reported time rounded to 0): another 0 s step scores 1, a
    0.5 s one scores inf (nothing divides by zero)."""
    for dt, score in ((0.0, 1.0), (0.5, math.inf), (2.0, math.inf)):
        v = _warm([(0.0, None)] * 5).add(5, dt)
        assert (v.expected_s, v.score) == (0.0, score), dt
    v = _warm([(0.0, None)] * 5 + [(1.0, None)] * 6).add(11, 0.0)  # a 1.0 s median: 0 s scores 0
    assert (v.expected_s, v.score) == (1.0, 0.0)


def test_a_width_aware_expectation_is_the_median_of_its_9_nearest_steps():
    """With more than NEIGHBORS (9) steps at the step's own width, the expectation is the median of
    the first 9 of them in arrival order (the stable sort keeps equal distances in arrival order)."""
    assert NEIGHBORS == 9
    down = _warm([(float(t), 1000) for t in range(11, 0, -1)])  # 11 .. 1 s: the first 9 are 11 .. 3
    assert down.add(11, 5.0, (), None, 1000).expected_s == 7.0  # median of 3..11
    up = _warm([(float(t), 1000) for t in range(1, 11)])  # 1 .. 10 s: the first 9 are 1 .. 9
    assert up.add(10, 5.0, (), None, 1000).expected_s == 5.0  # median of 1..9
    # and around a width with none of its own: the 9 nearest in log width, scaled by (w / w_i) ** 2
    mixed = _warm([(1.0, 1000)] * 5 + [(2.0, 4000)] * 5)
    v = mixed.add(10, 1.0, (), None, 1500)  # the 1000s are nearer (log 1.5 < log 2.67): all 5, then 4 of the 4000s
    # 1000s scaled by (1500 / 1000) ** 2 -> 2.25, the 4000s not scaled (wider) -> 2.0: median 2.25
    assert v.expected_s == 2.25


def _shared_log_widths(n: int) -> list[float]:
    ws = [4096.0]
    while len(ws) < n:
        ws.append(math.nextafter(ws[-1], 0.0))
    assert len({math.log(w) for w in ws}) == 1, "these widths must share one float log"
    return ws


@pytest.mark.parametrize("n_widths", [3, 4])
def test_widths_sharing_one_log_stay_shared_until_one_is_left(n_widths):
    """Widths whose logs are the same float are all at distance 0 from each other: a step of one
    of them is expected from the first 9 of all of them in arrival order. When one such width
    leaves the window and two or more remain, that still holds (they are not treated as alone)."""
    ws = _shared_log_widths(n_widths)
    leaving, slow, mine = ws[-1], ws[1], ws[0]
    others = ws[2:-1]  # with 4 widths, one more that stays
    b = _Baseline(16 + len(others))
    b.add(100.0, leaving)  # the oldest step: the only one of its width
    for w in others:
        b.add(3.0, w)
    for _ in range(5):
        b.add(2.0, slow)  # early steps of another width with the same log
    for _ in range(10):
        b.add(1.0, mine)
    b.add(1.0, mine)  # the window is full: the leaving width's only step is evicted
    assert len(b) == 16 + len(others) and b.n_width == len(b)
    exp, mode = b.expected(mine)
    # arrival order among the shared widths: others (3.0), 5 x slow (2.0 * (mine / slow) ** 2), then mine (1.0)
    first9 = [3.0] * len(others) + [2.0 * (mine / slow) ** 2] * 5 + [1.0] * (9 - 5 - len(others))
    assert mode == "width" and exp == sorted(first9)[4] > 1.5


def test_the_level_bound_is_the_level_while_in_step_and_above_it_after_evictions():
    """level_bound() (read by the detector's fast path in place of the exact per-token median):
    equal to level() while the sorted view is kept in step; after the view went stale and steps
    were evicted, still at or above it (the evictions counted)."""
    b = _Baseline(20)
    for t in range(1, 21):
        b.add(float(t), 1.0)  # per token = dt
    assert b.level() == b.level_bound() == 10.0
    for _ in range(8):
        b.add(100.0, 1.0)  # kept in step (fewer adds than the idle limit), evicting 1 .. 8
    assert b.level_bound() == 18.0  # in step: 9..20 and 8 x 100, the median is the 10th value
    b.add(100.0, 1.0)  # the 9th add without a read: the view goes stale; 9 is evicted
    current = sorted([float(t) for t in range(10, 21)] + [100.0] * 9)
    assert current[(len(current) - 1) >> 1] == 19.0
    bound = b.level_bound()
    assert bound is not None and bound >= 19.0
    assert b.level() == 19.0 == b.level_bound()  # read: in step again, the bound exact
