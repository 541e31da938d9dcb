"""The log-line recognisers' edges, line by line (issue 21: the mutants a cosmic-ray run of
monitors/parsers/logformats.py left): nanoGPT's mfu before its estimate exists, each JSON step-time
key and its unit, a unit in a printed pair, the line-length and pattern-length limits at their
edges, a user pattern's max_steps. Every line goes through ``recognise`` (what the supervisor
calls per line) or the public function the supervisor calls."""

from __future__ import annotations

import json

import pytest

from stepwatch.monitors.parsers.logformats import (MAX_LINE_CHARS, MAX_PATTERN_CHARS, compile_patterns,
                                                  eval_metrics, recognise, user_pattern)


def test_nanogpts_mfu_is_kept_from_zero_up_and_its_placeholder_dropped():
    name, got = recognise("iter 10: loss 4.2130, time 95.12ms, mfu -100.00%")
    assert name == "nanogpt" and got.metrics == {"loss": 4.213} and got.reported_dt_s == pytest.approx(0.09512)
    assert recognise("iter 11: loss 4.2, time 95.00ms, mfu 0.00%")[1].metrics == {"loss": 4.2, "mfu_pct": 0.0}
    assert recognise("iter 12: loss 4.2, time 95.00ms, mfu 31.50%")[1].metrics == {"loss": 4.2, "mfu_pct": 31.5}


@pytest.mark.parametrize("key, value, dt_s", [
    ("dt_s", 0.5, 0.5), ("step_time_s", 0.5, 0.5), ("iter_time_s", 0.5, 0.5), ("time_s", 0.5, 0.5),
    ("step_time_ms", 500, 0.5), ("time_ms", 250, 0.25),
])
def test_each_json_step_time_key_in_its_unit(key, value, dt_s):
    name, got = recognise(json.dumps({"step": 7, key: value, "loss": 1.5}))
    assert name == "json" and got.step == 7 and got.reported_dt_s == dt_s


def test_a_json_line_with_two_step_times_takes_the_first_key_in_order():
    got = recognise(json.dumps({"step": 7, "time_ms": 900, "time_s": 9.0, "dt_s": 0.5}))[1]
    assert got.reported_dt_s == 0.5  # dt_s before step_time_s, iter_time_s, time_s, then the ms keys


@pytest.mark.parametrize("text, metrics, dt_s", [
    ("step 5 | loss 2.0 | time 0.5s", {"loss": 2.0, "time_s": 0.5}, 0.5),
    ("step 5 | loss 2.0 | time 250ms", {"loss": 2.0, "time_s": 0.25}, 0.25),
    ("step 5 | loss 2.0 | mem 512MiB", {"loss": 2.0, "mem_gib": 0.5}, None),
    ("step 5 | loss 2.0 | util 93%", {"loss": 2.0, "util_pct": 93.0}, None),
])
def test_a_printed_unit_goes_into_the_name_and_scales_the_value(text, metrics, dt_s):
    name, got = recognise(text)
    assert (name, got.step, got.metrics, got.reported_dt_s) == ("step_line", 5, metrics, dt_s)


def test_an_eval_loss_is_read_from_a_line_up_to_the_line_limit():
    line = "step 2000: train loss 2.1, val loss 2.3"
    assert eval_metrics(line) == {"eval_loss": 2.3}
    at_limit = line + " " * (MAX_LINE_CHARS - len(line))
    assert len(at_limit) == MAX_LINE_CHARS and eval_metrics(at_limit) == {"eval_loss": 2.3}
    assert eval_metrics(at_limit + " ") == {}  # one past it: a dumped tensor, not an eval line
    assert eval_metrics("step 5: loss 2.0") == {}


def test_a_pattern_may_be_500_characters_and_no_more():
    base = r"it (?P<step>\d+)"
    ok = base + "x?" * ((MAX_PATTERN_CHARS - len(base)) // 2)
    assert len(ok) == MAX_PATTERN_CHARS and len(compile_patterns([ok])) == 1
    with pytest.raises(ValueError, match="pattern 1 is longer than 500 characters"):
        compile_patterns([ok + "?"])


@pytest.mark.parametrize("printed, max_steps", [
    ("100", 100), ("1", 1), ("0", None), ("999999999999", 999_999_999_999), ("1000000000000", None),
    ("-5", None), ("12.5", None), ("2000000000000", None),
])
def test_a_user_patterns_max_steps(printed, max_steps):
    [rx] = compile_patterns([r"it (?P<step>\d+)/(?P<max_steps>[-\d.]+) loss (?P<loss>[\d.]+)"])
    got = user_pattern(rx, f"it 3/{printed} loss 1.25")
    assert (got.step, got.max_steps, got.metrics) == (3, max_steps, {"loss": 1.25})


def test_at_most_32_metrics_from_one_line():
    obj = {"step": 3, **{f"m{i:02d}": float(i) for i in range(40)}}
    got = recognise(json.dumps(obj))[1]
    assert list(got.metrics) == [f"m{i:02d}" for i in range(32)]
    line = "step 3 | " + " | ".join(f"m{i:02d} {i}" for i in range(40))
    got = recognise(line)[1]
    assert list(got.metrics) == [f"m{i:02d}" for i in range(32)]


@pytest.mark.parametrize("dt_s, reported", [(0, 0.0), (1e6, 1e6), (1000000.5, None), (-0.5, None)])
def test_a_reported_step_time_is_believed_from_0_to_1e6_seconds(dt_s, reported):
    assert recognise(json.dumps({"step": 3, "dt_s": dt_s}))[1].reported_dt_s == reported


@pytest.mark.parametrize("step, ok", [(0, True), (999_999_999_999, True), (10**12, False), (10**13, False), (-1, False)])
def test_a_json_lines_step_from_0_below_1e12(step, ok):
    got = recognise(json.dumps({"step": step, "loss": 1.0}))
    assert (got is not None and got[1].step == step) == ok


@pytest.mark.parametrize("max_steps, read", [(1, 1), (999_999_999_999, 999_999_999_999), (0, None), (-1, None),
                                             (10**12, None), (10**13, None), (5.0, None)])
def test_a_json_lines_max_steps(max_steps, read):
    assert recognise(json.dumps({"step": 3, "max_steps": max_steps}))[1].max_steps == read


def test_a_json_line_too_deep_or_with_a_huge_int_is_read_without_them():
    deep = '{"step": 1, "x": ' + "[" * 2000 + "]" * 2000 + "}"
    assert len(deep) <= MAX_LINE_CHARS and recognise(deep) is None  # RecursionError in json: no step read
    got = recognise('{"step": 1, "seed": ' + "9" * 400 + ', "loss": 2.5}')[1]
    assert got.metrics == {"loss": 2.5}  # an int beyond a float's range is no metric; the ones after it are
    assert recognise('{"step": 5, "loss": 2.0,}') is None  # braces but no JSON (a trailing comma)
    key = "k" * 70
    assert list(recognise(json.dumps({"step": 1, key: 1.0}))[1].metrics) == ["k" * 64]  # a name cut at 64


def test_gigabytes_and_megabytes_as_printed():
    got = recognise("step 5 | loss 2.0 | mem 12GB | buf 250MB")[1]
    assert got.metrics == {"loss": 2.0, "mem_gb": 12.0, "buf_gb": 0.25}


def test_a_user_pattern_group_that_holds_no_number_is_no_metric():
    [rx] = compile_patterns([r"it (?P<step>\d+) (?P<phase>\w+) (?P<loss>[\d.]+)"])
    got = user_pattern(rx, "it 3 warmup 1.5")
    assert (got.step, got.metrics) == (3, {"loss": 1.5})


@pytest.mark.parametrize("printed, step", [("0", 0), ("999999999999", 999_999_999_999), ("1000000000000", None),
                                           ("2000000000000", None), ("0000000000012", None), ("-1", None),
                                           ("abc", None), ("\u00b2", None)])
def test_a_user_patterns_step_from_0_below_1e12(printed, step):
    [rx] = compile_patterns([r"it (?P<step>\S+) loss (?P<loss>[\d.]+)"])
    got = user_pattern(rx, f"it {printed} loss 1.5")
    assert (got.step if got else None) == step


def test_at_most_16_patterns():
    pats = [rf"p{i} (?P<step>\d+)" for i in range(16)]
    assert len(compile_patterns(pats)) == 16
    with pytest.raises(ValueError, match="at most 16 patterns; got 17"):
        compile_patterns(pats + [r"x (?P<step>\d+)"])


def test_a_line_is_read_up_to_4096_characters():
    assert MAX_LINE_CHARS == 4096
    line = "step 5 | loss 2.0"
    at_limit = line + " " * (MAX_LINE_CHARS - len(line))
    assert recognise(at_limit)[1].metrics == {"loss": 2.0}
    assert recognise(at_limit + " ") is None


def test_nanogpt_lines_without_mfu_and_with_a_negative_estimate():
    assert recognise("iter 3: loss 2.0000, time 95.00ms")[1].metrics == {"loss": 2.0}
    assert recognise("iter 4: loss 2.0, time 95.00ms, mfu -0.50%")[1].metrics == {"loss": 2.0}


BAR = "━" * 40


@pytest.mark.parametrize("epoch, n, per_epoch, step, max_steps", [
    (0, 10, 50, 10, 250), (2, 50, 50, 150, 250), (0, 0, 0, None, None), (0, 60, 50, None, None), (1, 3, 0, None, None),
])
def test_lightnings_rich_bar_is_made_global_with_its_epochs(epoch, n, per_epoch, step, max_steps):
    line = f"Epoch {epoch}/4 {BAR} {n}/{per_epoch} 0:00:01 • 0:00:04 10.53it/s v_num: 0 train_loss: 2.310"
    got = recognise(line, "lightning_rich")
    if step is None:
        assert got is None  # an empty epoch, or a counter past the epoch's length
    else:
        assert (got[1].step, got[1].max_steps) == (step, max_steps)


def test_a_word_of_prose_before_a_number_is_skipped_not_the_end_of_the_line():
    assert recognise("Step 3 of 5: loss 2.0")[1].metrics == {"loss": 2.0}


def test_a_shape_locked_in_reads_only_that_shape():
    nano = "iter 10: loss 4.2, time 95.00ms"
    assert recognise(nano)[0] == "nanogpt" and recognise(nano, "step_line") is None
    js = json.dumps({"step": 3, "loss": 1.0})
    assert recognise(js)[0] == "json" and recognise(js, "lightning_rich") is None


def test_a_user_pattern_whose_step_group_did_not_take_part_reads_no_step():
    [rx] = compile_patterns([r"(?:it (?P<step>\d+) )?loss (?P<loss>[\d.]+)"])
    assert user_pattern(rx, "loss 1.5") is None
    assert user_pattern(rx, "it 7 loss 1.5").step == 7


def test_a_rich_bar_of_one_step_per_epoch():
    got = recognise(f"Epoch 2/4 {BAR} 1/1 0:00:01 • 0:00:04 10.53it/s v_num: 0", "lightning_rich")[1]
    assert (got.step, got.max_steps) == (3, 5)
