"""EnergyMeter's arithmetic at its edges (issue 21: the mutants a first cosmic-ray run of
monitors/gpu/energy.py left): interpolation between samples 2 s apart, a step starting on the first
sample, joules that are not whole, the median of unequal steps, an idle second (the counter unchanged)
that is no reset, a record from the past ignored, the memory bound."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from stepwatch.monitors.gpu.energy import SAMPLES_KEPT, EnergyMeter
from stepwatch.monitors.gpu.schema import empty_device, make_record

T0 = 1_780_000_000.0


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
