"""The fallback detector's fast paths (issue 21): what each promises, held exactly.

Nearly every step of a long run is a steady, judged step, and the detector judges it without sorting
anything: the trip ratio and the drop check each start from a *bound* read off a stale sorted view
(monitors/detectors/fallback.py, ``_trip`` and ``_feed``; the baseline's ``level_bound``). Two promises,
each with its own tests here:

- the bound is safe: whenever it lets a step skip the exact computation, the exact one would have
  given the same trip and kept the same baseline (the cases at the edges of the view: every rank
  moved, the bound's index one past the end);
- the bound is tight: a step the bound lets through is not sent to the exact (sorting) computation
  anyway. A looser bound gives the same verdicts at a higher cost, so these tests count the calls of
  the general methods and name the rank the bound reads.

tests/test_detectors.py holds the inlined steady step to the general methods, step by step, on every
control; this file holds the bounds at the ranks where a one-off error would show.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from stepwatch.monitors.detectors import baseline as baseline_mod
from stepwatch.monitors.detectors import fallback as fallback_mod
from stepwatch.monitors.detectors.fallback import TRIP_RATIO_MIN, FallbackDetector
from stepwatch.monitors.stats.nearest_rank import nearest_rank_index
from stepwatch.monitors.stats.stepstats import nearest_rank

N = 200  # BASELINE_WINDOW: the scores kept
I75, I25 = 149, 49  # nearest-rank indexes of p75 and p25 of 200 scores


def _steady(**params) -> FallbackDetector:
    d = FallbackDetector(**params)
    for i in range(300):
        d.add(i, 20.0)  # steady, every score 1.0
    assert len(d._scores_q) == N
    return d


def _stale_view(window: list[float]) -> tuple[FallbackDetector, list[float]]:
    """A steady detector whose scores are ``window`` (oldest first), sorted into a fresh view that is
    stale from here on (scores added and evicted are counted, not sorted in)."""
    d = _steady()
    for s in window:
        d._push_score(s)
    assert d._trip() == TRIP_RATIO_MIN and not d._scores_sync
    assert d._scores_added == d._scores_evicted == 0
    return d, d._scores


def _exact_trip(d: FallbackDetector) -> float:
    sc = sorted(d._scores_q)
    return max(TRIP_RATIO_MIN, 1.0 + d.spread_mult * ((nearest_rank(sc, 75) - nearest_rank(sc, 25)) / 1.349))


def _count_calls(obj: object, name: str) -> Counter:
    """Replace ``obj``'s method ``name`` (on the instance alone) by one that counts its calls."""
    calls: Counter = Counter()
    general = getattr(obj, name)

    def counted(*args):
        calls[name] += 1
        return general(*args)

    setattr(obj, name, counted)
    return calls


# The sorted view S at the snapshot, and the scores pushed after it (each evicting the oldest). The
# stale bound reads S[I25 - added] and S[I75 + evicted]; these put a far value one rank outside each.
_LOW_EDGE = [1.0] * 5 + [0.0] * 44 + [1.0] * 106 + [3.0] * 45  # S[43] = 0.0, S[44..154] = 1.0, S[155] = 3.0
_AT_MIN = [1.0] * 5 + [0.0] * 44 + [0.3255] + [1.0] * 105 + [3.0] * 45  # S[44] = 0.3255: bound trip == 6.0

TIGHT = {
    # (window at the snapshot, pushed after it): the bound is the exact trip's minimum; no sort
    "one rank inside each far value": (_LOW_EDGE, [1.0] * 5),
    "the bound's trip exactly the minimum": (_AT_MIN, [1.0] * 5),  # 1 + 10 * (1 - 0.3255) / 1.349 == 6.0
    "p25's bound at rank 0": ([1.0] * N, [0.3] * 49),  # 49 added: S[49 - 49]
}
EDGE = {
    # every rank of the view moved (more scores added than p25's rank: lo < 0, and so, by the argument
    # in _trip, hi would be past the view): the bound has no value to read, the trip is computed exactly
    "p25 moved below the view": ([1.0] * N, [0.3] * 50),  # S[49 - 50]: p25 is 0.3 now
    "every rank moved, p75 with them": ([1.0] * N, [1.7] * 51),  # 51 added and evicted: p75 is 1.7 now
}


@pytest.mark.parametrize("through_add", [False, True])
@pytest.mark.parametrize("case", list(TIGHT))
def test_a_stale_view_within_the_bound_is_not_sorted(case, through_add):
    """Scores pushed since the snapshot never move the nearest-rank p25 and p75 of 200 out of
    S[49 - added] .. S[149 + evicted]: when those give the minimum trip, the trip is the minimum and
    nothing is sorted (add() does not call _trip(); _trip() keeps its view)."""
    window, then = TIGHT[case]
    d, view = _stale_view(window)
    for s in then:
        d._push_score(s)
    assert _exact_trip(d) == TRIP_RATIO_MIN
    if through_add:
        calls = _count_calls(d, "_trip")
        assert d.add(300, 20.0).trip_ratio == TRIP_RATIO_MIN
        assert calls["_trip"] == 0
    else:
        assert d._trip() == TRIP_RATIO_MIN
    assert d._scores is view and d._scores_added == len(then) + through_add


@pytest.mark.parametrize("through_add", [False, True])
@pytest.mark.parametrize("case", list(EDGE))
def test_a_view_whose_ranks_all_moved_gives_the_exact_trip(case, through_add):
    """Past the view's ends the bound says nothing: the trip is computed from the scores themselves
    (here above the minimum: a bound read at a wrapped or clipped index would miss it)."""
    window, then = EDGE[case]
    d, _ = _stale_view(window)
    for s in then:
        d._push_score(s)
    exact = _exact_trip(d)
    assert exact > TRIP_RATIO_MIN
    assert (d.add(300, 20.0).trip_ratio if through_add else d._trip()) == exact


def _far_values(n: int, a: int, lead: int | None = None) -> list[float]:
    """n scores, oldest first: ``lead`` (default ``a``) of 1.0 (the next pushes evict them), then 0.0
    up to rank i25 - a - 1 of the sorted view, 1.0 from i25 - a to i75 + a, and 3.0 above: after
    ``lead`` more scores of 1.0 the exact p25 and p75 are 1.0, and a bound read with ``a`` added and
    evicted lies one rank inside each far value."""
    lead = a if lead is None else lead
    i25, i75 = nearest_rank_index(25, n), nearest_rank_index(75, n)
    ones = (i75 + a) - (i25 - a) + 1
    return [1.0] * lead + [0.0] * (i25 - a) + [1.0] * (ones - lead) + [3.0] * (n - (i75 + a) - 1)


@pytest.mark.parametrize("through_add", [False, True])
@pytest.mark.parametrize("n", [200, 101, 64])
def test_the_bound_s_ranks_at_other_window_lengths(n, through_add):
    """The same tight case with baseline windows of 101 and 64 scores (nearest-rank p25 of 101 is
    rank 25, of 64 rank 15): ceil(25 n / 100) exactly, no rank lower."""
    d = FallbackDetector(baseline_window=n)
    for i in range(n + 100):
        d.add(i, 20.0)
    window = _far_values(n, 5)
    assert len(window) == n == len(d._scores_q)
    for s in window:
        d._push_score(s)
    assert d._trip() == TRIP_RATIO_MIN and not d._scores_sync
    view = d._scores
    for _ in range(5):
        d._push_score(1.0)
    assert _exact_trip(d) == TRIP_RATIO_MIN
    if through_add:
        calls = _count_calls(d, "_trip")
        assert d.add(10_000, 20.0).trip_ratio == TRIP_RATIO_MIN and calls["_trip"] == 0
    else:
        assert d._trip() == TRIP_RATIO_MIN
    assert d._scores is view


def test_a_view_that_goes_stale_counts_the_push_that_made_it_stale_once():
    """A view read exactly (spread()) is kept in step by insertion for 8 pushes; the 9th leaves it
    stale with 1 score added and 1 evicted since: the bound reads ranks i25 - 1 and i75 + 1, one
    inside the far values, and the step is judged without a sort."""
    d = _steady()
    for s in _far_values(N, 1, lead=9):
        d._push_score(s)
    d.spread()  # an exact read: the view is sorted and kept in step
    for _ in range(8):
        d._push_score(1.0)
    assert d._scores_sync
    d._push_score(1.0)
    assert not d._scores_sync and (d._scores_added, d._scores_evicted) == (1, 1)
    view = list(d._scores)
    assert (view[I25 - 2], view[I25 - 1], view[I75 + 1], view[I75 + 2]) == (0.0, 1.0, 1.0, 3.0)
    calls = _count_calls(d, "_trip")
    assert d.add(300, 20.0).trip_ratio == TRIP_RATIO_MIN and calls["_trip"] == 0


def test_the_bound_s_far_values_are_one_rank_outside():
    """The controls of the tight cases: each far value is the next rank out, so a bound read one
    rank wider (or a view not stale) would see it and sort."""
    d, view = _stale_view(_LOW_EDGE)
    assert (view[I25 - 5 - 1], view[I25 - 5], view[I75 + 5], view[I75 + 5 + 1]) == (0.0, 1.0, 1.0, 3.0)
    d, view = _stale_view(_AT_MIN)
    assert 1.0 + d.spread_mult * ((view[I75 + 5] - view[I25 - 5]) / 1.349) == TRIP_RATIO_MIN


# ---------------------------------------------------------------- the drop check's bound


def _per_token_steady() -> FallbackDetector:
    """Steady on 1000 padded tokens a step, alternating 16 s and 24 s from the oldest step kept
    (0.016 and 0.024 s per token, 100 of each in the baseline), the per-token view just sorted."""
    d = FallbackDetector()
    for i in range(300):
        d.add(i, 16.0 if i % 2 == 0 else 24.0, (), None, 1000)
    base = d._base
    assert d._steady and base.n_width == len(base) == N and base._q[0][0] == 16.0
    base.level()  # a read of the level: the view is in step with the window again
    assert base._pt_sync
    return d


@pytest.mark.parametrize("dt_s, checks", [
    (10.0, 0),  # 0.010 s/token: at or above 0.016 / 2, the median's limit: nothing to check
    (8.0, 0),  # 0.008: exactly the limit, which keeps the baseline (a drop is *under* half the level)
    (7.9, 1),  # under the limit: the check runs, and its own bound is enough (19 steps are above it)
])
def test_the_drop_check_reads_the_median_rank_of_the_per_token_view(dt_s, checks):
    """After the step, the view holds 0.010 (or 0.008, 0.0079), 99 x 0.016 and 100 x 0.024 s per
    token: its median (rank 99 of 200) is 0.016, the rank above it 0.024. The drop check is needed
    only when the newest step ran under half the median: a bound read at rank 100 (half is 0.012)
    or above would send the 10 s step to the check. The check itself starts from the same bound: a
    step of the last 20 at or above it keeps the baseline without sorting the level."""
    d = _per_token_steady()
    calls = _count_calls(d, "_check_drop")
    levels = _count_calls(d._base, "level")
    v = d.add(300, dt_s, (), None, 1000)
    pt = d._base._pt
    assert d._base._pt_sync and (pt[98], pt[99], pt[100]) == (0.016, 0.016, 0.024)
    assert not v.slow and v.state == "ok"
    assert calls["_check_drop"] == checks
    assert levels["level"] == 0  # the bound (0.016 / 2) kept the baseline: the level was never sorted for
    assert d.details()["baseline_s"] == 16.0 and d.warmup() == {"state": "steady", "until_step": None}  # kept


# ---------------------------------------------------------------- the steady step's cost

_GENERAL = [(FallbackDetector, "_trip"), (FallbackDetector, "_check_drop"), (FallbackDetector, "_push_score"),
            (baseline_mod._Baseline, "expected"), (baseline_mod._Baseline, "add")]


@pytest.mark.parametrize("widths", ["one", "three"])
def test_a_steady_step_calls_none_of_the_general_methods(monkeypatch, widths):
    """3000 steady steps (1000 or one of three widths, 3% noise): the inlined step calls the
    general methods only for the few steps whose bound is not enough (the views re-sorted, each
    width's first steps): under 1 call in 20 steps each (measured: 20 to 86 calls in 2979 judged
    steps), and _Baseline.add under 3 in 20 (292: a view just re-sorted is kept in step for its
    next 8 steps, by insertion). The control: with _inline False the same
    run calls each of them once or more per judged step (and gives the same verdicts)."""
    calls: Counter = Counter()
    for cls, name in _GENERAL:
        general = getattr(cls, name)
        monkeypatch.setattr(cls, name, lambda self, *a, _g=general, _n=name: calls.update([_n]) or _g(self, *a))
    ratio = fallback_mod._ratio  # the score of a step, dt / expected (a module function)
    monkeypatch.setattr(fallback_mod, "_ratio", lambda *a: calls.update(["_ratio"]) or ratio(*a))
    runs = {}
    for inline in (True, False):
        calls.clear()
        rng = random.Random(3)
        d = FallbackDetector()
        d._inline = inline
        verdicts = []
        for i in range(3000):
            padded = 4096 if widths == "one" else rng.choice([2048, 4096, 8192])
            dt_s = 20.0 * rng.lognormvariate(0, 0.03) * padded / 4096
            verdicts.append(d.add(i, dt_s, ["first"] if i == 0 else (), None, padded))
        judged = d.details()["judged"]
        assert judged > 2900 and d.state == "ok"
        runs[inline] = (dict(calls), verdicts, judged)
    fast, general = runs[True][0], runs[False][0]
    assert runs[True][1] == runs[False][1]
    for name in [n for _, n in _GENERAL] + ["_ratio"]:
        assert fast.get(name, 0) < runs[True][2] * (0.15 if name == "add" else 0.05), (name, fast)
        assert general[name] >= runs[False][2] - 40, (name, general)  # the warm-up's steps aside
