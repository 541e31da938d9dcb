"""What the fallback detector says, word for word and number for number (issue 21: the mutants a
cosmic-ray run of monitors/detectors/fallback.py left). Every stream here is exact: steady steps of
2.0 s (scores exactly 1.0, jitter sigma 0, so the trip is its minimum 6.0x = 12.0 s), slow steps of
40.0 s (20x), valley steps of 8.0 s (4x, between trip / 2 and the trip). Each expected figure is
derived from the stream in the comment beside it, not read back from the code."""

from __future__ import annotations

import pytest

from stepwatch.monitors.detectors.fallback import FallbackDetector

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
