"""The loss-health sentinel (issue 47), in process: each verdict with its negative control, on the run's own spread; the
real captures read as healthy; the alerts, the words, the exporter's families and the saved state."""
from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest

from conftest import FIXTURES_REAL
from stepwatch.monitors.detectors.losshealth import MIN_N, LossHealth
from stepwatch.monitors.export.prometheus import text_of
from stepwatch.monitors.fold.events import EventsFold
from stepwatch.monitors.fold.savedstate import decode, encode
from stepwatch.monitors.fold.statecheck import StateError
from stepwatch.monitors.parsers.logtracker import LogTracker
from stepwatch.monitors.readers.jsonl import EventReader
from stepwatch.monitors.snapshot.alerts import alert
from stepwatch.monitors.snapshot.metrics import loss_health_alerts, loss_health_words
from stepwatch.monitors.snapshot.model import null_snapshot
from stepwatch.monitors.states import CATASTROPHIC, NOT_JUDGED, OK, PERSISTENT, SPIKE


def noisy(n: int, level: float = 2.0, sd: float = 0.05, seed: int = 0, drift: float = 0.0) -> list[float]:
    rng = random.Random(seed)
    return [level + drift * i + rng.gauss(0, sd) for i in range(n)]


def fed(values: list[float], grad: dict[int, float] | None = None, first_step: int = 1) -> LossHealth:
    h = LossHealth()
    for i, v in enumerate(values):
        step = first_step + i
        if grad and step in grad:
            h.feed("grad_norm", step, grad[step])
        h.feed("loss", step, v)
    return h


def test_a_noisy_flat_loss_and_a_falling_one_are_ok_and_too_few_values_are_not_judged():
    assert fed(noisy(2000)).part()["state"] == OK  # the negative controls: 2,000 logged values, none an episode
    falling = [5.0 * math.exp(-i / 150) + 0.3 + x for i, x in enumerate(noisy(2000, 0.0, 0.02, seed=1))]
    part = fed(falling).part()
    assert (part["state"], part["episodes"]) == (OK, 0), part
    few = fed(noisy(MIN_N - 1)).part()
    assert few["state"] == NOT_JUDGED and "15 finite loss values logged so far; judged from 16" in few["reason"]
    assert LossHealth().part()["reason"] == "the run logs no training loss stepwatch reads"


def test_a_spike_opens_an_episode_at_its_onset_and_three_calm_values_end_it():
    values = noisy(300)
    values[250] = 2.6  # 3 -> 8 -> 3 in Megatron's tracker: one value far outside the run's own spread
    h = fed(values)
    part = h.part()
    assert part["state"] == OK and part["episodes"] == 1, part
    last = part["last"]
    assert last is not None and (last["kind"], last["onset_step"], last["recovered_step"]) == (SPIKE, 251, 254), last
    assert last["peak_z"] is not None and last["peak_z"] > 6
    half = fed(values[:251]).part()  # while it is open
    assert half["state"] == SPIKE and half["episode"] is not None and half["episode"]["onset_step"] == 251
    control = values[:250] + [2.2] + values[251:]  # four spreads up: within the run's noise, no episode
    assert fed(control).part()["episodes"] == 0


def test_a_rise_that_stays_is_persistent_and_measured_from_where_it_began():
    values = noisy(300) + noisy(300, level=2.8, seed=2)  # up by 0.8 at step 301, and stays
    part = fed(values).part()
    assert part["state"] == PERSISTENT and part["episode"] is not None, part
    assert part["episode"]["onset_step"] == 301 and abs(part["episode"]["level"] - 2.0) < 0.05
    back = fed(noisy(300) + noisy(20, level=2.8, seed=2) + noisy(300, seed=3)).part()  # it came back down
    assert back["state"] == OK and back["last"] is not None and back["last"]["kind"] == PERSISTENT


def test_ten_times_the_first_values_is_catastrophic_and_a_nan_is_said_without_a_second_alert():
    values = noisy(200) + [25.0]
    part = fed(values).part()
    assert part["state"] == CATASTROPHIC and part["episode"] is not None and part["episode"]["why"] == "ten_times"
    kinds = [a["kind"] for a in _alerts(part)]
    assert kinds == ["loss_spike", "loss_catastrophic"], kinds
    nan = fed(noisy(34) + [math.nan, math.nan]).part()
    assert nan["state"] == CATASTROPHIC and nan["episode"] is not None and nan["episode"]["onset_step"] == 35
    assert _alerts(nan) == []  # a NaN is nonfinite_loss's alert: one cause, one page
    assert loss_health_words(nan) == "loss: catastrophic: not a number from step 35"
    back = fed(noisy(34) + [math.nan] + noisy(5)).part()  # finite again, at its level: it ended, and is kept as last
    assert back["state"] == OK and back["last"] is not None and back["last"]["kind"] == CATASTROPHIC


def test_a_grad_norm_spike_just_before_the_loss_spike_is_named_as_its_early_warning():
    values = noisy(300)
    values[250] = 3.0
    grads = {i: 1.0 + 0.01 * (i % 7) for i in range(1, 301)}
    grads[249] = 9.0
    ep = fed(values, grads).part()["last"]
    assert ep is not None and ep["grad_warning_step"] == 249, ep
    grads[249], grads[200] = grads[248], 9.0  # a grad spike 50 values before: no warning of this one
    ep = fed(values, grads).part()["last"]
    assert ep is not None and ep["grad_warning_step"] is None, ep


def test_a_progress_bars_redraws_of_one_logged_value_are_one_value():
    h = LossHealth()
    for v in noisy(40):
        for _ in range(50):  # Lightning's bar shows loss=... on every frame until the next log
            h.feed("loss", None, v)
    part = h.part()
    assert part["values"] == 40 and part["state"] == OK, part


def replay(name: str) -> LogTracker:
    t = LogTracker()
    for i, seg in enumerate(re.split(r"\r\n|\r|\n", (FIXTURES_REAL / name).read_text(errors="replace"))):
        t.feed_text(seg, at_s=1000.0 + i, poll_seq=i)
    return t


def test_every_real_capture_reads_healthy_and_the_nan_run_catastrophic_from_its_first_nan():
    judged = 0
    for f in sorted(FIXTURES_REAL.glob("*.log")):
        t = replay(f.name)
        part = t.loss_health.part()
        if f.name == "death_nan_loss.log":
            first = t.series["loss"].first_nonfinite_step
            assert part["state"] == CATASTROPHIC and part["episode"] is not None
            assert part["episode"]["onset_step"] == first is not None, (part, first)
            continue
        assert part["episodes"] == 0, (f.name, part)
        judged += part["state"] == OK
    assert judged >= 12  # the captures long enough to judge (nanoGPT, Lightning, HF, tqdm, torchrun)


def _alerts(part) -> list:
    snap = null_snapshot()
    snap["attempt"], snap["loss_health"] = 1, part
    return loss_health_alerts(snap, alert, {})


def test_the_alerts_follow_the_episode_and_name_its_onset_and_level():
    values = noisy(300) + noisy(300, level=2.8, seed=2)
    spike = _alerts(fed(values[:301]).part())
    assert [a["kind"] for a in spike] == ["loss_spike"] and spike[0]["id"] == "a1-loss_spike-loss-301"
    assert re.match(r"loss spiked at step 301: 2\.\d+ at step 301 \(z \d+\.?\d*\) against a level of (1\.9|2\.0)",
                    spike[0]["message"]), spike[0]["message"]
    rise = _alerts(fed(values).part())
    assert [a["kind"] for a in rise] == ["loss_spike", "loss_rise"]  # the spike's alert holds while the episode does
    assert "rose at step 301 and stayed up" in rise[1]["message"]
    assert _alerts(fed(noisy(600)).part()) == []
    values = noisy(300)
    values[250] = 2.6
    between = _alerts(fed(values).part())  # opened and ended between two looks (a fast run): said all the same
    assert [a["kind"] for a in between] == ["loss_spike"] and "back at its level from step 254" in between[0]["message"]


def test_the_words_and_the_exporter_say_the_verdict():
    values = noisy(300) + noisy(300, level=2.8, seed=2)
    part = fed(values).part()
    assert loss_health_words(part).startswith("loss: persistent at step 301 (z ")
    assert re.match(r"loss: ok \(level (1\.9|2\.0)\d*, 100 values\)$", loss_health_words(fed(noisy(100)).part()))
    snap = null_snapshot()
    snap["run"], snap["loss_health"] = "r", part
    text = text_of(snap).decode()
    assert re.search(r'^stepwatch_loss_health_state\{attempt="",run="r"\} 2\.0$', text, re.M), text
    assert re.search(r'^stepwatch_loss_health_episodes\{attempt="",run="r"\} 1\.0$', text, re.M), text
    snap["loss_health"] = LossHealth().part()  # not judged: no sample, never a 0
    assert "stepwatch_loss_health_state{" not in text_of(snap).decode()


def test_the_emitters_log_events_are_judged_like_the_logs_lines(tmp_path: Path):
    fold = EventsFold()
    values = noisy(300)
    values[250] = 2.6
    (tmp_path / "events.jsonl").write_bytes(b"".join(
        json.dumps({"v": 1, "kind": "log", "t": 1000.0 + i, "step": i + 1, "rank": 0,
                    "logs": {"loss": v, "grad_norm": 1.0}}).encode() + b"\n" for i, v in enumerate(values)))
    fold.fold(EventReader(tmp_path / "events.jsonl"))
    last = fold.loss_health.part()["last"]
    assert last is not None and last["onset_step"] == 251, fold.loss_health.part()


def test_a_saved_loss_health_comes_back_the_same_and_a_forged_one_is_refused():
    values = noisy(300) + noisy(30, level=2.8, seed=2)
    h = fed(values)
    back = decode(json.loads(json.dumps(encode(h))))
    assert back.part() == h.part()
    for v in noisy(40, level=2.0, seed=5):
        h.feed("loss", None, v)
        back.feed("loss", None, v)
    assert back.part() == h.part()  # and goes on the same
    doc = json.loads(json.dumps(encode(h)))
    window = doc["f"]["window"]
    window["Q"][3] = "2.0"
    with pytest.raises(StateError):
        decode(doc)
