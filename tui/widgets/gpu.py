"""The run's process health line, and the GPU panel, from the run's gpu.jsonl (so history survives detaching): per device,
kernel-active % and power against the enforced limit over time, tensor activity where known, the
"SM-busy, tensor-idle" reading when it holds — or the "NVML unavailable" line."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Sparkline, Static

from stepwatch.monitors.snapshot.types import DeviceHistory, GpuDevice, Snapshot
from stepwatch.monitors.snapshot.gpuview import replayed
from stepwatch.tui.format import energy_words, gib, health_words
from stepwatch.tui.safe import one_line
from stepwatch.tui.widgets.base import Panel


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f}%"


def device_line(d: GpuDevice) -> Text:
    """``GPU0 NVIDIA H100  kernel-active 98%  power 290/700 W (41%)  tensor 12%  mem 40.1/80.0 GiB  verdict``."""
    t = Text()
    t.append(one_line(f"GPU{d['index']} {d['name'] or ''}"), "bold")  # a name read from gpu.jsonl: one line
    if d["used_by_run"]:
        ranks = d["run_ranks"] or []
        t.append(f" [run: rank {', '.join(map(str, ranks))}]" if ranks else " [run]", "cyan")
    t.append(f"  kernel-active {_pct(d['util_pct'])}")
    if d["power_w"] is not None and d["power_limit_w"]:
        t.append(f"  power {d['power_w']:.0f}/{d['power_limit_w']:.0f} W ({100 * (d['power_share'] or 0):.0f}%)")
    else:
        t.append("  power n/a")
    t.append(f"  tensor {_pct(d['tensor_active_pct'])}")
    t.append(f"  mem {gib(d['mem_used_bytes'])}/{gib(d['mem_total_bytes'])} GiB")
    if verdict := d["verdict"]:
        t.append(one_line(f"  {verdict}"), "bold red" if "tensor-idle" in str(verdict) else "yellow")
    return t


def summary_line(gpus: list[GpuDevice], replay: bool) -> Text:
    """The GPU in one line, for a short terminal: the run's first device (the first one if none is the run's),
    ``GPU0: SM 93% · 280/300 W · 41.0/80.0 GiB`` (kernel-active where SM activity is not known), how many more, and a
    recorded replay said first."""
    mine = [d for d in gpus if d["used_by_run"]] or gpus
    d = mine[0]
    busy = f"SM {_pct(d['sm_active_pct'])}" if d["sm_active_pct"] is not None else f"kernel-active {_pct(d['util_pct'])}"
    power = (f"{d['power_w']:.0f}/{d['power_limit_w']:.0f} W" if d["power_w"] is not None and d["power_limit_w"]
             else "power n/a")
    t = Text()
    if replay:
        t.append("RECORDED replay ", "bold yellow")  # the health line above says "not this machine"
    t.append(one_line(f"GPU{d['index']}"), "bold")
    t.append(f": {busy} · {power} · {gib(d['mem_used_bytes'])}/{gib(d['mem_total_bytes'])} GiB")
    if verdict := d["verdict"]:
        t.append(one_line(f" · {verdict}"), "bold red" if "tensor-idle" in str(verdict) else "yellow")
    if len(gpus) > 1:
        t.append(f" (+{len(gpus) - 1} more GPU{'s' if len(gpus) > 2 else ''}; a taller terminal lists them)", "dim")
    return t


class GpuPanel(Panel):
    """Per-device lines and, for the run's first device, util and power-share sparklines; on a short terminal
    (styles.tcss ``RunScreen.short``) one summary line instead (:func:`summary_line`)."""

    def compose(self) -> ComposeResult:
        yield Static("", id="health", classes="dim")
        yield Static("GPU: waiting for gpu.jsonl", id="gpu-summary")
        yield Static("GPU: waiting for gpu.jsonl", id="gpu-lines")
        with Horizontal(classes="plots"):
            with Vertical():
                yield Static("kernel-active % over time", classes="dim")
                yield Sparkline([], id="gpu-util")
            with Vertical():
                yield Static("power / enforced limit over time", classes="dim")
                yield Sparkline([], id="gpu-power")

    def show(self, snap: Snapshot, plots: bool = True) -> None:
        energy = energy_words(snap["energy"], replayed(snap))
        self._set("#health", Text(health_words(snap, basis=False) + (f" · {energy}" if energy else "")))
        gpus: list[GpuDevice] | None = snap["gpu"]
        if not gpus:
            err = snap["gpu_error"] or "no GPU samples yet"
            self._set("#gpu-lines", Text(err, "yellow"))
            self._set("#gpu-summary", Text(err, "yellow"))
            self.query_one(".plots").set_class(True, "off")
            return
        self.query_one(".plots").set_class(not plots, "off")  # a class, so that a short screen's CSS hides them too
        lines = Text("\n").join(device_line(d) for d in gpus)
        src = snap["gpu_source"] or ""
        self._set("#gpu-summary", summary_line(gpus, src.startswith("recorded")))
        if src.startswith("recorded"):
            lines = Text.assemble((f"RECORDED replay, not this machine: {one_line(src.split(':', 1)[-1])}\n", "bold yellow"),
                                  lines)
        self._set("#gpu-lines", lines, lines=True)  # one line per device
        if plots:
            hist: DeviceHistory | None = snap["gpu_history"].get(str(gpus[0]["index"]))  # keyed by the device's index: None before a sample
            util = [v or 0 for v in hist["util_pct"]][-120:] if hist is not None else []
            power = [100 * (v or 0) for v in hist["power_share"]][-120:] if hist is not None else []
            self.query_one("#gpu-util", Sparkline).data = util
            self.query_one("#gpu-power", Sparkline).data = power
