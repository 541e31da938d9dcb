"""StepStats: nearest-rank percentiles by hand, the first step excluded, throughput, ETA, histogram."""

from __future__ import annotations

import dataclasses
import math
import random
import subprocess
import sys

import pytest
from sortedcontainers import SortedList

from conftest import step_controls
from stepwatch.monitors.stats.stepstats import StepRecord, StepStats, check_step_seconds, nearest_rank, nearest_rank_index


def _controls():
    return step_controls()


def feed(values, first=None, start_step=1):
    """A StepStats fed ``first`` (flag "first", when given) and then ``values`` in order."""
    s = StepStats()
    step = start_step
    if first is not None:
        assert s.add(step, first, flags=["first"]) is False
        step += 1
    for v in values:
        assert s.add(step, v) is True
        step += 1
    return s


# ---------------------------------------------------------------- nearest rank by hand


def test_n1_every_percentile_is_the_only_counted_step():
    s = feed([7.25], first=99.0)
    assert s.summary() == {"n": 1, "min": 7.25, "p50": 7.25, "p90": 7.25, "p99": 7.25, "max": 7.25, "last": 7.25}


def test_n2_by_hand():
    # sorted [2.0, 4.0]: p50 rank ceil(0.5*2)=1 -> 2.0; p90 rank ceil(1.8)=2 -> 4.0; p99 rank ceil(1.98)=2
    s = feed([4.0, 2.0], first=50.0)
    assert s.summary() == {"n": 2, "min": 2.0, "p50": 2.0, "p90": 4.0, "p99": 4.0, "max": 4.0, "last": 2.0}


def test_n3_by_hand():
    # sorted [1, 3, 5]: p50 rank ceil(1.5)=2 -> 3; p90 rank ceil(2.7)=3 -> 5; p99 rank ceil(2.97)=3 -> 5
    s = feed([5.0, 1.0, 3.0], first=100.0)
    assert s.summary() == {"n": 3, "min": 1.0, "p50": 3.0, "p90": 5.0, "p99": 5.0, "max": 5.0, "last": 3.0}


def test_n100_by_hand():
    # values 1..100: p50 rank 50 -> 50; p90 rank 90 -> 90; p99 rank ceil(99.0)=99 -> 99 (not 100:
    # 0.99*100 must not round up through a float)
    vals = [float(v) for v in range(1, 101)]
    random.Random(3).shuffle(vals)
    s = feed(vals, first=1000.0)
    su = s.summary()
    assert (su["n"], su["min"], su["p50"], su["p90"], su["p99"], su["max"]) == (100, 1.0, 50.0, 90.0, 99.0, 100.0)


def test_n101_by_hand():
    # values 1..101: p50 rank ceil(50.5)=51; p90 rank ceil(90.9)=91; p99 rank ceil(99.99)=100
    vals = [float(v) for v in range(1, 102)]
    random.Random(4).shuffle(vals)
    s = feed(vals, first=0.5)
    su = s.summary()
    assert (su["n"], su["min"], su["p50"], su["p90"], su["p99"], su["max"]) == (101, 1.0, 51.0, 91.0, 100.0, 101.0)
    assert s.excluded_first == 1 and s.seen == 102


def test_first_step_is_excluded_not_the_slowest():
    # On a variable-width run step 1 (the compile) need not be the maximum: an ordinary long batch
    # beats it. Excluding the slowest would drop 60.0 and keep 30.0 (ARCHITECTURE.md R2).
    s = feed([10.0, 60.0, 20.0], first=30.0)
    assert s.n == 3
    assert s.max == 60.0 and s.min == 10.0
    assert 30.0 not in [r.dt_s for r in s.recent() if r.counted]


def test_first_of_each_process_is_excluded():
    s = StepStats()
    s.add(1, 40.0, ["first"])
    for i in range(2, 6):
        s.add(i, 10.0)
    s.add(6, 45.0, ["first"])  # a second process in the same attempt
    s.add(7, 11.0)
    assert s.n == 5 and s.excluded_first == 2 and s.max == 11.0


def test_only_a_first_step_means_no_statistics():
    s = feed([], first=45.79)
    assert s.summary() == {"n": 0, "min": None, "p50": None, "p90": None, "p99": None, "max": None, "last": None}
    assert s.canonical_line() == "n=0 seconds_per_optimizer_step"
    assert s.percentile(50) is None and s.histogram() == [] and s.recent_p50() is None


def test_nearest_rank_helpers():
    assert nearest_rank_index(0, 5) == 0
    assert nearest_rank_index(100, 5) == 4
    assert nearest_rank([1, 2, 3, 4], 50) == 2
    with pytest.raises(ValueError):
        nearest_rank_index(50, 0)
    with pytest.raises(ValueError):
        nearest_rank_index(101, 3)


def test_canonical_line_format():
    s = feed([11.84, 19.48, 28.96, 45.79, 19.0], first=60.0)
    assert s.canonical_line() == "n=5 min=11.84 p50=19.48 p99=45.79 max=45.79 seconds_per_optimizer_step"


def test_the_reference_runs_distribution_order_statistics():
    """The seeded control reproduces ARCHITECTURE.md "Reference runs" exactly (over all 1,445 steps, step 1 included)."""
    sc = _controls()
    dts = sc.real_distribution_durations(0)
    assert len(dts) == 1445 and dts[0] == 45.79
    allv = sorted(dts)
    assert (allv[0], nearest_rank(allv, 50), nearest_rank(allv, 99), allv[-1]) == (11.84, 19.75, 30.52, 45.79)
    # the statistic stepwatch reports: first step excluded, n counts only counted steps
    s = StepStats()
    for r in sc.real_distribution(0).records:
        s.add_record(r)
    assert s.n == 1444 and s.min == 11.84 and s.max <= 45.79
    line = s.canonical_line()
    assert line.startswith("n=1444 min=11.84 p50=") and line.endswith(" seconds_per_optimizer_step")


# ---------------------------------------------------------------- validation and bounds


@pytest.mark.parametrize("bad", [-0.1, math.nan, math.inf, "x", None])
def test_bad_durations_raise(bad):
    with pytest.raises(ValueError):
        StepStats().add(1, bad)


def test_record_with_unknown_dt_is_skipped():
    s = StepStats()
    assert s.add_record({"kind": "step", "step": 3, "dt": None, "flags": []}) is False
    assert s.add_record({"kind": "step", "step": 4, "dt": 2.5, "flags": [], "tokens": 10, "padded_tokens": 12})
    assert s.n == 1 and s.seen == 1 and s.last_step == 4


def test_recent_history_is_bounded():
    s = StepStats(recent_maxlen=50, window=10)
    for i in range(1000):
        s.add(i, 1.0 + (i % 7))
    assert s.n == 1000 and len(s.recent()) == 50 and s.recent()[-1].step == 999
    assert len(s.recent(5)) == 5 and s.recent(0) == []


# ---------------------------------------------------------------- throughput and ETA


def test_throughput_by_hand():
    s = StepStats()
    s.add(1, 100.0, ["first"], tokens=1, padded_tokens=1)  # excluded: it carries the compile
    s.add(2, 2.0, tokens=900, padded_tokens=1000)
    s.add(3, 3.0, tokens=1400, padded_tokens=2000)
    tp = s.throughput()
    assert tp["tokens_per_s"] == pytest.approx(3000 / 5.0)
    assert tp["real_tokens_per_s"] == pytest.approx(2300 / 5.0)
    assert tp["padding_share"] == pytest.approx(1 - 2300 / 3000)


def test_throughput_unknown_is_none_never_zero():
    s = feed([1.0, 2.0])
    assert s.throughput() == {"tokens_per_s": None, "real_tokens_per_s": None, "padding_share": None}
    s.add(9, 2.0, tokens=500)  # real tokens only: padded unknown
    tp = s.throughput()
    assert tp["tokens_per_s"] is None and tp["padding_share"] is None
    assert tp["real_tokens_per_s"] == pytest.approx(500 / 2.0)


def test_eta_from_recent_p50():
    s = StepStats(window=5)
    for i, v in enumerate([100.0, 100.0, 100.0, 20.0, 20.0, 21.0, 19.0, 20.0]):
        s.add(i + 1, v)
    # recent window = [20, 20, 21, 19, 20] -> nearest-rank p50 = 20
    assert s.recent_p50() == 20.0


def test_eta_from_the_median_of_the_recent_steps_and_the_step_in_progress():
    from stepwatch.monitors.snapshot.eta import eta_part

    ok = {"state": "ok", "current_step_elapsed_s": 5.0}
    e = eta_part([100.0, 100.0, 100.0, 20.0, 20.0, 21.0, 19.0, 20.0], 1312, 1300, ok, True, 1000.0)
    # the median of the 8 steps (nearest rank: the 4th of 8 sorted) = 20 s; 5 s of step 1301 are gone
    assert (e["seconds_per_step"], e["remaining_steps"], e["state"]) == (20.0, 12, "ok")
    assert e["eta_s"] == pytest.approx(15.0 + 11 * 20.0) and e["end_at_unix"] == pytest.approx(1000.0 + e["eta_s"])
    assert eta_part([20.0], 1312, 1312, ok, True, 0.0)["eta_s"] == 0.0
    assert eta_part([20.0], 10, 3, {"state": "stalled", "current_step_elapsed_s": 900.0}, True, 0.0)["state"] == "stalled"
    for args in (([20.0], None, 5), ([20.0], 10, None), ([], 10, 5)):
        assert eta_part(*args, ok, True, 0.0)["state"] == "not judged"
    assert eta_part([20.0], 10, 5, ok, False, 0.0)["basis"] == "the run is not running"


def test_the_eta_follows_a_20x_slowdown_within_10_steps():
    from stepwatch.monitors.snapshot.eta import eta_part

    dts = [0.01] * 100
    for k in range(1, 11):
        dts.append(0.2)
        e = eta_part(dts, 1000, 100 + k, {"state": "ok", "current_step_elapsed_s": 0.0}, True, 0.0)
        if e["seconds_per_step"] == 0.2:
            break
    assert k <= 10 and e["eta_s"] == pytest.approx((1000 - 100 - k) * 0.2, rel=0.01), (k, e)
    assert k > 1  # one slow step (a save) does not move it


# ---------------------------------------------------------------- histogram


def test_histogram_shows_the_second_mode():
    """A partial fallback's 400 s steps are a second hump, with empty bins between the modes."""
    rng = random.Random(1)
    vals = [20.0 * rng.uniform(0.8, 1.3) for _ in range(170)] + [400.0 * rng.uniform(0.9, 1.1) for _ in range(30)]
    s = feed(vals, first=60.0)
    h = s.histogram(bins=12, scale="log")
    assert sum(c for _, _, c in h) == s.n == 200
    counts = [c for _, _, c in h]
    assert counts[0] > 0 and counts[-1] > 0 and 0 in counts[1:-1]
    assert sum(c for lo, hi, c in h if lo >= 100) == 30
    assert h[0][0] == s.min and h[-1][1] == s.max
    lin = s.histogram(bins=5, scale="linear", lo_s=0.0, hi_s=500.0)  # edges 0, 100, ..., 500
    assert [c for _, _, c in lin][:3] == [170, 0, 0] and sum(c for _, _, c in lin[3:]) == 30


def test_histogram_edges_and_errors():
    s = feed([5.0, 5.0])
    assert s.histogram() == [(5.0, 5.0, 2)]
    with pytest.raises(ValueError):
        s.histogram(bins=0)
    with pytest.raises(ValueError):
        s.histogram(scale="sqrt")
    with pytest.raises(ValueError):
        s.histogram(lo_s=0.0, scale="log")


# ---------------------------------------------------------------- the fast add changed no output


def _same(a, b):
    """Equal, and the same sign of zero (0.0 and -0.0 compare equal)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return a == b


@pytest.mark.parametrize("seed", range(20))
def test_deferred_sorting_reads_what_one_add_per_step_gives(seed):
    """add() only appends; the sorted list takes the new steps at the next read (one sort for a
    big batch, one SortedList.add each for a few). Against a SortedList fed at every add, with reads
    after every step, every 7th, or only at the end, and many 0.0 / -0.0 steps (equal but not the
    same: their order decides which one a percentile returns)."""
    rng = random.Random(seed)
    s, ref = StepStats(), SortedList()
    every = rng.choice([1, 7, 10**9])
    n = rng.choice([30, 3000])
    for i in range(n):
        dt = rng.choice([0.0, -0.0, 5e-324, round(rng.lognormvariate(3, 0.5), rng.choice([1, 6]))])
        first = rng.random() < 0.02
        assert s.add(i, dt, ["first"] if first else ()) is not first
        if not first:
            ref.add(dt)
        if i % every == 0 or i == n - 1:
            assert s.n == len(ref)
            for p in (0, 1, 10, 25, 50, 75, 90, 99, 99.9, 100):
                assert _same(s.percentile(p), nearest_rank(ref, p) if ref else None), (i, p)
            if ref:
                assert _same(s.min, ref[0]) and _same(s.max, ref[-1])
                assert sum(c for _, _, c in s.histogram(bins=7, scale="linear")) == len(ref)


@pytest.mark.parametrize("zeros", [(0.0, -0.0), (0.0,)])
def test_a_backlog_sorted_as_an_array_reads_what_one_add_per_step_gives(zeros):
    """A backlog's durations (2**16 and more) are sorted as an array at the first read: equal values in the order
    one add per step leaves them, the signs of many 0.0 and -0.0 steps at every rank included."""
    rng = random.Random(3)
    dts = [rng.choice(zeros) if rng.random() < 0.4 else round(rng.lognormvariate(3, 0.5), 1) for _ in range(70_000)]
    s, ref = StepStats(), SortedList()
    for i, dt in enumerate(dts):
        s.add(i, dt)
    ref.update(dts)  # a SortedList keeps equals in the order added, as one add per step does
    assert s.n == len(ref)
    for k in range(0, len(ref), 97):
        p = 100.0 * (k + 1) / len(ref)
        assert _same(s.percentile(p), nearest_rank(ref, p)), k


def test_add_builds_the_dataclass_record():
    s = StepStats()
    s.add(7, 19.5, ["save"], 26048, 26112, 1.5)
    s.add(8, 45.79, ["first"], True, -3, None)
    a, b = s.recent()
    assert type(a) is StepRecord and a == StepRecord(7, 19.5, ("save",), 26048, 26112, 1.5, False)  # R18
    assert hash(a) == hash(StepRecord(7, 19.5, ("save",), 26048, 26112, 1.5, False))
    assert repr(b) == repr(StepRecord(8, 45.79, ("first",), 1, None, None, False))
    assert dataclasses.astuple(b) == (8, 45.79, ("first",), 1, None, None, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.dt_s = 1.0


def test_fast_argument_checks_give_the_same_values_and_errors():
    """The inline checks for plain floats and ints in add() against the general helpers."""
    s = StepStats()
    for dt in (-1.0, float("nan"), float("inf"), "x", None):
        with pytest.raises(ValueError):
            s.add(1, dt)
    assert s.seen == 0
    s.add(1, 7, (), 5, 0)  # an int dt, and 0 tokens
    s.add(2, "2.5", (), 5.9, "12")  # strings and floats go through the helpers
    s.add(3, -0.0, (), -1, 2**70)
    r1, r2, r3 = s.recent()
    assert (r1.dt_s, type(r1.dt_s), r1.tokens, r1.padded_tokens) == (7.0, float, 5, 0)
    assert (r2.dt_s, r2.tokens, r2.padded_tokens) == (2.5, 5, 12)
    assert math.copysign(1.0, r3.dt_s) == -1.0 and (r3.tokens, r3.padded_tokens) == (None, 2**70)


# ---------------------------------------------------------------- hygiene


@pytest.mark.system
def test_monitors_stay_headless():
    code = (
        "import sys, stepwatch.monitors.stats.stepstats, stepwatch.monitors.detectors.fallback;"
        "bad=[m for m in sys.modules if m.split('.')[0] in ('textual','launcher','tui','torch')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def _stats_state(s):
    return repr((s.n, s.seen, s.excluded_first, s.last_step, s.summary(), s.canonical_line(), s.recent(),
                 s.recent_p50(), s.throughput(), s.histogram(bins=9)))


@pytest.mark.parametrize("seed", range(12))
def test_add_many_is_add_one_by_one(seed):
    """add_many() builds records only for what the deques keep; in chunks of every size it leaves
    what one add() per row leaves, whatever the share of `first` steps (which the window skips)."""
    rng = random.Random(seed)
    recent, window = rng.choice([(4096, 200), (50, 20), (10, 30), (1, 1)])
    one, many = StepStats(recent, window), StepStats(recent, window)
    first_share = rng.choice([0.0, 0.02, 0.5, 0.97])
    rows = []
    for i in range(rng.choice([0, 5, 300, 6000])):
        flags = rng.choice([["first"], ("first", "save")]) if rng.random() < first_share else rng.choice([[], None, ["save"]])
        rows.append((i, rng.choice([rng.lognormvariate(0, 0.3), 0.0, 2]), flags,
                     rng.choice([None, 4096, -1, "12"]), rng.choice([None, 8192]), rng.choice([None, 1.7e9 + i])))
    i = 0
    while i < len(rows):
        chunk = rows[i : i + rng.choice([1, 3, 64, 5000, 10**6])]
        assert many.add_many(chunk) == sum(one.add(*r) for r in chunk)
        i += len(chunk)
        assert _stats_state(many) == _stats_state(one)
    assert many.add_many([]) == 0 and _stats_state(many) == _stats_state(one)


@pytest.mark.parametrize("seed", range(12))
def test_a_backlog_of_float_durations_added_at_once_is_one_add_per_row(seed):
    """A backlog whose durations are all floats and whose flags are lists or tuples (what a fold hands it) is added
    by column: the same state as one add() per row, whatever the share of uncounted steps and where they fall."""
    rng = random.Random(seed)
    recent, window = rng.choice([(4096, 200), (50, 20), (10, 30), (1, 1), (3000, 2999)])
    one, many = StepStats(recent, window), StepStats(recent, window)
    share = rng.choice([0.0, 0.001, 0.02, 0.5, 0.97])
    rows = []
    for i in range(rng.choice([1024, 3000, 9000])):
        flags = rng.choice([["first"], ("save",), ["eval", "x"], ["stopped"], ["silent"]]) if rng.random() < share \
            else rng.choice([[], ()])
        rows.append((i, rng.choice([rng.lognormvariate(0, 0.3), 0.0, -0.0]), flags, rng.choice([None, 4096]), None,
                     None))
    assert many.add_many(rows) == sum(one.add(*r) for r in rows)
    assert _stats_state(many) == _stats_state(one)
    more = rows[:1500]
    assert many.add_many(more) == sum(one.add(*r) for r in more) and _stats_state(many) == _stats_state(one)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_backlogs_array_of_durations_is_checked_as_a_list_of_them_is(bad):
    """A fold hands its durations as an array of floats: one that add() refuses raises what add() raises, with
    the rows before it added; a clean array adds as the same rows in a list do."""
    from array import array

    rows = [(i, 1.0 + (i % 7) / 10, (), None, None, None) for i in range(6000)]  # the first ~1,900 add no record
    cols = [list(map(lambda r, k=k: r[k], rows)) for k in range(6)]
    durations = [float(r[1]) for r in rows]
    one, ref = StepStats(), StepStats()
    assert one.add_columns(cols[0], array("d", durations), *cols[2:]) == ref.add_many(rows)
    assert _stats_state(one) == _stats_state(ref)
    dts = array("d", durations)
    dts[1000] = bad
    got, want = StepStats(), StepStats()
    with pytest.raises(ValueError):
        got.add_columns(cols[0], dts, *cols[2:])
    for r in rows[:1000]:
        want.add(*r)
    assert _stats_state(got) == _stats_state(want)


@pytest.mark.parametrize("bad_at", [0, 3, 30, 47])
@pytest.mark.parametrize("bad", [(float("inf"), [], ValueError), (-1.0, [], ValueError), (10**400, [], ValueError),
                                 (1.0, 5, TypeError)])
def test_add_many_raises_like_add_and_keeps_the_rows_before(bad_at, bad):
    """Wherever the bad row sits (among the rows whose records are skipped, or the kept tail), the
    rows before it are added in full, records included, and add()'s error comes out."""
    dt, flags, err = bad
    s, ref = StepStats(recent_maxlen=10, window=5), StepStats(recent_maxlen=10, window=5)
    rows = [(i, 1.0 + i / 100, ["first"] if i == 0 else [], 4096, 8192, 1.7e9 + i) for i in range(50)]
    for r in rows[:bad_at]:
        ref.add(*r)
    with pytest.raises(err):
        ref.add(bad_at, dt, flags)
    with pytest.raises(err):
        s.add_many(rows[:bad_at] + [(bad_at, dt, flags, None, None, None)] + rows[bad_at + 1 :])
    assert _stats_state(s) == _stats_state(ref)


def test_add_many_reads_flags_given_as_an_iterator_once():
    s, ref = StepStats(), StepStats()
    rows = [(1, 45.0, iter(["first"]), None, None, None), (2, 1.0, iter([]), None, None, None)]
    ref.add(1, 45.0, iter(["first"]))
    ref.add(2, 1.0, iter([]))
    assert s.add_many(rows) == 1 and _stats_state(s) == _stats_state(ref) and s.excluded_first == 1


@pytest.mark.parametrize("seed", range(8))
def test_a_series_given_its_points_at_once_has_the_bins_one_point_at_a_time_gives(seed):
    """add_many (a fold's read of log records) keeps the same bins, merges, last values and NaN/inf counts as one
    add() per point, equal values (0.0 and -0.0) included."""
    from stepwatch.monitors.stats.minmax import MinMaxSeries

    rng = random.Random(seed)
    one = MinMaxSeries(max_bins=rng.choice([2, 8, 512]))
    many = MinMaxSeries(max_bins=one.max_bins)
    for _ in range(rng.choice([1, 5, 40])):
        k = rng.choice([1, 3, 100, 2000])
        steps = [rng.choice([None, rng.randrange(10**6)]) for _ in range(k)]
        values = [rng.choice([rng.uniform(-1, 1), 0.0, -0.0, 1.0, float("nan") if rng.random() < 0.05 else 2.0,
                              float("inf") if rng.random() < 0.02 else -2.0]) for _ in range(k)]
        for st, v in zip(steps, values):
            one.add(st, v)
        many.add_many(steps, values)
        assert repr(many.bins) == repr(one.bins) and many.per_bin == one.per_bin
        assert (many.nonfinite, many.first_nonfinite_step, many.first_nonfinite_is_last) == \
            (one.nonfinite, one.first_nonfinite_step, one.first_nonfinite_is_last)
    # the first NaN the last point of one read, finite points next: it is no longer the newest point
    one, many = MinMaxSeries(max_bins=4), MinMaxSeries(max_bins=4)
    for steps, values in ((list(range(100)), [1.0] * 100), ([101, 102, 103], [1.0, 2.0, float("nan")]),
                          ([104, 105], [1.5, 0.5])):  # bins of 32 points by then: the last two fill the newest
        for st, v in zip(steps, values):
            one.add(st, v)
        many.add_many(steps, values)
        assert repr(many.bins) == repr(one.bins) and many.first_nonfinite_is_last == one.first_nonfinite_is_last
    many.restep_last(9)
    one.restep_last(9)
    assert many.first_nonfinite_step == one.first_nonfinite_step == 103


def test_a_whole_runs_metric_series_keeps_every_spike_in_bounded_bins():
    from stepwatch.monitors.stats.minmax import MinMaxSeries

    s = MinMaxSeries(max_bins=16)
    for step in range(1, 10_001):
        s.add(step, 50.0 if step == 6_789 else float("nan") if step == 9_000 else 1.0 / step)
    assert len(s.bins) <= 16 and s.per_bin >= 10_000 // 16
    assert s.bins[0].first_step == 1 and s.bins[-1].last_step == 10_000
    assert sum(b.n for b in s.bins) == 10_000 and sum(b.nonfinite for b in s.bins) == 1
    spike = next(b for b in s.bins if b.first_step <= 6_789 <= b.last_step)
    assert spike.hi == 50.0  # never averaged away
    assert max(b.hi for b in s.bins) == 50.0 and s.bins[0].hi == 1.0
    control = MinMaxSeries(max_bins=16)
    for step in range(1, 10_001):
        control.add(step, 1.0 / step)
    assert max(b.hi for b in control.bins) == 1.0  # without the spike: no 50 anywhere
    assert control.as_json()[0][:3] == [1, control.bins[0].last_step, control.bins[0].lo]


# ------------------------------------------------------------------------------------------------
# StepStats at its edges: which durations
# and token counts are taken, the default sizes, add_many's fast path against one add per row for each shape of
# deques, the recent slice, the window's median, throughput's sums and their zero cases, and the histogram's exact
# edges and bounds on both scales.


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


def test_a_step_that_held_an_evaluation_or_a_save_is_no_step_time():
    """ARCHITECTURE.md R18: the percentiles count training intervals only; the control: a recompile
    flag (the step trained) is counted."""
    s = StepStats()
    s.add(0, 9.0, ["first"])
    for i in range(1, 21):
        s.add(i, 0.1)
    s.add(21, 20.0, ["save"])
    s.add(22, 5.0, ["eval"])
    s.add(23, 0.3, ["recompile"])
    assert (s.n, s.max, s.excluded_first, s.excluded_phase) == (21, 0.3, 1, 2)
    many = StepStats()
    many.add_many([(0, 9.0, ["first"], None, None, None), (1, 20.0, ["eval", "save"], None, None, None),
                   (2, 0.1, [], None, None, None)])
    assert (many.n, many.max, many.excluded_phase) == (1, 0.1, 1)
