"""StepStats at its edges (issue 21: the mutants a cosmic-ray run of monitors/stats/stepstats.py
left): which durations and token counts are taken, the default sizes, add_many's fast path against
one add per row for each shape of deques, the recent slice, the window's median, throughput's
sums and their zero cases, and the histogram's exact edges and bounds on both scales."""

from __future__ import annotations

import pytest

from stepwatch.monitors.stats.stepstats import StepStats, check_step_seconds

from test_stepstats import _stats_state


def filled(dts, **kw) -> StepStats:
    s = StepStats(**kw)
    for i, dt in enumerate(dts, 1):
        s.add(i, dt)
    return s


def test_which_durations_are_steps():
    assert check_step_seconds(0) == 0.0 and check_step_seconds("0.5") == 0.5 and check_step_seconds(0.0) == 0.0
    for bad in (-1e-9, -1, float("nan"), float("inf"), "x", None, 10**400):
        with pytest.raises(ValueError):
            check_step_seconds(bad)
    for bad in (-0.5, -1e-9, -2.0):  # add's own fast path refuses them as the helper does
        with pytest.raises(ValueError):
            StepStats().add(1, bad)
        with pytest.raises(ValueError):
            StepStats().add_many([(1, bad, (), None, None, None)])


@pytest.mark.parametrize("tokens, kept", [(0, 0), (0.0, 0), (7, 7), ("7", 7), (7.9, 7), (-1, None), (-1.0, None),
                                          ("x", None), ([1], None), (float("inf"), None), (float("nan"), None),
                                          (None, None)])
def test_which_token_counts_are_counts(tokens, kept):
    s = StepStats()
    s.add(1, 0.5, (), tokens, tokens)
    rec = s.recent()[-1]
    assert (rec.tokens, rec.padded_tokens) == (kept, kept)


def test_the_default_sizes_are_4096_recent_steps_and_a_window_of_200():
    s = StepStats()
    for i in range(5000):  # step i carries i tokens in 1 s
        s.add(i, 1.0, (), i, None)
    assert len(s.recent()) == 4096 and s.recent()[0].step == 5000 - 4096
    assert s.throughput()["real_tokens_per_s"] == 4899.5  # the mean of 4800..4999: the last 200 counted steps
    assert s.last == 1.0 and s.last_step == 4999  # properties, not methods
    with pytest.raises(ValueError):
        StepStats(recent_maxlen=0)
    with pytest.raises(ValueError):
        StepStats(window=0)
    with pytest.raises(ValueError):
        StepStats(recent_maxlen=0, window=5)
    assert len(filled([0.1, 0.2, 0.3], recent_maxlen=1, window=1).recent()) == 1  # 1 is a size


@pytest.mark.parametrize("recent, window, n, first_every", [(100, 5, 50, 0), (100, 100, 50, 0), (5, 20, 50, 0),
                                                             (5, 20, 50, 3), (10, 5, 50, 2), (1, 1, 3, 0),
                                                             (100, 5, 1, 0), (3, 1000, 40, 0)])
def test_add_many_leaves_what_one_add_per_row_leaves_for_every_shape_of_deques(recent, window, n, first_every):
    rows = [(i, 0.1 + 0.01 * (i % 7), ["first"] if first_every and i % first_every == 0 else [], 10 * i, 20 * i,
             1.7e9 + i) for i in range(n)]
    one, many = StepStats(recent, window), StepStats(recent, window)
    assert many.add_many(rows) == sum(one.add(*r) for r in rows)
    assert _stats_state(many) == _stats_state(one)
    assert [r.step for r in many.recent()] == [r.step for r in one.recent()] == list(range(max(0, n - recent), n))


def test_the_recent_slice():
    s = filled([0.1, 0.2, 0.3])
    assert [r.dt_s for r in s.recent(1)] == [0.3] and [r.dt_s for r in s.recent(2)] == [0.2, 0.3]
    assert s.recent(0) == [] and s.recent(-1) == [] and len(s.recent()) == 3


def test_the_windows_median_is_nearest_rank_50():
    s = filled([float(v) for v in range(1, 101)])
    assert s.recent_p50() == 50.0  # the 50th of 100, not the 49th or 51st
    assert StepStats().recent_p50() is None


def test_throughput_sums_and_its_zero_cases():
    s = StepStats()
    s.add(1, 0.25, (), 301, 401)
    s.add(2, 0.25, (), 300, 400)
    tp = s.throughput()
    assert tp["tokens_per_s"] == 1602.0 and tp["real_tokens_per_s"] == 1202.0  # sums over half a second
    assert tp["padding_share"] == pytest.approx(1.0 - 601 / 801, rel=1e-12)
    s2 = StepStats()
    s2.add(1, 1.0, (), 3, 3)
    s2.add(2, 1.0, (), 0, 0)
    assert s2.throughput() == {"tokens_per_s": 1.5, "real_tokens_per_s": 1.5, "padding_share": 0.0}
    zero = StepStats()
    zero.add(1, 0.0, (), 100, 100)  # a 0 s step with tokens: no rate, never a 1/0
    assert zero.throughput() == {"tokens_per_s": None, "real_tokens_per_s": None, "padding_share": 0.0}
    single = StepStats()
    single.add(1, 1.0, (), 1, 1)  # one padded token, and it is real: no padding
    assert single.throughput()["padding_share"] == 0.0
    empty = StepStats()
    empty.add(1, 1.0, (), 0, 0)  # no token at all: no padding share (0 / 0)
    assert empty.throughput()["padding_share"] is None and empty.throughput()["tokens_per_s"] == 0.0
    assert filled([1.0]).throughput() == {"tokens_per_s": None, "real_tokens_per_s": None, "padding_share": None}


def test_the_histograms_edges_on_both_scales():
    s = filled([1.0, 5.0, 11.0, 50.0, 100.0])
    assert s.histogram(bins=2, scale="log") == [(1.0, pytest.approx(10.0), 2), (pytest.approx(10.0), 100.0, 3)]  # geometric
    assert [round(e, 9) for e, _, _ in s.histogram(bins=4, scale="log")] == [1.0, 3.162277660, 10.0, 31.622776602]
    assert s.histogram(bins=2, scale="linear") == [(1.0, 50.5, 4), (50.5, 100.0, 1)]
    assert [e for e, _, _ in s.histogram(bins=3, scale="linear", lo_s=0, hi_s=30)] == [0.0, 10.0, 20.0]
    assert s.histogram(bins=3, scale="linear", lo_s=0, hi_s=30) == [(0.0, 10.0, 2), (10.0, 20.0, 1), (20.0, 30.0, 2)]  # beyond hi: the last bin
    assert len(s.histogram()) == 20  # the default: 20 log bins
    assert s.histogram(bins=1) == [(1.0, 100.0, 5)]
    with pytest.raises(ValueError):
        s.histogram(bins=0)


def test_the_log_histograms_bounds_and_zero_second_steps():
    s = filled([1.0, 5.0, 10.0])
    for bad in ({"lo_s": 0}, {"lo_s": -1.0}, {"hi_s": 0}, {"hi_s": -2.0}):
        with pytest.raises(ValueError):
            s.histogram(scale="log", **bad)
    assert s.histogram(bins=1, scale="log", lo_s=0.5) == [(0.5, 10.0, 3)]  # a bound under 1 s is a bound
    assert s.histogram(bins=1, scale="log", lo_s=2.0) == [(2.0, 10.0, 3)]
    assert s.histogram(bins=1, scale="log", hi_s=0.5, lo_s=0.1) == [(0.1, 0.5, 3)]
    assert s.histogram(bins=1, scale="linear", lo_s=0) == [(0.0, 10.0, 3)]  # linear: 0 is a bound
    z = filled([0.0, 0.5, 2.0, 8.0])  # auto bounds with a 0 s step: from the smallest positive one
    assert z.histogram(bins=2, scale="log") == [(0.5, 2.0, 2), (2.0, 8.0, 2)]
    zeros = filled([0.0, 0.0, 0.0])
    assert zeros.histogram(scale="log") == [(0.0, 0.0, 3)] and zeros.histogram(scale="linear") == [(0.0, 0.0, 3)]
    sub = filled([0.2, 0.4, 0.8])  # every step under a second: a histogram all the same
    assert sub.histogram(bins=2, scale="log") == [(0.2, pytest.approx(0.4), 1), (pytest.approx(0.4), 0.8, 2)]
    one = filled([0.7, 0.7])
    assert one.histogram(scale="log") == [(0.7, 0.7, 2)]
