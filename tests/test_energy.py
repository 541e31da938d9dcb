"""Energy per optimizer step (issue 20; playbook 3.8): NVML's energy counter, replayed by the recorded
backend through the real sampler into gpu.jsonl, against steps whose ends are the samples' times:
joules per step exact to the recording; a device without the counter reads unsupported with NVML's
reason, never 0; a counter reset (a driver reload) starts a new segment."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest

from conftest import stepwatch
from stepwatch.monitors.gpu.energy import EnergyMeter
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
        assert "energy 750 J/step, 5.461 tokens/J, 21.75 kJ this attempt (GPU0, GPU1)" in line, line
