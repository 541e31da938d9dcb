"""The fallback detector at the edges of its numbers (issue 21: the mutants a cosmic-ray run of
monitors/detectors/fallback.py left after test_fallback_words.py). Streams as exact as there: steady
steps of 2.0 s (scores exactly 1.0, the trip its minimum 6.0x), slow steps of 40.0 s (20x), valley
steps of 8.0 s (4x); each expected figure is derived in the comment beside it."""

from __future__ import annotations

import pytest

from stepwatch.monitors.detectors.fallback import EXEMPT_FLAGS, FallbackDetector

from test_fallback_words import SLOW, STEADY, VALLEY, _feed, _steady


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
    """As test_fallback_words' 4096-step case: a 20 s step 0, 1,095 steps of 0.5 s with a 2.0 s break
    in every 5, 3,000 steps of 1.0 s (steady_run 3000). One more step after step 0 puts it 4,097
    steps back: out of the history, so no step is found slower than 3x the level."""
    d = FallbackDetector(steady_run=3000)
    times = [20.0] + lead + [0.5, 0.5, 0.5, 0.5, 2.0] * 219 + [1.0] * 3000
    _feed(d, 0, times)
    assert len(times) == 4096 + len(lead)
    assert d.warmup() == {"state": "steady", "until_step": until}


def test_two_exempt_flags_excuse_a_step_by_the_first_in_order():
    """EXEMPT_FLAGS in order: first, recompile, save, eval. A step flagged both eval and save is
    excused as save; one flagged recompile and first as first."""
    assert EXEMPT_FLAGS == ("first", "recompile", "save", "eval")
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
