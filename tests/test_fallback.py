"""The eager-fallback detector (monitors/detectors/fallback.py and its baseline, baseline.py), by behaviour.

What it says about a run: the verdict of every step (expected time, score, trip point, state), the
status JSON's ``fallback`` and ``warmup`` objects, and the reason in words, on

* exact streams (steady steps of 2.0 s: scores exactly 1.0, jitter sigma 0, the trip its minimum
  6.0x = 12.0 s; slow steps of 40.0 s, 20x; valley steps of 8.0 s, 4x, between trip / 2 and the
  trip), each expected figure derived in the comment beside it, not read back from the code;
* the seeded negative and positive controls (tests/fixtures/step_controls.py; bench/detector_controls.py
  prints the same runs as a table with the trip point's margins) and the real captures (tests/fixtures/real/);
* readable golden files, tests/golden/fallback/: every verdict on the controls, the real captures and
  60 odd streams. A change of a verdict or of a word shows as a text diff; rewrite them with
  ``python -m pytest tests/test_fallback.py --update-golden`` and review the diff.
"""

from __future__ import annotations

import math
import random

import pytest
from conftest import step_controls
from sortedcontainers import SortedList

from stepwatch.monitors.detectors.baseline import NEIGHBORS, Baseline
from stepwatch.monitors.detectors.fallback import (
    EXEMPT_FLAGS,
    FLAG_WINDOW,
    STEADY_RUN,
    TRIP_RATIO_MIN,
    FallbackDetector,
)
from stepwatch.monitors.stats.stepstats import nearest_rank

sc = step_controls()

# ---------------------------------------------------------------- exact streams: the words and numbers

STEADY, SLOW, VALLEY = 2.0, 40.0, 8.0
HOW = ("baseline p50 2.00 s/step over the last {n} steady steps; trip 6.0x expected (= max(6x, 1 + 10 x "
       "jitter sigma 0.000); at the baseline 12.0 s)")


def _steady(d: FallbackDetector | None = None, n: int = 30) -> FallbackDetector:
    """``n`` steps of 2.0 s from step 0: steady after the 20th (step 19), its baseline those 20 steps
    plus every accepted one after."""
    d = d or FallbackDetector()
    for i in range(n):
        d.add(i, STEADY)
    return d


def _feed(d: FallbackDetector, first: int, times: list[float]) -> int:
    for k, t in enumerate(times):
        d.add(first + k, t)
    return first + len(times)


def test_the_warm_up_in_words_counts_its_steps():
    d = FallbackDetector()
    words = "warming up: {} counted step{}, no steady state yet (20 consecutive steps within 3x of the preceding ones needed; the longest current run is {}); warm-up alone never flags"
    assert d.reason() == words.format(0, "s", 0)
    d.add(0, STEADY)
    assert d.reason() == words.format(1, "", 1)
    d.add(1, STEADY)
    assert d.reason() == words.format(2, "s", 2)
    d.add(2, SLOW)  # 20x the steps before it: the run of in-band steps starts again
    assert d.reason() == words.format(3, "s", 0)
    assert d.warmup() == {"state": "warming", "until_step": None}


def test_ok_with_isolated_slow_steps_names_them_as_not_a_second_mode():
    d = _steady()  # baseline: 20 + steps 20..29 = 30 steps
    assert d.reason() == f"ok: {HOW.format(n=30)}; slowest steady step 1.00x expected"
    nxt = _feed(d, 30, [SLOW] + [STEADY] * 40)  # the slow step leaves the 40-step window: ok again
    assert d.state == "ok" and d.slow_steps == [30]
    assert d.reason() == (f"ok: {HOW.format(n=70)}; slowest steady step 1.00x expected; 1 isolated slow step earlier "
                          "(last: step 30, 40.00 s = 20.0x) — not a second mode")
    _feed(d, nxt, [SLOW] + [STEADY] * 40)
    assert d.reason().endswith("; 2 isolated slow steps earlier (last: step 71, 40.00 s = 20.0x) — not a second mode")


def test_a_busy_silence_alone_is_no_suspicion_but_counts_towards_a_second_mode():
    """The supervisor flags ``silent`` the step whose interval it saw busy but silent past the step budget (an
    unannounced save): alone it never makes the detector suspect; three slow steps, it among them, still flag."""
    d = _steady()
    d.add(30, SLOW, flags=["silent"])
    assert d.state == "ok" and d.slow_steps == [30]
    assert d.reason().endswith("1 isolated slow step earlier (last: step 30, 40.00 s = 20.0x, busy but silent: "
                               "a save or an evaluation the log does not name?) — not a second mode")
    d.add(31, SLOW)  # the control: a slow step the supervisor did not see silent makes the pair suspected
    assert d.state == "suspected" and d.onset_step == 30
    d.add(32, SLOW, flags=["silent"])
    assert d.state == "flagged"  # an eager fallback whose steps outlast the step budget still flags


@pytest.mark.parametrize("flag", ["stopped", "idle"])
def test_a_step_whose_interval_held_a_stopped_process_or_a_stall_is_excused(flag):
    d = _steady()
    d.add(30, SLOW * 5, flags=[flag])
    assert d.state == "ok" and d.slow_steps == [] and d.details()["excused_steps"][-1][:2] == (30, flag)


def test_suspected_names_its_slow_steps_one_or_more():
    d = _steady()
    d.add(30, SLOW)
    assert d.state == "suspected" and d.onset_step == 30
    assert d.reason() == (f"suspected: unexplained slow step 30: 40.00 s (20.0x); {HOW.format(n=30)}; "
                          "flags at 3 slow steps within 40 judged steps")
    d.add(31, STEADY)
    d.add(32, SLOW)
    assert d.state == "suspected"
    assert d.reason().startswith("suspected: unexplained slow steps 30: 40.00 s (20.0x), 32: 40.00 s (20.0x); ")


def test_slow_steps_that_continue_the_runs_own_tail_stay_suspected_and_say_so():
    """3 valley steps (4x, between 3.0x and 6.0x) then 3 slow steps: the slow ones are not a separate
    mode (a mode is separated by a valley with fewer steps than its own)."""
    d = _steady()
    _feed(d, 30, [VALLEY] * 3 + [SLOW] * 3)
    assert d.state == "suspected" and d.details()["valley"] == 3
    assert d.reason().endswith("flags at 3 slow steps within 40 judged steps with fewer steps between 3.0x and 6.0x "
                               "(now 3): these slow steps continue the run's own tail, not a separate mode yet")
    d.add(36, SLOW)  # a 4th slow step: more slow steps than valley ones now, a mode of its own
    assert d.state == "flagged" and d.details()["flagged_at_step"] == 36
    d2 = _steady()
    assert d2.details()["valley"] == 0
    _feed(d2, 30, [VALLEY, SLOW])
    assert d2.details()["valley"] == 1  # counted once, at the slow step


def test_flagged_in_words_with_its_counts_and_share():
    d = _steady()
    # 3 slow steps in a row flag at the third (judged 2 steps after the onset); 9 more slow, 6 steady after
    _feed(d, 30, [SLOW] * 12 + [STEADY] * 6)
    assert d.state == "flagged" and d.onset_step == 30
    det = d.details()
    assert (det["flagged_at_step"], det["judged_to_flag"], det["slow_after_onset_to_flag"], det["n_slow"]) == (32, 2, 2, 12)
    assert (det["judged"], det["seen"]) == (28, 48)  # judged from step 20; every step seen
    times = ", ".join(f"{s}: 40.00 s (20.0x)" for s in (30, 31, 32))
    # since the onset: 12 slow of 18 judged steps = 66.67% -> 67%; the 6 steady steps after joined the
    # baseline (30 + 6: slow steps never do)
    assert d.reason() == (
        f"flagged: 3 slow steps within 3 judged steps from step 30 ({times}) — a second mode; since the onset 12 of "
        f"18 judged steps were slow (67%); {HOW.format(n=36)}. A compiled graph that falls back to eager runs about "
        "20x slower: look for dynamo's recompile-limit warning in the log and the recompile counts")


@pytest.mark.parametrize("n_slow, more", [(8, ""), (10, " and 2 more")])
def test_a_long_cluster_lists_8_steps_and_counts_the_rest(n_slow, more):
    d = _steady(FallbackDetector(flag_min_slow=n_slow))
    _feed(d, 30, [SLOW] * n_slow)
    assert d.state == "flagged"
    times = ", ".join(f"{s}: 40.00 s (20.0x)" for s in range(30, 38))
    assert d.reason().startswith(f"flagged: {n_slow} slow steps within {n_slow} judged steps from step 30 ({times}{more}) — ")


def test_the_slow_steps_kept_are_the_last_1000():
    d = _steady()
    _feed(d, 30, [SLOW] * 1001)
    assert d.state == "flagged" and d.details()["n_slow"] == 1001
    assert d.slow_steps == list(range(31, 1031))


def test_the_default_windows_and_counts_in_the_words():
    d = _steady(n=19)
    assert d.warmup()["state"] == "warming"  # 19 in-band steps: one short of the 20 needed
    d.add(19, STEADY)
    assert d.warmup()["state"] == "steady"
    d.add(20, SLOW)
    assert "flags at 3 slow steps within 40 judged steps" in d.reason()
    assert "1 + 10 x jitter sigma" in d.reason()


@pytest.mark.parametrize("kwargs", [dict(trip_ratio_min=1.0), dict(steady_band=1.0), dict(drop_factor=1.0),
                                    dict(trip_ratio_min=0.5), dict(steady_band=0.5), dict(drop_factor=0.5), dict(baseline_window=0), dict(steady_run=0),
                                    dict(flag_window=0), dict(flag_min_slow=0)])
def test_settings_out_of_range_are_refused(kwargs):
    with pytest.raises(ValueError):
        FallbackDetector(**kwargs)


def test_settings_at_their_edges_are_taken():
    d = FallbackDetector(trip_ratio_min=1.01, steady_band=1.01, drop_factor=1.01, baseline_window=1, steady_run=1,
                         flag_window=1, flag_min_slow=1)
    assert d.trip_ratio == 1.01 and d.reason().startswith("warming up: 0 counted steps, no steady state yet (1 consecutive")


def test_update_takes_step_records_only():
    d = FallbackDetector()
    for kind in ("summary", "alert", "eval", "compile"):  # sorting before and after "step"
        assert d.update({"kind": kind, "dt": 1.0}) is None
    assert d.update({"kind": "step", "step": 1}) is None  # no dt
    assert d.details()["seen"] == 0
    v = d.update({"kind": "step", "step": 1, "dt": 1.0})
    assert v is not None and v.step == 1 and d.details()["seen"] == 1
    assert d.update({"step": 2, "dt": 1.0}).step == 2  # a record without a kind is a step


def _tokens(kind: str, i: int) -> int | None:
    return {"width": 1000, "none": None, "mixed": 1000 if i % 2 else None, "sparse": None if i % 3 == 0 else 1000,
            "late": 1000 if i >= 30 else None}[kind]


@pytest.mark.parametrize("kind", ["width", "none", "mixed", "sparse", "late"])
def test_a_run_that_gets_4x_faster_relearns_its_level(kind):
    """40 steps of 2.0 s, then 0.5 s steps: once the last 20 steps (STEADY_RUN) all ran under half the
    level (DROP_FACTOR 2), the baseline restarts from them and the warm-up is said to have lasted to
    the last slow-level step; a 4.0 s step is then 8x, slow. One step back at the level within those
    20 holds the restart until it has left them. Per padded token, per step, or mixed."""
    d = FallbackDetector()
    for i in range(40):
        d.add(i, 2.0, (), None, _tokens(kind, i))
    for i in range(40, 59):
        d.add(i, 0.5, (), None, _tokens(kind, i))
    assert d.details()["baseline_s"] == 2.0  # 19 fast steps: not yet
    d.add(59, 0.5, (), None, _tokens(kind, 59))
    assert d.details()["baseline_s"] == 0.5 and d.warmup() == {"state": "steady", "until_step": 39}
    v = d.add(60, 4.0, (), None, _tokens(kind, 60))
    assert (v.score, v.slow, d.state) == (8.0, True, "suspected")

    d = FallbackDetector()
    for i in range(40):
        d.add(i, 2.0, (), None, _tokens(kind, i))
    for i in range(40, 59):
        d.add(i, 0.5, (), None, _tokens(kind, i))
    d.add(59, 2.0, (), None, _tokens(kind, 59))  # back at the level once
    for i in range(60, 79):
        d.add(i, 0.5, (), None, _tokens(kind, i))
    assert d.details()["baseline_s"] == 2.0 and d.warmup()["until_step"] is None  # step 59 still in the last 20
    d.add(79, 0.5, (), None, _tokens(kind, 79))
    assert d.details()["baseline_s"] == 0.5 and d.warmup()["until_step"] == 59


@pytest.mark.parametrize("kind", ["width", "none"])
def test_a_run_exactly_2x_faster_keeps_its_baseline(kind):
    """At exactly half the level (the limit itself), a step keeps the baseline: the drop must be more
    than DROP_FACTOR. (25 such steps: the baseline's own median, over 40 steps at 2.0 s and 25 at
    1.0 s, is still 2.0 s; a restart from the last 20 would make it 1.0 s.)"""
    d = FallbackDetector()
    for i in range(40):
        d.add(i, 2.0, (), None, _tokens(kind, i))
    for i in range(40, 65):
        d.add(i, 1.0, (), None, _tokens(kind, i))
    assert d.details()["baseline_s"] == 2.0 and d.warmup()["until_step"] is None


def test_a_flagged_run_that_gets_faster_keeps_its_baseline_and_its_flag():
    """20 steps 4x faster after a flag (unflagged, a restart: see above): the baseline, 30 steps at
    2.0 s and 20 at 0.5 s, stays at its median 2.0 s."""
    d = _steady()
    _feed(d, 30, [SLOW] * 3 + [0.5] * 20)
    assert d.state == "flagged" and d.details()["baseline_s"] == 2.0


def test_a_wide_warm_up_says_how_many_steps_broke_it():
    """100 counted steps, every 20th one > 3x the steps before it (5 of 100): the words say a run
    this wide needs token counts; with 4 breaks in 100 they do not."""
    for breaks, said in ((5, True), (4, False)):
        d = FallbackDetector()
        for i in range(100):
            d.add(i, 10.0 if i % 20 == 19 and i // 20 < breaks else 1.0)
        assert d.warmup()["state"] == "warming"
        text = d.reason()
        if said:
            assert text.endswith(". 5 of 100 steps ran > 3x the steps before them: a run this wide cannot be judged "
                                 "per step without token counts (tokens / padded_tokens in the step events)"), text
        else:
            assert "steps ran >" not in text


def test_a_long_warm_up_needs_an_in_band_run_half_its_length():
    """40 steps alternating 1.0 s and 5.0 s (each 5.0 s one breaks the run), then 1.0 s steps: the
    warm-up ends once the run of in-band steps is half the counted steps so far, at 40 of 80 (step
    79), not at STEADY_RUN's 20; the words ask for that many."""
    d = FallbackDetector()
    for i in range(40):
        d.add(i, 5.0 if i % 2 else 1.0)
    for i in range(40, 79):
        d.add(i, 1.0)
    assert d.warmup()["state"] == "warming"
    assert "(40 consecutive steps within 3x of the preceding ones needed; the longest current run is 39)" in d.reason()
    d.add(79, 1.0)
    assert d.warmup()["state"] == "steady"


def test_the_warm_up_ends_at_the_last_slow_warm_up_step_even_4096_steps_back():
    """The history the warm-up's end is looked for in holds 4096 steps. Step 0 ran 20 s; then 1,095
    steps of 0.5 s with a 2.0 s one (4x: a break) in every 5; then 3,000 in-band steps of 1.0 s
    (steady_run 3000): at the steady state (level 1.0 s) step 0 is the only one > 3x, the oldest of
    exactly 4096."""
    d = FallbackDetector(steady_run=3000)
    d.add(0, 20.0)
    k = 1
    for _ in range(219):
        for t in (0.5, 0.5, 0.5, 0.5, 2.0):
            d.add(k, t)
            k += 1
    for _ in range(3000):
        d.add(k, 1.0)
        k += 1
    assert k == 4096 and d.warmup() == {"state": "steady", "until_step": 0}


def test_a_step_time_that_is_no_finite_number_is_refused_and_changes_nothing():
    d = _steady()
    before = d.details()
    for bad in (float("inf"), float("nan"), -1.0):
        with pytest.raises(ValueError):
            d.add(99, bad)
    assert d.details() == before


def test_a_flag_at_the_onset_itself_counts_one_judged_step():
    d = _steady(FallbackDetector(flag_min_slow=1))
    d.add(30, SLOW)
    assert d.state == "flagged" and d.details()["judged_to_flag"] == 0
    assert d.reason().startswith("flagged: 1 slow steps within 1 judged steps from step 30 (30: 40.00 s (20.0x)) — ")


def test_an_excused_step_is_scored_against_the_baseline_but_never_counted():
    d = _steady()
    v = d.add(30, 5.0, ["save"])
    assert (v.excused, v.score, v.slow) == ("save", 2.5, False)
    assert d.details()["excused_steps"] == [(30, "save", 2.5)] and d.state == "ok"


def test_a_step_time_given_as_an_int_is_a_float_second():
    v = FallbackDetector().add(0, 2)
    assert v.dt_s == 2.0 and type(v.dt_s) is float


def test_the_steady_baseline_starts_from_the_run_of_in_band_steps_only():
    """5 steps of 0.5 s, then 2.0 s steps: the first six 2.0 s steps are 4x the warm median (0.5 s),
    each a break; from step 11 the median is 2.0 s and the run of in-band steps begins. At step 30 it
    is 20 long: the baseline is those 20 steps, not the break before them nor the 0.5 s ones."""
    d = FallbackDetector()
    for i in range(5):
        d.add(i, 0.5)
    for i in range(5, 31):
        d.add(i, 2.0)
    assert d.warmup()["state"] == "steady"
    assert "over the last 20 steady steps" in d.reason()


@pytest.mark.parametrize("slow_first, kept", [(5, 15), (10, 10)])
def test_a_run_that_starts_on_slow_compile_steps_leaves_them_out_of_the_baseline(slow_first, kept):
    """A run of in-band steps that starts on slower compile steps (9.0 s, 4.5x the level it passes
    into): the baseline is the run less those, when at least half the run is left; the warm-up is
    said to last to the last of them."""
    d = FallbackDetector()
    for i in range(slow_first):
        d.add(i, 9.0)
    for i in range(slow_first, 20):
        d.add(i, 2.0)
    assert d.warmup() == {"state": "steady", "until_step": slow_first - 1}
    assert f"over the last {kept} steady steps" in d.reason() and d.details()["baseline_s"] == 2.0


def test_with_few_scores_the_spread_waits_for_4_and_the_trip_follows_it_from_4():
    """steady_run 3: the baseline and score window start from 3 steps (no spread: fewer than 4 scores),
    and the 4th gives the trip its formula, here above the minimum."""
    d = FallbackDetector(steady_run=3)
    for i, t in enumerate((2.0, 2.0, 2.0)):
        d.add(i, t)
    assert d.warmup()["state"] == "steady" and d.details()["spread_sigma"] is None
    d.add(3, 0.5)  # score 0.25: the scores 0.25, 1, 1, 1; p25 0.25, p75 1 (nearest rank)
    det = d.details()
    assert det["spread_sigma"] == pytest.approx(0.75 / 1.349) and det["trip_ratio"] == pytest.approx(1 + 7.5 / 1.349)


def test_a_baseline_shorter_than_the_short_window_follows_with_widths_coming_late():
    """baseline_window 8 < STEADY_RUN 20: the baseline can be all steps with a width while the last 20
    steps still hold some without; it follows a faster level by its own window alone."""
    d = FallbackDetector(baseline_window=8)
    for i in range(40):
        d.add(i, 2.0)
    for i in range(40, 50):
        d.add(i, 2.0, (), None, 1000)
    for i in range(50, 70):
        d.add(i, 0.5, (), None, 1000)
    # the baseline follows in its own 8 steps; no warm-up is re-opened: a baseline inside the short
    # window has its median step among the last 20, never under half of itself
    assert d.details()["baseline_s"] == 0.5 and d.warmup() == {"state": "steady", "until_step": None}


def test_the_slowest_steady_step_is_the_first_of_the_slowest():
    d = _steady()
    _feed(d, 30, [STEADY, 3.0, STEADY, 2.5, 3.0, STEADY])  # 1.5x at steps 31 and 34, 1.25x at 33
    det = d.details()
    assert (det["max_ok_score"], det["max_ok_step"]) == (1.5, 31)
    assert d.reason() == f"ok: {HOW.format(n=36)}; slowest steady step 1.50x expected"


def test_a_cluster_after_an_isolated_slow_step_counts_only_its_own_since_the_onset():
    """An isolated slow step at 30, 40 steady steps, then 3 slow in a row: flagged from step 71, and
    since that onset 3 of the 3 judged steps were slow (the earlier one is not the cluster's)."""
    d = _steady()
    nxt = _feed(d, 30, [SLOW] + [STEADY] * 40)
    _feed(d, nxt, [SLOW] * 3)
    assert d.state == "flagged" and d.onset_step == 71 and d.details()["n_slow"] == 4
    assert "— a second mode; since the onset 3 of 3 judged steps were slow (100%); " in d.reason()


def test_a_run_of_two_widths_that_gets_4x_faster_relearns_per_padded_token():
    """Steps of 1000 padded tokens at 2.0 s and 2000 at 4.0 s (the same time per token), then the same
    widths at 0.5 s and 1.0 s: every step is 4x faster per token, so the baseline restarts (per step,
    the 1.0 s steps would sit exactly at half the median 2.0 s and keep it)."""
    d = FallbackDetector()
    for i in range(40):
        d.add(i, 2.0 if i % 2 else 4.0, (), None, 1000 if i % 2 else 2000)
    for i in range(40, 60):
        d.add(i, 0.5 if i % 2 else 1.0, (), None, 1000 if i % 2 else 2000)
    assert d.details()["baseline_s"] == 0.5 and d.warmup() == {"state": "steady", "until_step": 39}


# ---------------------------------------------------------------- exact streams: the edges of the numbers


def test_the_settings_are_keyword_only():
    with pytest.raises(TypeError):
        FallbackDetector(6.0)  # type: ignore[misc]
    assert FallbackDetector(trip_ratio_min=6.0).trip_ratio_min == 6.0


def test_the_baseline_is_the_lower_median_of_the_last_200_accepted_steps():
    """300 steps of 2.0 s (the baseline holds the last 200), then 2.5 s steps (1.25x, accepted): after
    100 of them the 200 kept are 100 of each, lower median 2.0 s; the 101st evicts one more 2.0 s."""
    d = _steady(n=300)
    _feed(d, 300, [2.5] * 100)
    assert d.details()["baseline_s"] == 2.0
    d.add(400, 2.5)
    assert d.details()["baseline_s"] == 2.5


@pytest.mark.parametrize("fast_s, relearns", [(0.8, True), (1.0, False)])
def test_a_run_2_5x_faster_relearns_its_level(fast_s, relearns):
    """DROP_FACTOR 2: 20 steps 2.5x faster (0.8 s, under half of 2.0 s) restart the baseline; 2x
    (1.0 s, the limit itself) does not."""
    d = _steady(n=40)
    _feed(d, 40, [fast_s] * 20)
    assert d.details()["baseline_s"] == (fast_s if relearns else 2.0)


@pytest.mark.parametrize("lead, until", [([], 0), ([1.0], None)])
def test_the_warm_up_history_holds_4096_steps_not_one_more(lead, until):
    """As the 4096-step warm-up case above: a 20 s step 0, 1,095 steps of 0.5 s with a 2.0 s break
    in every 5, 3,000 steps of 1.0 s (steady_run 3000). One more step after step 0 puts it 4,097
    steps back: out of the history, so no step is found slower than 3x the level."""
    d = FallbackDetector(steady_run=3000)
    times = [20.0] + lead + [0.5, 0.5, 0.5, 0.5, 2.0] * 219 + [1.0] * 3000
    _feed(d, 0, times)
    assert len(times) == 4096 + len(lead)
    assert d.warmup() == {"state": "steady", "until_step": until}


def test_two_exempt_flags_excuse_a_step_by_the_first_in_order():
    """EXEMPT_FLAGS in order: first, recompile, save, eval, then the supervisor's stopped and idle. A step
    flagged both eval and save is excused as save; one flagged recompile and first as first."""
    assert EXEMPT_FLAGS == ("first", "recompile", "save", "eval", "stopped", "idle")
    d = _steady()
    assert d.add(30, SLOW, ["eval", "save"]).excused == "save"
    assert d.add(31, SLOW, ["recompile", "first"]).excused == "first"
    assert d.state == "ok" and d.details()["n_slow"] == 0


@pytest.mark.parametrize("dt_s, slow", [(12.0, False), (12.000001, True)])
def test_a_step_exactly_at_the_trip_is_not_slow(dt_s, slow):
    """Trip 6.0x of 2.0 s: 12.0 s (6.0x exactly) is not slow; anything above is."""
    v = _steady().add(30, dt_s)
    assert (v.score == 6.0) == (not slow) and v.slow is slow


@pytest.mark.parametrize("trip_min, dt_s, valley", [
    (6.0, 6.0, 0),  # 3.0x: exactly trip / 2, not in the valley
    (6.0, 6.2, 1),  # 3.1x: above it
    (6.5, 6.2, 0),  # trip 6.5: the valley starts above 3.25x
    (6.5, 6.6, 1),  # 3.3x
])
def test_the_valley_starts_above_trip_over_valley_div(trip_min, dt_s, valley):
    """The valley (steps between trip / VALLEY_DIV and the trip) counts a step above trip / 2 only,
    and with a trip of 6.5 at 3.25x (not at 6.5 // 2 = 3.0x). Counted at the next slow step."""
    d = _steady(FallbackDetector(trip_ratio_min=trip_min))
    _feed(d, 30, [dt_s, SLOW])
    assert d.details()["valley"] == valley


def test_the_valley_words_use_the_trip_over_valley_div():
    """Trip 6.5x: 4 valley steps (4x, above 3.25x) then 4 slow ones stay suspected (the slow ones are
    not more than the valley's); the words say the valley runs from 3.2x (3.25 to one decimal, half
    to even) to 6.5x, with 4 slow steps (one more than flag_min_slow)."""
    d = _steady(FallbackDetector(trip_ratio_min=6.5))
    _feed(d, 30, [VALLEY] * 4 + [SLOW] * 4)
    assert d.state == "suspected" and d.details()["valley"] == 4
    assert d.reason().endswith("flags at 3 slow steps within 40 judged steps with fewer steps between 3.2x and 6.5x "
                               "(now 4): these slow steps continue the run's own tail, not a separate mode yet")


@pytest.mark.parametrize("n_slow, more", [(9, " and 1 more"), (16, " and 8 more"), (17, " and 9 more")])
def test_a_long_cluster_counts_every_step_past_the_eighth(n_slow, more):
    d = _steady(FallbackDetector(flag_min_slow=n_slow))
    _feed(d, 30, [SLOW] * n_slow)
    times = ", ".join(f"{s}: 40.00 s (20.0x)" for s in range(30, 38))
    assert d.state == "flagged"
    assert d.reason().startswith(f"flagged: {n_slow} slow steps within {n_slow} judged steps from step 30 ({times}{more}) — ")


def test_the_share_of_slow_steps_since_the_onset_in_whole_percent():
    """3 slow steps flag at the third; one steady step after: 3 of 4 judged steps since the onset were
    slow, 75% (and 76% would be a share of 101)."""
    d = _steady()
    _feed(d, 30, [SLOW] * 3 + [STEADY])
    assert d.state == "flagged"
    assert "since the onset 3 of 4 judged steps were slow (75%)" in d.reason()


def test_a_flag_soon_after_the_steady_state_counts_its_judged_steps_from_the_onset():
    """Steady at step 19, then 2.0 s at step 20 (judged 1) and slow steps from step 21 (judged 2): the
    flag at judged 4 came 2 judged steps after the onset (4 - 2; not 4 mod 2)."""
    d = _steady(n=21)
    _feed(d, 21, [SLOW] * 3)
    det = d.details()
    assert d.state == "flagged" and (det["judged"], det["judged_to_flag"]) == (4, 2)
    assert d.reason().startswith("flagged: 3 slow steps within 3 judged steps from step 21 ")


def test_a_wide_warm_up_hint_needs_a_break_in_every_20_steps():
    """101 counted steps with 5 breaks (every 20th): fewer than one in 20 (5 x 20 = 100 < 101), so no
    hint; 99 steps are too few for any hint, though their 5 breaks (every 19th) are more than one in
    20. The positive control: 100 steps with 5 breaks (every 20th) get it."""
    for n, every, said in ((101, 20, False), (99, 19, False), (100, 20, True)):
        d = FallbackDetector()
        breaks = [i for i in range(n) if i % every == every - 1][:5]
        assert len(breaks) == 5
        for i in range(n):
            d.add(i, 10.0 if i in breaks else 1.0)
        assert d.warmup()["state"] == "warming"
        assert ("5 of %d steps ran > 3x the steps before them" % n in d.reason()) is said, n


@pytest.mark.parametrize("window, said", [(9, True), (10, True), (8, False)])
def test_the_per_token_judgement_is_named_from_9_steps_with_a_width(window, said):
    """A baseline of 9 steps with a width (NEIGHBORS) is judged per padded token and says so; 8 are
    too few."""
    d = FallbackDetector(baseline_window=window)
    for i in range(30):
        d.add(i, STEADY, (), None, 1000)
    assert d.warmup()["state"] == "steady"
    assert ("judged per padded token against steps of similar width" in d.reason()) is said


def test_the_trip_ratio_read_between_steps_is_the_current_trip_not_the_minimum():
    """A noisy steady run whose spread lifts the trip above its minimum: trip_ratio, read between
    steps, is the trip the detector judges by now (the one an excused step next is scored against),
    not TRIP_RATIO_MIN."""
    import random

    rng = random.Random(5)
    d = FallbackDetector()
    above = 0
    for i in range(400):
        v = d.add(i, 20.0 * rng.lognormvariate(0, 0.5), ["first"] if i == 0 else ())
        if v.trip_ratio is not None and v.trip_ratio > 6.0:
            above += 1
            assert d.trip_ratio == d.add(10_000 + i, v.expected_s, ["save"]).trip_ratio  # an excused step: judged by it, never counted
    assert above > 50


def test_only_a_first_flag_marks_the_first_step():
    """A run without slow warm-up steps ends its warm-up at the last step flagged first; a step
    flagged eval, save or recompile later in the warm-up is no first step."""
    for other in ("eval", "save", "recompile"):
        d = FallbackDetector()
        d.add(0, 20.0, ["first"])
        _feed(d, 1, [STEADY] * 5)
        d.add(6, STEADY, [other])
        _feed(d, 7, [STEADY] * 20)
        assert d.warmup() == {"state": "steady", "until_step": 0}, other


@pytest.mark.parametrize("dt_s, steady_at", [(3.0, 19), (3.000001, 22)])
def test_a_warm_up_step_exactly_3x_keeps_the_in_band_run(dt_s, steady_at):
    """STEADY_BAND 3: a warm-up step at exactly 3x the steps before it is in band (the run of 20
    in-band steps ends at step 19); above it the run restarts after it (step 2), 20 steps later."""
    d = FallbackDetector()
    _feed(d, 0, [1.0, 1.0, dt_s])
    for k in range(3, 100):
        d.add(k, 1.0)
        if d.warmup()["state"] == "steady":
            break
    assert d.warmup()["state"] == "steady" and k == steady_at


@pytest.mark.parametrize("first_s, n_base, until", [(3.0, 20, None), (3.000001, 19, 0), (4.0, 19, 0)])
def test_the_steady_baseline_keeps_a_leading_step_up_to_3x_its_level(first_s, n_base, until):
    """The warm-up's run of 20 in-band steps starts with a step of ``first_s`` (it has nothing before
    it to be out of band with), then 1.0 s steps. The baseline starts from the run less the steps
    above 3x its level (1.0 s): exactly 3x is kept (20 steady steps), above it is left out (19); the
    warm-up is said to last to the last step above 3x the level (step 0), none at exactly 3x."""
    d = FallbackDetector()
    _feed(d, 0, [first_s] + [1.0] * 19)
    assert d.warmup() == {"state": "steady", "until_step": until}
    assert f"over the last {n_base} steady steps" in d.reason()


@pytest.mark.parametrize("window, until", [(41, 39), (40, None), (19, None)])
def test_a_drop_reopens_the_warm_up_only_against_a_baseline_that_still_holds_the_old_level(window, until):
    """40 steps of 2.0 s, then 20 of 0.5 s. A baseline of 41 steps still has its median at 2.0 s
    (21 old, 20 fast): the 20 fast ones ran under half of it, and the warm-up is said to have lasted to
    step 39. With 40 (20 and 20) its median is already a fast step, and with 19 (inside the last 20
    steps) every step kept is fast: the baseline follows, no warm-up is re-opened."""
    d = _steady(FallbackDetector(baseline_window=window), n=40)
    _feed(d, 40, [0.5] * 20)
    assert d.details()["baseline_s"] == 0.5 and d.warmup() == {"state": "steady", "until_step": until}


def test_suspected_stays_while_its_slow_step_is_in_the_window():
    """One slow step, then steady ones: suspected (onset at the slow step) for as long as it is among
    the last 40 judged steps (FLAG_WINDOW); the steady step that evicts it returns to ok."""
    d = _steady()
    d.add(30, SLOW)
    for k in range(31, 70):
        d.add(k, STEADY)
        assert (d.state, d.onset_step) == ("suspected", 30), k
    d.add(70, STEADY)
    assert (d.state, d.onset_step) == ("ok", None)


def test_the_share_since_a_later_onset_counts_only_its_own_slow_steps():
    """flag_min_slow 1: a first slow step after a valley step stays suspected (the valley is as long
    as the cluster), leaves the window after 40 steady steps; a second one flags at once. Since that
    onset, 1 of 1 judged steps was slow: the earlier slow step is not counted."""
    d = _steady(FallbackDetector(flag_min_slow=1))
    _feed(d, 30, [VALLEY, SLOW])
    assert d.state == "suspected"
    _feed(d, 32, [STEADY] * 40)
    assert d.state == "ok"
    d.add(72, SLOW)
    assert d.state == "flagged" and d.details()["n_slow"] == 2
    assert "since the onset 1 of 1 judged steps were slow (100%)" in d.reason()


# ---------------------------------------------------------------- the baseline: what a step is expected to take


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
    (None, 1.0, 1.0),  # a float count of 1
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
    b = Baseline(16 + len(others))
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


# ---------------------------------------------------------------- the seeded controls


def run(control):
    """Feed a control; return (detector, verdicts, states seen)."""
    d = FallbackDetector()
    verdicts, states = [], set()
    for rec in control.records:
        v = d.update(rec)
        verdicts.append(v)
        states.add(d.state)
    return d, verdicts, states


def judged_between(control, verdicts, from_step, to_step):
    """Judged (counted, steady, not excused) steps from ``from_step`` (0) to ``to_step``."""
    steps = [r["step"] for r in control.records]
    i, j = steps.index(from_step), steps.index(to_step)
    return sum(1 for v in verdicts[i + 1 : j + 1] if v.excused is None)


# ---------------------------------------------------------------- negative controls


def test_real_distribution_never_leaves_ok():
    """Playbook 4.3's real compiled run: the slowest ordinary step is 45.79 s (2.3x p50), far
    below the trip (6x). Never even suspected."""
    c = sc.real_distribution(0)
    d, verdicts, states = run(c)
    assert states == {"ok"}
    assert d.warmup() == {"state": "steady", "until_step": 1}
    det = d.details()
    assert det["n_slow"] == 0 and det["max_ok_score"] < TRIP_RATIO_MIN / 2
    # the compile step is excused, not judged
    assert verdicts[0].excused == "first"


def test_real_distribution_resumed_at_any_step():
    c = sc.real_distribution(0, start_step=5001)
    d, _, states = run(c)
    assert states == {"ok"} and d.warmup()["until_step"] == 5001


def test_variable_width_with_tokens_is_not_a_fallback():
    """A bucketed run spanning 10x in width and 20x in s/step (t = A*w + B*w^2): judged per
    padded token against steps of similar width, it scores within its jitter. Never suspected."""
    c = sc.variable_width(0)
    dts = [r["dt"] for r in c.records[1:]]
    assert max(dts) / min(dts) > 15  # the control really is that wide in seconds per step
    d, _, states = run(c)
    assert states == {"ok"}
    assert d.details()["max_ok_score"] < TRIP_RATIO_MIN / 2


def test_length_curriculum_into_attention_bound_widths_is_not_a_fallback():
    """A jump to batches 8x wider than any seen, in the attention-bound regime (t ~ w^2:
    ~16x per 4x width), costs 64x per step and 8x per padded token. The expectation from the
    nearest narrower steps is scaled as an upper bound, (w/w_i)^2, so it is not slow."""
    d = FallbackDetector()
    b = 20.0 / 2048**2
    for i in range(1, 301):
        w = (1024, 1536, 2048)[i % 3]
        d.add(i, b * w * w * (1 + 0.05 * (i % 4)), ["first"] if i == 1 else (), tokens=8 * w, padded_tokens=8 * w)
    for i in range(301, 351):
        w = 16384
        d.add(i, b * w * w * (1 + 0.05 * (i % 4)), tokens=8 * w, padded_tokens=8 * w)
    assert d.state == "ok" and d.slow_steps == []


def test_variable_width_without_tokens_never_flags():
    """The same run through the log tailer (seconds only): 20x wide per step. It must not flag;
    the detector stays in warm-up (unjudged) and says why, rather than guess."""
    c = sc.variable_width(0, with_tokens=False)
    d, _, states = run(c)
    assert "flagged" not in states and "suspected" not in states
    assert d.warmup()["state"] == "warming"
    assert "token counts" in d.snapshot()["reason"]


def test_save_and_eval_spikes_are_shown_but_never_count():
    c = sc.save_spikes(0)
    d, verdicts, states = run(c)
    assert states == {"ok"}
    excused = [v for v in verdicts if v.excused in ("save", "eval")]
    assert len(excused) >= c.params["n_saves"]
    # they are far above the trip, and visible as such
    assert sum(1 for v in excused if v.score is not None and v.score > v.trip_ratio) >= 5
    shown = {step for step, flag, _ in d.details()["excused_steps"] if flag in ("save", "eval")}
    assert {v.step for v in excused} <= shown
    assert d.slow_steps == []


def test_recompile_burst_never_counts():
    c = sc.recompile_burst(0)
    d, verdicts, states = run(c)
    assert states == {"ok"}
    assert sum(1 for v in verdicts if v.excused == "recompile") == 16


def test_eager_length_steps_that_coincide_with_a_recompile_never_count():
    d = FallbackDetector()
    for i in range(1, 101):
        d.add(i, 20.0 + (i % 5))
    for i in range(101, 111):
        d.add(i, 400.0, flags=["recompile"])
    assert d.state == "ok" and d.slow_steps == []


def test_compile_warmup_alone_never_flags():
    """~50 warm-up steps at 80-300 s (unflagged, as the log tailer sees them), then steady."""
    c = sc.compile_warmup(0)
    d, verdicts, states = run(c)
    assert states == {"ok"}
    assert d.warmup() == {"state": "steady", "until_step": c.warmup_until_step} == {"state": "steady", "until_step": 50}
    # Varied 80-300 s compile steps can pass for a (slow, noisy) steady state; nothing is slow
    # against it, and once the level has dropped for STEADY_RUN steps the warm-up end moves to 50.
    assert not any(v.slow for v in verdicts)
    d2 = FallbackDetector()
    for rec in c.records[: 50 + 2 * STEADY_RUN]:
        d2.update(rec)
    assert d2.warmup() == {"state": "steady", "until_step": 50}


def test_warmup_plateau_is_recognised_after_the_fact():
    """A tight ~200 s plateau passes for steady; when the level drops 10x the warm-up is re-opened
    and its end moves to the plateau's last step."""
    c = sc.warmup_plateau(0)
    d, _, states = run(c)
    assert states == {"ok"}
    assert d.warmup() == {"state": "steady", "until_step": 40}
    assert d.details()["baseline_s"] < 40


@pytest.mark.parametrize("name", ["dynamo_step_times.csv", "dynamo_step_times_default.csv", "dynamo_step_times_warmcache.csv"])
@pytest.mark.parametrize("with_tokens", [False, True])
def test_real_cpu_capture_is_warmup_then_ok(name, with_tokens):
    """Real CPU captures (fixtures/real): compile steps (15-25 s, or 0.5-1.7 s with a warm cache)
    then 0.01-0.07 s. NOTE: on a CPU the dynamo fallback does NOT show in step times — the rows
    with phase eager_fallback run as fast as the compiled ones of the same length. That is a fact
    about the capture, not a detector target: there the recompile-limit warning and the counters
    are the only signal (the dynamo events and counters)."""
    c = sc.real_csv(name, with_tokens=with_tokens)
    phases = c.params["phases"]
    assert "eager_fallback" in phases
    d, _, states = run(c)
    assert states == {"ok"}
    assert d.warmup() == {"state": "steady", "until_step": 4}


# ---------------------------------------------------------------- positive controls


def test_full_fallback_flags_within_three_slow_steps():
    """~20 s -> ~400 s from a resumed run's step 3338 (global_step starts at 3001 and jumps)."""
    c = sc.full_fallback(0)
    assert c.records[0]["step"] == 3001
    d, verdicts, states = run(c)
    assert d.state == "flagged"
    assert d.onset_step == c.onset_step
    det = d.details()
    assert det["slow_after_onset_to_flag"] <= 3
    assert judged_between(c, verdicts, c.onset_step, det["flagged_at_step"]) <= 3
    # suspected at the onset itself, before it flagged
    onset_idx = [r["step"] for r in c.records].index(c.onset_step)
    assert verdicts[onset_idx].slow and verdicts[onset_idx].state == "suspected"
    assert verdicts[onset_idx - 1].state == "ok"
    # slow steps never enter the baseline: 300 eager steps later, the last one is still slow
    assert verdicts[-1].slow and d.details()["baseline_s"] < 30


@pytest.mark.parametrize("share", [0.10, 0.15, 0.20])
def test_partial_fallback_flags_within_forty_steps(share):
    c = sc.partial_fallback(0, share=share)
    d, verdicts, _ = run(c)
    assert d.state == "flagged"
    det = d.details()
    assert judged_between(c, verdicts, c.onset_step, det["flagged_at_step"]) <= FLAG_WINDOW
    assert d.onset_step >= c.onset_step


def test_fallback_in_variable_width_run_with_tokens():
    c = sc.variable_width_fallback(0)
    d, verdicts, _ = run(c)
    assert d.state == "flagged" and d.onset_step == c.onset_step
    assert judged_between(c, verdicts, c.onset_step, d.details()["flagged_at_step"]) <= 3


def test_reason_names_baseline_trip_and_slow_times():
    c = sc.full_fallback(0)
    d, _, _ = run(c)
    snap = d.snapshot()
    assert set(snap) == {"state", "slow_steps", "onset_step", "reason"}
    assert snap["state"] == "flagged" and snap["onset_step"] == c.onset_step
    assert snap["slow_steps"][0] == c.onset_step
    r = snap["reason"]
    assert "baseline p50" in r and "trip 6.0x" in r and f"{c.onset_step}:" in r and " s (" in r
    assert set(d.warmup()) == {"state", "until_step"}


def test_isolated_slow_step_is_suspected_then_ok_again():
    d = FallbackDetector()
    for i in range(1, 101):
        d.add(i, 20.0 + (i % 7) * 0.5, flags=["first"] if i == 1 else ())
    d.add(101, 300.0)  # e.g. an unflagged hiccup
    assert d.state == "suspected" and d.onset_step == 101
    assert "suspected" in d.snapshot()["reason"] and "101: 300.00 s" in d.snapshot()["reason"]
    for i in range(102, 102 + FLAG_WINDOW):
        d.add(i, 20.0)
    assert d.state == "ok" and d.onset_step is None and d.slow_steps == [101]
    assert "isolated" in d.snapshot()["reason"]


def test_slow_steps_that_continue_the_tail_are_not_a_second_mode():
    """Three steps just over the trip among many in the valley below it (trip/2 .. trip) are a
    heavy tail, not a separate mode: suspected, not flagged."""
    d = FallbackDetector()
    for i in range(1, 201):
        d.add(i, 20.0 + (i % 5))
    assert d.warmup()["state"] == "steady" and d.trip_ratio == TRIP_RATIO_MIN
    base = d.details()["baseline_s"]
    pattern = [4.0, 4.5, 5.0, 7.0, 4.2, 5.5, 7.5, 4.8, 5.2, 7.2]  # x baseline: 7 valley, 3 slow
    for k, x in enumerate(pattern):
        d.add(201 + k, x * base)
    assert d.details()["n_slow"] == 3
    assert d.state == "suspected"
    assert "not a separate mode" in d.snapshot()["reason"]
    # the same three slow steps without the valley form a mode
    d2 = FallbackDetector()
    for i in range(1, 201):
        d2.add(i, 20.0 + (i % 5))
    for k, x in enumerate([1.0, 7.0, 1.0, 7.5, 1.0, 7.2]):
        d2.add(201 + k, x * base)
    assert d2.state == "flagged"


def test_flagged_stays_flagged_and_is_fed_by_dicts_or_args():
    d = FallbackDetector()
    for i in range(1, 60):
        d.update({"kind": "step", "step": i, "dt": 20.0, "flags": []})
    assert d.update({"kind": "phase", "step": 60, "name": "save"}) is None
    assert d.update({"kind": "step", "step": 60, "dt": None}) is None
    for i in range(60, 63):
        d.add(i, 400.0)
    assert d.state == "flagged"
    for i in range(63, 200):
        d.add(i, 20.0)
    assert d.state == "flagged"


def test_no_steps_and_bad_input():
    d = FallbackDetector()
    assert d.snapshot()["state"] == "ok" and d.warmup() == {"state": None, "until_step": None}
    with pytest.raises(ValueError):
        d.add(1, -1.0)
    with pytest.raises(ValueError):
        FallbackDetector(trip_ratio_min=1.0)


# ---------------------------------------------------------------- the baseline and the trip against their definitions


class _ReferenceBaseline:
    """Baseline as first written: SortedLists, a sorted (log w, seq, dt, w) list, islice + sort."""

    def __init__(self, maxlen):
        self.maxlen, self.q, self.seq = maxlen, [], 0
        self.dts, self.by_width, self.per_token = SortedList(), SortedList(), SortedList()

    def add(self, dt, w):
        self.seq += 1
        self.q.append((self.seq, dt, w))
        self.dts.add(dt)
        if w is not None:
            self.by_width.add((math.log(w), self.seq, dt, w))
            self.per_token.add(dt / w)
        if len(self.q) > self.maxlen:
            seq, odt, ow = self.q.pop(0)
            self.dts.remove(odt)
            if ow is not None:
                self.by_width.remove((math.log(ow), seq, odt, ow))
                self.per_token.remove(odt / ow)

    def median_s(self):
        return nearest_rank(self.dts, 50) if self.dts else None

    def level(self):
        if not self.q:
            return None
        return nearest_rank(self.per_token if len(self.by_width) == len(self.q) else self.dts, 50)

    def expected(self, w):
        bw = self.by_width
        if w is not None and len(bw) >= min(NEIGHBORS, max(3, len(self.q))):
            lw = math.log(w)
            i = bw.bisect_left((lw,))
            around = list(bw.islice(max(0, i - NEIGHBORS), min(len(bw), i + NEIGHBORS)))
            around.sort(key=lambda e: abs(e[0] - lw))
            picked = [dt_i * max(1.0, w / w_i) ** 2 for _, _, dt_i, w_i in around[:NEIGHBORS]]
            return nearest_rank(sorted(picked), 50), "width"
        return self.median_s(), "median"


def _same(a, b):
    """Equal, and the same sign of zero (0.0 and -0.0 compare equal)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b) or (a != a and b != b)
    return a == b


@pytest.mark.parametrize("seed", range(40))
def test_baseline_matches_the_reference_on_random_windows(seed):
    """Repeated widths (the fast path), a few buckets, widths whose logs are equal, missing widths,
    0.0 and -0.0 step times: expected(), median_s() and level() give the reference's very values,
    the sorted views in step or rebuilt, and level_bound() never falls below level()."""
    rng = random.Random(seed)
    maxlen = rng.choice([1, 3, 9, 20, 200])
    widths = rng.choice([
        [26112.0],
        [1024.0, 2048.0, 4096.0],
        [4096.0, math.nextafter(4096.0, 0.0), 8192.0],
        [1024.0, 2048.0, None],
        [None],
    ])
    fast, ref = Baseline(maxlen), _ReferenceBaseline(maxlen)
    every = rng.choice([1, 5, 17, 60])  # reads this often: the sorted views go stale in between
    for i in range(rng.choice([50, 600])):
        dt = rng.choice([0.0, -0.0, round(rng.lognormvariate(3, 0.3), rng.choice([1, 6]))])
        w = rng.choice(widths)
        fast.add(dt, w)
        ref.add(dt, w)
        assert len(fast) == len(ref.q) and fast.n_width == len(ref.by_width)
        if i % every:
            continue
        for q in set(widths) | {None, 3000.0}:
            (a, ma), (b, mb) = fast.expected(q), ref.expected(q)
            assert ma == mb and _same(a, b), (i, q, a, b)
        bound = fast.level_bound()  # before the exact reads below bring the views up to date
        lvl = ref.level()
        if bound is not None and fast.n_width == len(fast) and lvl is not None:
            assert bound >= lvl
        assert _same(fast.median_s(), ref.median_s()) and _same(fast.level(), lvl)


def test_trip_and_spread_match_the_formula_at_every_step():
    """trip_ratio and spread() (bounded from stale sorted scores at most steps) equal the formula
    on the sorted scores, on a quiet run (trip at its minimum) and a noisy one (trip above it)."""
    # a quiet run (trip always at its minimum), a noisy one (always above), and one that crosses
    # the minimum ~50 times (the sorted scores switch between stale and kept in step)
    for params, sigma in (({}, 0.08), (dict(spread_mult=40.0), 0.3), (dict(spread_mult=17.0), 0.3)):
        d = FallbackDetector(**params)
        rng = random.Random(3)
        above = 0
        for i in range(1500):
            sc = sorted(d.to_state().scores)  # the scores the step is judged against
            v = d.add(i, 20.0 * rng.lognormvariate(0, sigma), ["first"] if i == 0 else ())
            if v.trip_ratio is None or len(sc) < 4:
                continue
            spread = (nearest_rank(sc, 75) - nearest_rank(sc, 25)) / 1.349
            trip = max(d.trip_ratio_min, 1.0 + d.spread_mult * spread)
            above += trip > d.trip_ratio_min
            assert v.trip_ratio == trip, i
            if i % 97 == 0:  # reading spread() brings the sorted scores up to date
                sc = sorted(d.to_state().scores)
                assert d.spread() == (nearest_rank(sc, 75) - nearest_rank(sc, 25)) / 1.349
        assert above == 0 if not params else above > 500


@pytest.mark.parametrize("params, sigma, seed", [
    (dict(steady_band=1000.0, trip_ratio_min=20.0), 1.3, 3),  # a high minimum: stale at it for hundreds of steps
    (dict(steady_band=1000.0, baseline_window=8), 0.3, 5),  # 8 scores: stale views far behind (p25's bound below 0)
    (dict(steady_band=1000.0, baseline_window=12), 0.25, 5),
    (dict(steady_band=1000.0, baseline_window=8, trip_ratio_min=3.0), 0.2, 5),
])
def test_the_trip_of_noisy_runs_matches_the_formula_where_it_leaves_the_minimum(params, sigma, seed):
    """Runs noisy enough to be accepted only under their settings (no band to warm up in): the sorted
    scores sit stale at the minimum, many scores behind, and the trip leaves the minimum again and
    again. The stale bound must send each of those steps to the exact formula."""
    d = FallbackDetector(**params)
    rng = random.Random(seed)
    above = crossings = 0
    was_above = False
    for i in range(3000):
        sc = sorted(d.to_state().scores)
        v = d.add(i, 20.0 * rng.lognormvariate(0, sigma), ["first"] if i == 0 else ())
        if v.trip_ratio is None or len(sc) < 4:
            continue
        trip = max(d.trip_ratio_min, 1.0 + d.spread_mult * ((nearest_rank(sc, 75) - nearest_rank(sc, 25)) / 1.349))
        assert v.trip_ratio == trip, i
        crossings += trip > d.trip_ratio_min and not was_above
        was_above = trip > d.trip_ratio_min
        above += was_above
    assert above > 20 and crossings >= 3


# ---------------------------------------------------------------- add_many: a backlog in one call


def _rows(records):
    """What update() hands add(), for the step records it does not ignore."""
    return [
        (r.get("step"), r["dt"], r.get("flags") or (), r.get("tokens"), r.get("padded_tokens"), r.get("t"))
        for r in records
        if r.get("kind", "step") == "step" and r.get("dt") is not None
    ]


def _state(d):
    return repr((d.state, d.onset_step, d.warmup(), d.snapshot(), d.details(), d.trip_ratio, d.spread()))


def _add_many_cases():
    cases = [({}, c.records) for c in _synthetic_controls(0)]
    for s in range(60):
        params, recs = _STREAM_PARAMS[s % len(_STREAM_PARAMS)], _random_stream(s)
        d = FallbackDetector(**params)
        try:
            for r in recs:
                d.update(r)
        except (ValueError, OverflowError):
            continue  # junk that raises: see test_add_many_raises_like_add
        cases.append((params, recs))
    return cases


@pytest.mark.parametrize("chunks", ["random", "whole"])
def test_add_many_is_add_one_by_one(chunks):
    """add_many() in chunks of every size leaves the detector in the state one add() per step
    leaves, read after every chunk, and returns exactly the slow verdicts add() returned."""
    rng = random.Random(7)
    cases = _add_many_cases()
    assert len(cases) > 40
    slow_seen = 0
    for params, records in cases:
        rows = _rows(records)
        one, many = FallbackDetector(**params), FallbackDetector(**params)
        i = 0
        while i < len(rows):
            size = {"one": 1, "random": rng.choice([1, 2, 7, 40, 333, 5000]), "whole": len(rows)}[chunks]
            chunk = rows[i : i + size]
            expected = [(k, v) for k, v in ((k, one.add(*row[:5])) for k, row in enumerate(chunk)) if v.slow]
            assert many.add_many(chunk) == expected
            slow_seen += len(expected)
            i += len(chunk)
            if chunks != "whole" or i == len(rows):
                assert _state(many) == _state(one)
    assert slow_seen > 1000  # the positives' slow steps were compared too


def test_add_many_raises_like_add_and_keeps_the_rows_before():
    d, ref = FallbackDetector(), FallbackDetector()
    rows = [(i, 20.0 + (i % 3) * 0.1, (), None, None, None) for i in range(100)]
    for row in rows[:60]:
        ref.add(*row[:5])
    bad = list(rows[:60]) + [(60, float("nan"), (), None, None, None)] + rows[61:]
    with pytest.raises(ValueError, match="finite"):
        d.add_many(bad)
    assert _state(d) == _state(ref) and d.to_state().seen == ref.to_state().seen == 60


#: Long backlogs of one batch shape (the steady spans of monitors/detectors/steadyspan.py) and what breaks a span:
#: name -> what happens to the steps (applied in _backlog).
_BACKLOGS = ["steady, saves and evals", "slow steps at and around the trip", "steps just over the trip",
             "a drop to a lower level, then a fallback",
             "a partial fallback", "the width changes", "steps without a width", "ties", "steps of 0 s",
             "a stretch of 0 s steps"]


def _backlog(kind: str, n: int = 5_000, seed: int = 3) -> list[tuple]:
    r = random.Random(seed)
    rows, w, level = [], 4096, 1.0
    for s in range(1, n + 1):
        dt = level * r.lognormvariate(0, 0.3 if s % 997 == 0 else 0.08)
        flags = ["first"] if s == 1 else []
        if s == 1:
            dt *= 3
        if kind == "steady, saves and evals" and s % 500 == 1 and s > 1:
            flags.append(r.choice(["save", "eval", "silent", "recompile", "idle"]))
        if kind == "slow steps at and around the trip" and r.random() < 0.003:
            dt *= r.choice([5.9, 6.0, 6.1, 7, 20, 3.01, 2.99])
        if kind == "steps just over the trip" and s % 701 == 0:
            dt *= 6.6  # slow (6.6x over a trip of 6x), and in a span of their own: each alone in 40 judged steps
        if kind == "a drop to a lower level, then a fallback" and s in (n // 2, 3 * n // 4):
            level = 0.3 if s == n // 2 else 5.0
        if kind == "a partial fallback" and s > n // 3 and r.random() < 0.15:
            dt *= 20
        if kind == "the width changes" and r.random() < 0.001:
            w = r.choice([4096, 2048, 8192])
        if kind == "ties":
            dt = round(dt, 1)
        if kind == "steps of 0 s" and r.random() < 0.01 or kind == "a stretch of 0 s steps" and 3000 < s < 3100:
            dt = 0.0
        tokens, padded = (None, None) if kind == "steps without a width" else (w - 5, w)
        rows.append((s, dt, flags, tokens, padded, None))
    return rows


@pytest.mark.parametrize("kind, params", [(k, {}) for k in _BACKLOGS] + [
    ("steady, saves and evals", {"baseline_window": 50}), ("a drop to a lower level, then a fallback", {
        "baseline_window": 301, "steady_run": 7}), ("slow steps at and around the trip", {"trip_ratio_min": 2.0}),
    ("a partial fallback", {"spread_mult": 100.0}), ("the width changes", {"baseline_window": 50})])
def test_a_long_backlog_fed_at_once_is_judged_as_one_add_per_step(kind, params):
    """A backlog's steady spans are judged as arrays (steadyspan.py): the slow verdicts, the state and every figure
    are one add()'s per step, and so is what the detector does with the steps that follow (its windows)."""
    rows = _backlog(kind)
    one, many = FallbackDetector(**params), FallbackDetector(**params)
    expected = [(k, v) for k, v in ((k, one.add(*row[:5])) for k, row in enumerate(rows)) if v.slow]
    got = many.add_many(rows[:1500]) + [(k + 1500, v) for k, v in many.add_many(rows[1500:])]
    assert got == expected
    assert _state(many) == _state(one)
    r = random.Random(1)
    for s in range(1500):  # a fallback of one step in five after the backlog
        dt = r.lognormvariate(0, 0.08) * (20 if r.random() < 0.2 else 1) * (one.details()["baseline_s"] or 1.0)
        row = (10**6 + s, dt, [], 4091, rows[-1][4])
        assert many.add(*row) == one.add(*row)
    assert _state(many) == _state(one)


@pytest.mark.parametrize("after", [0, 10, 19, 100])
def test_a_backlog_that_starts_just_after_a_drop_restarts_the_baseline_where_each_step_alone_does(after):
    """The level falls to 0.3x at step 3000 (steps of 1.0 s, then 0.3 s, 1% jitter): one add() per step restarts the
    baseline 20 steps later. A backlog fed at once from ``after`` steps past the drop restarts it at that very step:
    the span's bound of the level reaches back over the window's older, slower steps."""
    r = random.Random(1)
    rows = [(s, (3.0 if s == 1 else 1.0 if s < 3000 else 0.3) * r.lognormvariate(0, 0.01), ["first"] if s == 1 else [],
             4091, 4096, None) for s in range(1, 4500)]
    one, many = FallbackDetector(), FallbackDetector()
    for row in rows:
        one.add(*row[:5])
    for row in rows[:2999 + after]:
        many.add(*row[:5])
    assert many.add_many(rows[2999 + after:]) == []
    assert _state(many) == _state(one)
    assert one.warmup()["until_step"] == 2999 and one.details()["baseline_s"] < 0.31  # the restart happened


def test_the_steady_spans_of_a_backlog_are_judged_as_arrays_the_cost(monkeypatch):
    """The cost: of a steady backlog of one width (saves included), all but the warm-up and the step-by-step
    stretches after a span stops are judged as arrays; a run of several widths is judged step by step."""
    from stepwatch.monitors.detectors import steadyspan

    spanned = [0]
    consume = steadyspan.consume

    def counting(*a):
        got = consume(*a)  # (rows applied, the state after them)
        spanned[0] += got[0]
        return got

    monkeypatch.setattr(steadyspan, "consume", counting)
    FallbackDetector().add_many(_backlog("steady, saves and evals"))
    assert spanned[0] >= 4_000, spanned
    spanned[0] = 0
    FallbackDetector().add_many(_backlog("steps without a width"))
    assert spanned[0] == 0


def _nearest_rank_index(p: float, n: int) -> int:
    return max(1, math.ceil(p / 100.0 * n)) - 1


def _far_values(n: int, a: int) -> list[float]:
    """n scores, oldest first: ``a`` of 1.0, then (nearly) 0 up to rank i25 - a - 1 of their sorted
    order, 1.0 from i25 - a to i75 + a, and 3.0 above: ``a`` more scores of 1.0 leave the exact p25
    and p75 at 1.0 while a rank moved one too far on either side reads a far value."""
    i25, i75 = _nearest_rank_index(25, n), _nearest_rank_index(75, n)
    ones = (i75 + a) - (i25 - a) + 1
    return [1.0] * a + [0.001] * (i25 - a) + [1.0] * (ones - a) + [3.0] * (n - (i75 + a) - 1)


_LOW_EDGE = [1.0] * 5 + [0.001] * 44 + [1.0] * 106 + [3.0] * 45
_AT_MIN = [1.0] * 5 + [0.001] * 44 + [0.3255] + [1.0] * 105 + [3.0] * 45  # 1 + 10 * (1 - 0.3255) / 1.349 == 6.0

#: Scores fed one step each to a steady run (every score 1.0 so far): the sorted scores the trip is
#: bounded from go stale for many steps, and p25 / p75 move by a rank at a time (name -> (window, then)).
_TRIP_EDGES = {
    "p25 falls: 10 low scores added": ([1.0] * 160 + [0.3] * 40, [0.3] * 10),
    "p75 rises: 11 scores of 1.0 evicted": ([1.0] * 160 + [1.7] * 40, [1.7] * 11),
    "far values one rank outside p25 and p75": (_LOW_EDGE, [1.0] * 5),
    "a trip exactly at the minimum": (_AT_MIN, [1.0] * 5),
    "p25 at rank 0 of an old order": ([1.0] * 200, [0.3] * 49),
    "p25 moved below every old rank": ([1.0] * 200, [0.3] * 50),
    "every rank moved, p75 with them": ([1.0] * 200, [1.7] * 51),
    "101 scores": (_far_values(101, 5), [1.0] * 5),
    "64 scores": (_far_values(64, 5), [1.0] * 5),
}


@pytest.mark.parametrize("case", list(_TRIP_EDGES))
def test_the_trip_is_its_formula_at_every_step_where_the_quartiles_move(case):
    """The trip a step is judged by is max(6, 1 + 10 * (p75 - p25) / 1.349) of the scores of the last
    baseline_window accepted steps (nearest rank), at every step, also where a quartile moves by one
    rank or the trip crosses its minimum (the detector judges most steps from a bound of older sorted
    scores: any error at these ranks would show here). Step times of 20 s x the score."""
    window, then = _TRIP_EDGES[case]
    n = len(window)
    d = FallbackDetector(baseline_window=n, drop_factor=1e6)
    scores: list[float] = []
    for i in range(n + 100):
        v = d.add(i, 20.0)
        if v.excused is None:
            scores.append(1.0)  # every steady step of the run scores exactly 1.0
    above = 0
    for k, s in enumerate(window + then):
        last = sorted(scores[-n:])
        want = max(TRIP_RATIO_MIN, 1.0 + 10.0 * ((nearest_rank(last, 75) - nearest_rank(last, 25)) / 1.349))
        v = d.add(10_000 + k, 20.0 * s)
        assert v.trip_ratio == want and not v.slow, (k, v.trip_ratio, want)
        above += want > TRIP_RATIO_MIN
        scores.append(v.score)
    above += d.trip_ratio > TRIP_RATIO_MIN
    assert d.trip_ratio == max(TRIP_RATIO_MIN, 1.0 + 10.0 * (
        (nearest_rank(sorted(scores[-n:]), 75) - nearest_rank(sorted(scores[-n:]), 25)) / 1.349))
    if case.startswith(("p25 falls", "p75 rises", "p25 moved", "every rank")):
        assert above > 0  # the positive controls: the trip left its minimum


def test_reading_the_detector_between_steps_changes_none_of_its_verdicts():
    """Reading state, warm-up, trip, spread, snapshot() and details() after every step (as the
    screen does) leaves every verdict and the end state as they are without the reads."""
    cases = [({}, c.records) for c in _synthetic_controls(0)] + [
        (_STREAM_PARAMS[s % len(_STREAM_PARAMS)], _random_stream(s)) for s in range(0, 60, 7)]
    for params, records in cases:
        read, unread = FallbackDetector(**params), FallbackDetector(**params)
        for rec in records:
            try:
                a = read.update(rec)
            except (ValueError, OverflowError) as e:
                with pytest.raises(type(e)):
                    unread.update(rec)
                continue
            b = unread.update(rec)
            assert a == b or (a.score != a.score and b.score != b.score)
            read.warmup(), read.trip_ratio, read.spread(), read.snapshot(), read.details()
        assert (read.snapshot(), read.warmup(), read.details()) == (unread.snapshot(), unread.warmup(), unread.details())


# ---------------------------------------------------------------- golden files


def _random_stream(seed):
    """Step records that reach the odd corners: widths repeated, bucketed, missing, of equal log
    (adjacent floats), junk; 0 s and -0.0 s steps, spikes, drops, every flag, partial fallbacks."""
    rng = random.Random(seed)
    n = rng.choice([60, 300, 900])
    mode = rng.choice(["const", "buckets", "mixed_none", "none", "nearlog", "junk"])
    buckets = rng.sample([512, 1024, 2048, 3072, 4096, 8192, 10240], rng.randint(1, 5))
    level = rng.choice([0.05, 1.0, 20.0])
    recs, step = [], rng.randint(0, 5000)
    for i in range(n):
        if mode == "const":
            w = 26112
        elif mode == "buckets":
            w = rng.choice(buckets)
        elif mode == "mixed_none":
            w = rng.choice(buckets + [None, None])
        elif mode == "none":
            w = None
        elif mode == "nearlog":  # different widths whose logs are equal
            w = rng.choice([1e15, math.nextafter(1e15, 2e15), 4096.0, math.nextafter(4096.0, 0.0)])
        else:
            w = rng.choice([0, -5, True, "x", None, 1e300, 1e-300, float("nan"), 3, 3.0000000000000004, 2048])
        plain = isinstance(w, (int, float)) and not isinstance(w, bool) and w == w and 0 < w < 1e200
        dt = level * ((w if plain else 2048) / 2048) * rng.lognormvariate(0, rng.choice([0.02, 0.17, 0.6]))
        r = rng.random()
        if r < 0.02:
            dt = 0.0
        elif r < 0.03:
            dt = -0.0
        elif r < 0.06:
            dt *= rng.choice([3, 8, 20, 50])
        if seed % 3 == 0 and i > n // 2 and rng.random() < 0.3:
            dt *= 20
        if seed % 5 == 1 and i > n // 3:
            dt /= 4
        dt = round(dt, rng.choice([2, 6, 12]))
        flags = ["first"] if i == 0 or rng.random() < 0.01 else []
        flags += [f for f in ("save", "eval", "recompile", "other") if rng.random() < 0.015]
        if isinstance(w, float) and plain:
            tokens, padded = w, w
        elif plain:
            tokens, padded = (w * 8 if rng.random() < 0.8 else None), (w * 8 if rng.random() < 0.8 else None)
        else:
            tokens, padded = w, (w if rng.random() < 0.5 else None)
        recs.append(
            {"kind": "step", "step": step, "dt": dt, "flags": flags, "tokens": tokens, "padded_tokens": padded}
        )
        step += 1 + (rng.randint(1, 40) if rng.random() < 0.01 else 0)
    return recs


#: Settings the odd streams cycle through (stream s runs with _STREAM_PARAMS[s % 6]).
_STREAM_PARAMS = [
    {},
    dict(baseline_window=12, steady_run=4, flag_window=6, flag_min_slow=2),
    dict(baseline_window=30, steady_run=3, flag_window=10, trip_ratio_min=2.0, spread_mult=3.0),
    dict(baseline_window=1, steady_run=1, flag_window=1, flag_min_slow=1),
    dict(baseline_window=9, steady_run=2, drop_factor=1.2, steady_band=1.5, valley_div=1.1),
    dict(valley_div=8.0, flag_min_slow=4, trip_ratio_min=3.0),
]
_REAL_CSVS = [
    ("dynamo_step_times.csv", False),
    ("dynamo_step_times.csv", True),
    ("dynamo_step_times_default.csv", False),
    ("dynamo_step_times_warmcache.csv", False),
]


def _synthetic_controls(seed):
    return [c for c in sc.all_controls(seed) if not c.name.startswith("dynamo_step_times")]


def _n(x) -> str:
    """A number as the golden files write it: 6 significant digits (enough to see any change of
    what the detector computes, short enough to read), '-' for None."""
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.6g}"
    return str(x)


def _end_state(d: FallbackDetector) -> list[str]:
    snap, warm, det = d.snapshot(), d.warmup(), d.details()
    slow = snap["slow_steps"]
    exc = det.pop("excused_steps")
    out = [
        f"  state {snap['state']}, onset step {_n(snap['onset_step'])}, warmup {warm['state']} until step "
        f"{_n(warm['until_step'])}",
        f"  slow steps ({len(slow)}): {' '.join(map(_n, slow[:12]))}{' ...' if len(slow) > 12 else ''}"
        f"{' ' + ' '.join(map(_n, slow[-3:])) if len(slow) > 15 else ''}",
        f"  excused steps ({len(exc)}): "
        + " ".join(f"{_n(s)}:{f}:{_n(x)}" for s, f, x in exc[:8])
        + (" ..." if len(exc) > 8 else ""),
        "  details: " + ", ".join(f"{k} {_n(v)}" for k, v in det.items()),
        f"  reason: {snap['reason']}",
    ]
    return out


def render(name: str, params: dict, records: list[dict], every_step: bool = True) -> str:
    """What the detector says about ``records``, as text: one line per step (step, dt, expected,
    score, trip, state, and slow / the excuse), the reason whenever the state changes, and the
    end state (snapshot, warm-up, details). ``every_step`` False: the end state only."""
    d = FallbackDetector(**params)
    lines = [f"## {name}" + (f"  {params}" if params else "")]
    if every_step:
        lines.append("# step dt | expected score trip | state [slow | excused]")
    last_state = d.state
    for rec in records:
        try:
            v = d.update(rec)
        except (ValueError, OverflowError) as e:  # junk widths can overflow t(w) (w / w_i) ** 2
            if every_step:
                lines.append(f"{_n(rec.get('step'))} {rec.get('dt')!r} raises {type(e).__name__}: {e}")
            continue
        if v is None:
            continue
        if every_step:
            tail = " slow" if v.slow else (f" {v.excused}" if v.excused else "")
            lines.append(f"{_n(v.step)} {_n(v.dt_s)} | {_n(v.expected_s)} {_n(v.score)} {_n(v.trip_ratio)} | "
                         f"{v.state}{tail}")
        if d.state != last_state:
            last_state = d.state
            if every_step:
                lines.append(f"  -> {d.snapshot()['reason']}")
    lines.append("# end")
    lines.extend(_end_state(d))
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("control", [c.name for c in _synthetic_controls(0)])
def test_every_verdict_on_the_controls_is_the_golden_one(control, golden):
    c = next(c for c in _synthetic_controls(0) if c.name == control)
    golden(f"fallback/controls/{control}.txt", render(control, {}, c.records))


def test_the_end_state_of_the_controls_at_other_seeds_is_the_golden_one(golden):
    text = "".join(render(f"{c.name} (seed {seed})", {}, c.records, every_step=False)
                   for seed in (1, 2) for c in _synthetic_controls(seed))
    golden("fallback/controls_seeds_1_2_end_states.txt", text)


def test_every_verdict_on_the_real_captures_is_the_golden_one(golden):
    text = "".join(render(f"{name}{' with tokens' if tokens else ''}", {}, sc.real_csv(name, tokens).records)
                   for name, tokens in _REAL_CSVS)
    golden("fallback/real_captures.txt", text)


@pytest.mark.parametrize("part", range(6))
def test_every_verdict_on_odd_streams_is_the_golden_one(part, golden):
    """60 odd streams (see _random_stream), ten a file, each under one of _STREAM_PARAMS."""
    text = "".join(render(f"stream {s}", _STREAM_PARAMS[s % len(_STREAM_PARAMS)], _random_stream(s))
                   for s in range(part * 10, part * 10 + 10))
    golden(f"fallback/odd_streams_{part * 10}_{part * 10 + 9}.txt", text)
