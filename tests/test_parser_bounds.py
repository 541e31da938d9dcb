"""Every parser that reads a line of the run's output (or a value of its events) answers a hostile line, 32 KiB of it
(the text log reader's longest segment), in linear time and without raising: a count longer than any step would
otherwise reach int()'s 4300-digit limit (a ValueError that ended the view's refresh), and a pattern that tries every
start inside a run of digits takes seconds (10 s for one 32 KiB segment, before the bounds: the watcher's pages wait)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from stepwatch.monitors.parsers.hf_logdict import parse_log_dict, parse_train_output
from stepwatch.monitors.parsers.hf_progress import parse_progress
from stepwatch.monitors.parsers.logformats import eval_metrics, pairs, recognise
from stepwatch.monitors.readers.textlog import DEFAULT_MAX_LINE_BYTES
from stepwatch.telemetry.dynamo import frame_compile_id

DIGITS = "9" * (DEFAULT_MAX_LINE_BYTES - 64)
LINES = {
    "a bar without a total": DIGITS + "it [00:00, 1.0it/s]",
    "a count that is no bar": DIGITS + "/1 [00:00<00:00, 1it/s]",
    "a bar's count": "9%|x| " + DIGITS + "/5 [00:00<00:00, 1it/s]",
    "a bar's rate": "5it [00:00, " + DIGITS + "it/s]",
    "a bar's elapsed time": "5it [" + DIGITS + ":00, 1it/s]",
    "the Trainer's summary": "TrainOutput(global_step=" + DIGITS + ", training_loss=1.0)",
    "a compile id": DIGITS + "/" + DIGITS[:1000],
    "a step line": "step " + DIGITS,
    "nanoGPT's line": "iter " + DIGITS + ": loss 1.0, time 3ms",
    "a log dict": "{'loss': " + DIGITS + ", 'epoch': 1}",
    "bars glued together": "1%|" * (DEFAULT_MAX_LINE_BYTES // 3) + "]",
}
PARSERS: list[Callable[[str], object]] = [parse_progress, parse_train_output, parse_log_dict, frame_compile_id, recognise,
                                          eval_metrics, pairs]
#: Linear reading of 32 KiB takes milliseconds; the quadratic reading it replaced took 2 to 10 s.
BOUND_S = 0.5


@pytest.mark.parametrize("name", sorted(LINES))
def test_a_hostile_line_is_read_in_linear_time_and_never_raises(name: str):
    line = LINES[name]
    for parse in PARSERS:
        t0 = time.perf_counter()
        parse(line)  # raising fails the test
        took = time.perf_counter() - t0
        assert took < BOUND_S, f"{parse.__name__} took {took:.2f} s on {name}"


def test_a_count_beyond_any_step_is_no_count_and_the_ordinary_lines_still_are():
    assert parse_progress(DIGITS + "it [00:00, 1.0it/s]") is None
    assert parse_train_output("TrainOutput(global_step=" + DIGITS) is None
    assert frame_compile_id(DIGITS + "/3") is None
    # controls: the same shapes at a real size are read
    bar = parse_progress("Epoch 3: 25it [00:03, 7.12it/s]")
    assert bar is not None and (bar.step, bar.desc, bar.rate) == (25, "Epoch 3", 7.12)
    full = parse_progress(" 40%|████      | 4/10 [00:01<00:02,  2.50it/s, loss=1]")
    assert full is not None and (full.step, full.total, full.percent, full.postfix) == (4, 10, 40, ", loss=1")
    assert parse_train_output("TrainOutput(global_step=30, training_loss=1.0)") == 30
    assert frame_compile_id("0/12") == 12
