"""Energy per optimizer step: NVML's energy counter, replayed by the recorded
backend through the real sampler into gpu.jsonl, against steps whose ends are the samples' times:
joules per step exact to the recording; a device without the counter reads unsupported with NVML's
reason, never 0; a counter reset (a driver reload) starts a new segment."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import stepwatch
from stepwatch.monitors.gpu.energy import SAMPLES_KEPT, EnergyMeter
from stepwatch.monitors.gpu.recorded import RecordedBackend, bundled_recording
from stepwatch.monitors.gpu.sampler import GpuSampler
from stepwatch.monitors.gpu.schema import empty_device, make_record

T0 = 1_780_000_000.0
DEAD_PID = 2_147_483_000
NOT_SUPPORTED = "nvmlDeviceGetTotalEnergyConsumption: Not Supported (NVMLError_NotSupported)"


def _recording(path: Path, watts: list[float], counter: bool = True) -> None:
    """Two devices; GPU0's counter rises by watts[k] J per 1 s sample, GPU1's by half that."""
    recs, e = [], [1_000_000_000.0, 5_000_000.0]
    for k, w in enumerate(watts):
        devs = []
        for i, share in ((0, 1.0), (1, 0.5)):
            d = empty_device(i)
            d.update(name="NVIDIA H100 80GB HBM3", power_w=w * share, power_limit_w=700.0, used_by_run=True)
            if counter:
                if k:
                    e[i] += w * share * 1000.0
                d["energy_mj"] = int(e[i])
            else:
                d["unsupported"]["energy_mj"] = NOT_SUPPORTED
            devs.append(d)
        recs.append(make_record(T0 + k, devs, None, "recorded"))
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")


def _run(run_dir: Path, recording: Path, n: int, tokens: int = 4096) -> list[float]:
    """The real sampler replays ``recording`` into gpu.jsonl at 1 s ticks; steps end on the ticks."""
    run_dir.mkdir(parents=True)
    times = [T0 + k for k in range(n)]
    sampler = GpuSampler(run_dir, DEAD_PID, backend=RecordedBackend(recording, loop=False), clock=iter(times).__next__)
    for _ in range(n):
        sampler.tick()
    (run_dir / "run.json").write_text(json.dumps({"v": 1, "name": run_dir.name, "attempt": 1, "launched_at_unix": T0,
                                                  "process": {"pid": DEAD_PID, "create_time": T0}}))
    lines = [json.dumps({"v": 1, "kind": "step", "t": t1, "step": k, "rank": 0, "dt": t1 - t0, "step_begin": t0,
                         "step_end": t1, "tokens": tokens, "padded_tokens": tokens, "flags": [] if k > 1 else ["first"]})
             for k, (t0, t1) in enumerate(itertools.pairwise(times), start=1)]
    (run_dir / "events.jsonl").write_text("\n".join(lines) + "\n")
    return times


def _energy(run_dir: Path) -> dict:
    return json.loads(stepwatch("status", str(run_dir), "--json").stdout)["energy"]


def test_joules_per_step_are_exact_to_the_recorded_counter(tmp_path: Path):
    rec = tmp_path / "energy.jsonl"
    watts = [500.0] * 30
    _recording(rec, watts)
    _run(tmp_path / "runs" / "e", rec, len(watts))
    e = _energy(tmp_path / "runs" / "e")
    assert e["unsupported"] is None and e["devices"] == [0, 1]
    assert e["joules_per_step"] == pytest.approx(750.0, abs=1e-3)  # 500 J + 250 J per 1 s step, both devices
    assert e["joules"] == pytest.approx(750.0 * 29, abs=1e-2)
    assert e["tokens_per_joule"] == pytest.approx(4096 / 750.0, rel=1e-4)
    assert e["steps"] == 28  # the first step is not counted


def test_a_step_between_samples_gets_the_interpolated_share_and_a_reset_starts_a_segment():
    m = EnergyMeter()

    def sample(k: int, mj: int) -> None:
        d = empty_device(0)
        d.update(energy_mj=mj, used_by_run=True)
        m.add_record(make_record(T0 + k, [d], None, "recorded"))

    for k, mj in enumerate([10_000, 20_000, 30_000]):
        sample(k, mj)
    assert m.joules_between(T0 + 0.25, T0 + 1.75) == pytest.approx(15.0)  # 10 J/s over 1.5 s
    assert m.joules_between(T0 + 1, T0 + 3) is None  # past the last sample: not known yet
    sample(3, 500)  # the counter went back (a driver reload): a new segment
    sample(4, 1_500)
    assert m.joules_between(T0 + 1, T0 + 4) is None  # across the reset: no one segment holds both ends
    assert m.joules_between(T0 + 3, T0 + 4) == pytest.approx(1.0)
    assert m.part([])["joules"] == pytest.approx(20.0 + 1.0)  # the two segments' sums


@pytest.mark.system
def test_a_device_without_the_counter_reads_unsupported_with_nvmls_reason_never_zero(tmp_path: Path):
    rec = tmp_path / "no_counter.jsonl"
    _recording(rec, [300.0] * 10, counter=False)
    _run(tmp_path / "runs" / "n", rec, 10)
    e = _energy(tmp_path / "runs" / "n")
    assert e["joules"] is None and e["joules_per_step"] is None and e["tokens_per_joule"] is None
    assert NOT_SUPPORTED in e["unsupported"] and "GPU0" in e["unsupported"]
    plain = stepwatch("status", str(tmp_path / "runs" / "n")).stdout
    assert "energy unsupported: GPU0: " + NOT_SUPPORTED in plain


def test_the_bundled_synthetic_recordings_carry_a_counter_consistent_with_their_power():
    recs = [json.loads(ln) for ln in bundled_recording("synthetic_h100_healthy_compute_bound.jsonl").read_text().splitlines()]
    recs = [r for r in recs if "devices" in r]
    for a, b in itertools.pairwise(recs):
        da, db = a["devices"][0], b["devices"][0]
        assert (db["energy_mj"] - da["energy_mj"]) / 1000.0 == pytest.approx(db["power_w"] * (b["t"] - a["t"]), abs=0.01)
    vgpu = [json.loads(ln) for ln in bundled_recording("synthetic_gpu_without_power_readings.jsonl").read_text().splitlines()
            if '"devices"' in ln]
    assert all(d["energy_mj"] is None and "energy_mj" in d["unsupported"] for r in vgpu for d in r["devices"])


@pytest.mark.system
async def test_the_gpu_panel_says_the_energy_per_step(tmp_path: Path):
    from stepwatch.tui.app import StepwatchApp

    rec = tmp_path / "energy.jsonl"
    _recording(rec, [500.0] * 30)
    run_dir = tmp_path / "runs" / "e"
    _run(run_dir, rec, 30)
    app = StepwatchApp(run_dir, run_dir.parent)
    async with app.run_test(size=(160, 45)) as pilot:
        deadline = time.monotonic() + 10
        while "energy" not in (line := str(app.screen.query_one("#health").render())):
            assert time.monotonic() < deadline, line
            await pilot.pause(0.05)
        # a recording replayed: said before its figures (issue 33)
        assert "energy (RECORDED replay, not this machine) 750 J/step, 5.461 tokens/J, 21.75 kJ this attempt (GPU0, GPU1)" \
            in line, line


# ------------------------------------------------------------------------------------------------
# EnergyMeter's arithmetic at its edges:
# interpolation between samples 2 s apart, a step starting on the first sample, joules that are not whole, the median
# of unequal steps, an idle second (the counter unchanged) that is no reset, a record from the past ignored, the
# memory bound.


def meter(samples: list[tuple[float, int]], index: int = 0) -> EnergyMeter:
    m = EnergyMeter()
    for t, mj in samples:
        d = empty_device(index)
        d.update(energy_mj=mj, used_by_run=True)
        m.add_record(make_record(T0 + t, [d], None, "recorded"))
    return m


def step(t_end: float, dt: float, tokens: int | None = 1000) -> SimpleNamespace:
    return SimpleNamespace(t=T0 + t_end, dt_s=dt, tokens=tokens, counted=True)


def test_interpolation_between_samples_two_seconds_apart_and_from_the_first_sample():
    m = meter([(0, 1_000_000), (2, 1_030_000), (4, 1_050_000)])  # 15 J/s, then 10 J/s
    assert m.joules_between(T0 + 0.5, T0 + 3.0) == pytest.approx(32.5)  # 22.5 J + 10 J
    assert m.joules_between(T0, T0 + 1.0) == pytest.approx(15.0)  # a step that starts on the first sample
    assert m.joules_between(T0 + 1.0, T0 + 4.0) == pytest.approx(35.0)  # one that ends on the last
    assert m.joules_between(T0 - 0.1, T0 + 1.0) is None and m.joules_between(T0, T0 + 4.1) is None


def test_joules_that_are_not_whole_and_the_median_of_unequal_steps():
    watts = [333.3, 100.0, 200.0, 300.0, 400.0, 500.0]  # J in each 1 s interval after the first sample
    mj, samples = 7_000_000, [(0, 7_000_000)]
    for k, w in enumerate(watts, start=1):
        mj += int(w * 1000)
        samples.append((k, mj))
    m = meter(samples)
    part = m.part([step(k, 1.0) for k in range(1, 7)])
    assert part["joules"] == pytest.approx(sum(watts))
    assert part["joules_per_step"] == pytest.approx(333.3)  # the median (upper) of 100..500 and 333.3
    assert part["steps"] == 6
    assert part["tokens_per_joule"] == pytest.approx(6000 / sum(watts), rel=1e-4)
    assert m.part([step(k, 1.0, tokens=None) for k in range(1, 7)])["tokens_per_joule"] is None


def test_an_idle_second_is_no_reset_and_a_record_from_the_past_is_ignored():
    m = meter([(0, 500_000), (1, 500_000), (2, 600_000)])  # an idle second: the counter did not move
    assert m.joules_between(T0 + 0.5, T0 + 2.0) == pytest.approx(100.0)  # one segment across it
    assert m.part([])["joules"] == pytest.approx(100.0)
    d = empty_device(0)
    d.update(energy_mj=900_000, used_by_run=True)
    m.add_record(make_record(T0 + 1.5, [d], None, "recorded"))  # older than the last sample
    assert m.part([])["joules"] == pytest.approx(100.0)
    d2 = empty_device(1)
    d2.update(energy_mj=1_000, used_by_run=False)  # a device the run does not use: not counted
    m.add_record(make_record(T0 + 3, [d2], None, "recorded"))
    assert m.part([])["devices"] == [0]


def test_the_samples_kept_are_bounded_and_the_newest_stay():
    m = meter([(k, 1_000 * k) for k in range(2 * SAMPLES_KEPT + 5)])
    assert len(m.samples[0]) <= 2 * SAMPLES_KEPT and m.samples[0][-1] == (T0 + 2 * SAMPLES_KEPT + 4, 1_000.0 * (2 * SAMPLES_KEPT + 4))
    assert m.part([])["joules"] == pytest.approx(2 * SAMPLES_KEPT + 4)  # the attempt's total keeps the first sample


# --- the second cosmic-ray pass: what a record may hold, and each figure's exact rounding ----------


def dev(index, mj=None, used=True, why=None) -> dict:
    d = empty_device(index)
    d.update(energy_mj=mj, used_by_run=used)
    if why is not None:
        d["unsupported"] = {"energy_mj": why}
    return d


def test_a_record_without_a_usable_time_or_device_is_skipped_and_the_next_device_still_read():
    m = EnergyMeter()
    for bad_t in ("x", None, float("nan"), float("inf")):
        m.add_record({"t": bad_t, "devices": [dev(0, 1_000)]})  # no time: nothing to place it at
    assert m.samples == {}
    for t, mj in ((0, 1_000), (1, 2_000)):  # hostile entries first, then the run's device in the same record
        m.add_record({"t": T0 + t, "devices": ["not a dict", {"index": "0", "energy_mj": 5}, dev(3, 7, used=False),
                                               dev(2, None, why="Not Supported"), dev(0, mj)]})
    assert sorted(m.samples) == [0] and m.part([])["joules"] == 1.0  # GPU2 lacks the counter; GPU0 counted
    m.add_record({"t": T0 + 1, "devices": [dev(0, 9_000), dev(5, 4_000)]})  # GPU0's sample repeats its time
    assert sorted(m.samples) == [0, 5] and m.samples[0][-1] == (T0 + 1, 2_000.0)  # GPU5 still read


def test_the_counter_takes_zero_and_refuses_the_absurd():
    m = meter([(0, 0), (1, 1_500)])  # a driver loaded a moment ago: 0 mJ is a reading
    assert m.part([])["joules"] == 1.5
    for absurd in (-1, 1e18, 2e18, True, "5"):
        m2 = EnergyMeter()
        m2.add_record({"t": T0, "devices": [dev(0, absurd)]})
        assert m2.samples == {}, absurd
    m3 = meter([(0, 999_999_999_999_999_000), (1, 999_999_999_999_999_900)])  # just under 1e18 mJ
    assert 0 in m3.samples


def test_a_device_without_the_counter_says_why_whole_up_to_300_characters_and_never_hides_the_others():
    m = EnergyMeter()
    m.add_record({"t": T0, "devices": [dev(0, None, why="x" * 400)]})
    assert m.part([])["unsupported"] == "GPU0: " + "x" * 300
    m.add_record({"t": T0, "devices": [dev(1, None)]})  # no reason given: nothing to say for it, no crash
    assert m.part([])["unsupported"] == "GPU0: " + "x" * 300
    assert EnergyMeter().part([]) == {"joules": None, "joules_per_step": None, "tokens_per_joule": None, "steps": 0,
                                      "devices": [], "source": "nvmlDeviceGetTotalEnergyConsumption (mJ)",
                                      "unsupported": "no GPU energy samples (no NVML, or no device of the run)"}
    both = EnergyMeter()  # one device has the counter, another not: the figures of the one that has it
    for t, mj in ((0, 1_000), (1, 3_000)):
        both.add_record({"t": T0 + t, "devices": [dev(0, mj), dev(1, None, why="Not Supported")]})
    part = both.part([])
    assert part["joules"] == 2.0 and part["unsupported"] is None and part["devices"] == [0]
    late = meter([(0, 1_000), (1, 2_000)])  # the counter then goes missing for a sample: still counted
    late.add_record({"t": T0 + 2, "devices": [dev(0, None, why="Unknown Error")]})
    assert late.part([])["unsupported"] is None and late.part([])["joules"] == 1.0


def test_a_reset_is_judged_against_the_last_sample_and_keeps_fractions_of_a_joule():
    m = meter([(0, 1_000), (1, 5_500), (2, 3_000), (3, 3_250)])  # 3,000 < 5,500: a reload, though > 1,000
    assert m.part([])["joules"] == 4.75  # 4.5 J before the reload + 0.25 J after
    small = meter([(0, 1_000), (3, 5_000)])  # a small counter: (e1 - e0), never e1 % e0
    assert small.joules_between(T0 + 1, T0 + 2) == pytest.approx(4_000 / 3 / 1000, rel=1e-12)  # 1.333 J, unrounded


def test_the_exact_figures_are_rounded_as_documented():
    m = meter([(0, 0), (1, 1_234.56), (2, 2_469.12)])
    assert m.part([])["joules"] == 2.469  # 3 decimals
    part = m.part([step(1, 1.0, tokens=1000), step(2, 1.0, tokens=1000)])
    assert part["joules_per_step"] == 1.23456 and part["steps"] == 2  # 6 decimals: all of 1.23456
    assert part["tokens_per_joule"] == 810.0052  # 2000 / 2.46912 J to 4 decimals
    seventh = meter([(0, 0), (7, 1_000)])  # 1/7 J a second
    assert seventh.part([step(1, 1.0)])["joules_per_step"] == 0.142857
    assert seventh.part([step(1, 1.0, tokens=10)])["tokens_per_joule"] == 70.0
    half = meter([(0, 0), (1, 500)])  # under one joule in all: a rate all the same
    assert half.part([step(1, 1.0, tokens=100)])["tokens_per_joule"] == 200.0
    flat = meter([(0, 5_000), (1, 5_000), (2, 5_000)])  # idle: no joule, so no tokens per joule (never a 1/0)
    assert flat.part([step(1, 1.0), step(2, 1.0)])["tokens_per_joule"] is None


def test_which_steps_count_the_last_200_inside_the_samples_counted_and_timed():
    m = meter([(k, 1_000 * k) for k in range(300)])  # 1 J every second
    heavy = meter([(k, 1_000 * k + (9_000 * k if k <= 50 else 9_000 * 50)) for k in range(300)])  # 10 J/s to 50 s
    steps = [step(k, 1.0) for k in range(1, 251)]
    assert m.part(steps)["steps"] == 200 and heavy.part(steps)["joules_per_step"] == 1.0  # the last 200 only
    mixed = [SimpleNamespace(t=T0 + 5, dt_s=1.0, tokens=None),  # no `counted`: counted
             SimpleNamespace(t=T0 + 6, dt_s=1.0, tokens=None, counted=False),  # a first or flagged step
             SimpleNamespace(t=None, dt_s=1.0, tokens=None, counted=True),  # untimed
             SimpleNamespace(t=T0 + 7, dt_s=None, tokens=None, counted=True),
             SimpleNamespace(t=T0 + 500, dt_s=1.0, tokens=None, counted=True),  # after the samples
             step(8, 1.0)]
    assert m.part(mixed)["steps"] == 2
    assert meter([(0, 0), (1, 1_000)]).part([step(1, 2.0), step(1, 1.0)])["steps"] == 1  # the first starts before


def test_a_repeated_sample_time_is_ignored_not_interpolated():
    m = meter([(0, 1_000), (1, 2_000)])
    m.add_record({"t": T0 + 1, "devices": [dev(0, 5_000)]})  # the same second again: ignored
    m.add_record({"t": T0 + 2, "devices": [dev(0, 6_000)]})
    assert m.joules_between(T0 + 1, T0 + 1.5) == pytest.approx(2.0)  # (6,000 - 2,000) / 2 mJ, not from 5,000


def test_the_bound_on_samples_is_7200_then_halves_to_3601():
    m = meter([(k, 10 * k) for k in range(7200)])
    assert len(m.samples[0]) == 7200 == len(m.times[0])
    m2 = meter([(k, 10 * k) for k in range(7201)])
    assert len(m2.samples[0]) == 3601 == len(m2.times[0]) and m2.samples[0][0][0] == T0 + 3600
