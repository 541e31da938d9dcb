"""The metric families of one status snapshot: one collector per part of it (as prometheus_client's own
collectors are one per concern), each reading its part with ``[...]`` so that pyright checks every key
against :mod:`stepwatch.monitors.snapshot.types`; :func:`families` lists them in the exposition's order.

Every name is :data:`PREFIX` and a suffix; every series has the labels :data:`BASE_LABELS`; a value the
snapshot does not know adds no sample (the family is still listed, with its HELP and TYPE). The names,
labels and units are described in :mod:`.prometheus`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from stepwatch.monitors.snapshot.gpuview import replayed
from stepwatch.monitors.snapshot.types import (LIVENESS_SIGNALS, Alert, Dynamo, Energy, Eta, Fallback, FileValue,
                                              GpuDevice, Identity, Ledger, LivenessSignals, Phase, Rank,
                                              RankStepSummary, Scaling, Scheduler, Snapshot, Stall, Step,
                                              StepSeconds, Throughput, Versions)
from stepwatch.monitors.snapshot.types import LossHealthPart, Metric as SnapMetric
from stepwatch.monitors.snapshot.runmodeltypes import Liveness
from stepwatch.monitors.states import (CATASTROPHIC, EXITED, FLAGGED, NOT_JUDGED, OK, PERSISTENT, PHASES, RUNNING, SPIKE,
                                      STALLED, SUSPECTED)

#: Every metric's name starts with this.
PREFIX = "stepwatch_"
#: The labels of every series, in this order.
BASE_LABELS = ("run", "attempt")
#: Slurm job states exported as ``stepwatch_scheduler_state{state=...}`` (1 for the current one).
SCHEDULER_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "COMPLETED", "FAILED", "CANCELLED",
                    "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "UNKNOWN")
_FALLBACK: dict[str, float] = {OK: 0.0, SUSPECTED: 1.0, FLAGGED: 2.0}
_STALLED: dict[str, float] = {STALLED: 1.0, SUSPECTED: 0.0, OK: 0.0}  # suspected: busy but silent, no page yet

_LABEL_OK = re.compile(r"[^A-Za-z0-9 _.+:/@-]")
_METRIC_NAME = re.compile(r"^[A-Za-z0-9_./-]{1,32}$")


def _label(v: FileValue) -> str:
    """A label value read from a run's files: printable ASCII of a few safe kinds, at most 64 chars."""
    return _LABEL_OK.sub("?", str(v or ""))[:64]


def _num(v: FileValue) -> float | None:
    """A sample value: a finite int or float within +-1e300 (a file's 400-digit int is no value)."""
    return float(v) if type(v) in (int, float) and -1e300 < v < 1e300 else None


def _ratio(pct: FileValue) -> float | None:
    """A percentage read from gpu.jsonl as a ratio 0..1 (None: no value)."""
    return None if _num(pct) is None else pct / 100.0


def _source(snap: Snapshot) -> dict[str, str]:
    """The ``source`` label of every GPU and energy figure: NVML measured it, or a recording replays it."""
    return {"source": "replay" if replayed(snap) else "nvml"}


class _Families:
    """The families one collector makes, in the order it first names them: the run's labels on every
    series, each family made on first use (a collector may add samples to one in a loop)."""

    def __init__(self, snap: Snapshot):
        self.lv = [_label(snap["run"]), _label(snap["attempt"])]
        self.out: list[Metric] = []
        self._made: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}

    def _family(self, kind: type[GaugeMetricFamily | CounterMetricFamily], name: str, doc: str,
                labels: Iterable[str]) -> GaugeMetricFamily | CounterMetricFamily:
        if name not in self._made:
            self._made[name] = kind(PREFIX + name, doc, labels=[*BASE_LABELS, *labels])
            self.out.append(self._made[name])
        return self._made[name]

    def _one(self, kind: type[GaugeMetricFamily | CounterMetricFamily], name: str, doc: str, value: FileValue,
             extra: Mapping[str, str] | None) -> None:
        fam = self._family(kind, name, doc, extra or {})
        if (v := _num(value)) is not None:
            fam.add_metric([*self.lv, *(extra or {}).values()], v)

    def gauge(self, name: str, doc: str, value: FileValue, extra: Mapping[str, str] | None = None) -> None:
        """One sample of the gauge ``PREFIX + name`` (made on first use); an unknown value adds none."""
        self._one(GaugeMetricFamily, name, doc, value, extra)

    def counter(self, name: str, doc: str, value: FileValue, extra: Mapping[str, str] | None = None) -> None:
        """One sample of the counter ``PREFIX + name`` (``_total``); an unknown value adds none."""
        self._one(CounterMetricFamily, name, doc, value, extra)

    def counters(self, name: str, doc: str, label: str, values: Mapping[str, float] | None) -> None:
        """The counter ``PREFIX + name``, one sample per key of ``values`` (its ``label``); None: no sample."""
        fam = self._family(CounterMetricFamily, name, doc, [label])
        for key, v in (values or {}).items():
            fam.add_metric([*self.lv, key], float(v))


def _run_families(snap: Snapshot) -> list[Metric]:
    """The run's identity (``identity``, ``versions``), its processes and how the attempt ended."""
    f, state = _Families(snap), snap["state"]
    ident: Identity | None = snap["identity"]
    versions: Versions = snap["versions"]
    commit, branch = (ident.get("harness_commit"), ident.get("branch")) if ident is not None else (None, None)
    info = InfoMetricFamily(PREFIX + "run", "The run's identity, sampled at launch", labels=list(BASE_LABELS))
    info.add_metric(f.lv, {"commit": _label(commit)[:12], "branch": _label(branch),
                           "torch": _label(versions["torch"]), "transformers": _label(versions["transformers"])})
    f.out.append(info)
    f.gauge("training_process_up", "1 while the training process (pid + create time) is alive",
            1.0 if state == RUNNING else 0.0)
    f.gauge("supervisor_up", "1 while the run's supervisor is alive", 1.0 if snap["supervisor_alive"] else 0.0)
    f.gauge("run_ended", "1 once the attempt ended (exit.json, or Slurm said so)", 1.0 if state == EXITED else 0.0)
    if state == EXITED:
        f.gauge("exit_code", "The training process's exit code (absent when killed by a signal)", snap["returncode"])
    return f.out


def _step_families(snap: Snapshot) -> list[Metric]:
    """``step`` and ``step_seconds``: the headline step and the counted steps' times."""
    f = _Families(snap)
    step: Step = snap["step"]
    ss: StepSeconds = snap["step_seconds"]
    f.counter("steps", "Optimizer steps completed (global_step)", step["global_step"])
    f.gauge("max_steps", "The planned number of optimizer steps", step["max_steps"])
    f.counter("step_time_observations", "Step times counted (the first step excluded)", ss["n"])
    for key in ("p50", "p90", "p99", "min", "max"):  # not a Prometheus summary: nearest-rank over the attempt
        f.gauge(f"step_time_{key}_seconds", f"Seconds per optimizer step, {key} (nearest-rank over the "
                "attempt's counted steps, the first step excluded)", ss[key])
    f.gauge("step_time_last_seconds", "The last optimizer step's seconds", ss["last"])
    return f.out


def _fallback_families(snap: Snapshot) -> list[Metric]:
    """``fallback``: the fallback detector's verdict."""
    f = _Families(snap)
    fb: Fallback = snap["fallback"]
    f.gauge("fallback_state", "Bimodal step times (a silent eager fallback): 0 ok, 1 suspected, 2 flagged; "
            "absent while not judged", _FALLBACK.get(fb["state"]))
    return f.out


def _stall_families(snap: Snapshot) -> list[Metric]:
    """``stall``: the stall detector's verdict and the step in progress."""
    f = _Families(snap)
    st: Stall = snap["stall"]
    f.gauge("stalled", "1 while the process is alive but no optimizer step ends (stall detector); absent "
            "while not judged", _STALLED.get(st["state"]))
    f.gauge("current_step_elapsed_seconds", "Seconds since the last optimizer step ended", st["current_step_elapsed_s"])
    f.gauge("stall_threshold_seconds", "How long the step in progress may run before it reads stalled "
            "(max(10 x p99, the floor), or the busy budget); absent while not judged", st["threshold_s"])
    return f.out


def _phase_families(snap: Snapshot) -> list[Metric]:
    """``phase``: one series per phase word, 1 for the one in force (as ``stepwatch_scheduler_state``)."""
    f = _Families(snap)
    ph: Phase = snap["phase"]
    for name in PHASES:
        f.gauge("phase", "1 for what the attempt is doing", 1.0 if ph["name"] == name else 0.0, {"phase": name})
    f.gauge("phase_seconds", "Seconds the attempt has been in its current phase", ph["for_s"])
    f.gauge("phase_budget_seconds", "How long the current evaluation or save may run", ph["budget_s"])
    return f.out


def _liveness_families(snap: Snapshot) -> list[Metric]:
    """``liveness.signals_s``: absent while unknown, so no sample is ever a made-up 0."""
    f = _Families(snap)
    liveness: Liveness = snap["liveness"]
    signals: LivenessSignals = liveness["signals_s"]
    for signal in LIVENESS_SIGNALS:
        f.gauge("liveness_seconds", "Seconds since the run's CPU time, train.log's bytes, its step moved",
                signals[signal], {"signal": signal})
    return f.out


def _ledger_families(snap: Snapshot) -> list[Metric]:
    """``ledger``: where the run's hours went (every attempt, restart gaps, the operator's idle time, lost work)."""
    f = _Families(snap)
    led: Ledger | None = snap["ledger"]
    phases_s, goodput = (led["phases_s"], led["goodput"]) if led is not None else (None, None)
    f.counters("time_seconds", "The run's wall time by account (the ledger)", "phase", phases_s)
    f.gauge("goodput_ratio", "Training time over the run's wall time (0..1; the ledger)", goodput)
    return f.out


def _eta_families(snap: Snapshot) -> list[Metric]:
    """``eta``."""
    f = _Families(snap)
    eta: Eta = snap["eta"]
    f.gauge("eta_seconds", "Seconds to the planned last step at the recent rate", eta["eta_s"])
    return f.out


def _throughput_families(snap: Snapshot) -> list[Metric]:
    """``throughput``: the job's own token counts per second."""
    f = _Families(snap)
    tp: Throughput = snap["throughput"]
    f.gauge("tokens_per_second", "Padded tokens per second (the job's own counts)", tp["tokens_per_s"])
    f.gauge("real_tokens_per_second", "Real (unpadded) tokens per second", tp["real_tokens_per_s"])
    return f.out


def _energy_families(snap: Snapshot) -> list[Metric]:
    """``energy``: the run's GPUs' energy this attempt, labelled measured or replayed."""
    f, src = _Families(snap), _source(snap)
    en: Energy = snap["energy"]
    f.counter("energy_joules", "Energy of the run's GPUs this attempt", en["joules"], src)
    f.gauge("energy_joules_per_step", "Joules per optimizer step (median of the recent steps)", en["joules_per_step"],
            src)
    f.gauge("tokens_per_joule", "Real tokens per joule over the recent steps", en["tokens_per_joule"], src)
    return f.out


def _scaling_families(snap: Snapshot) -> list[Metric]:
    """``scaling``: each term's share of the step, once the fit decided."""
    f = _Families(snap)
    sc: Scaling = snap["scaling"]
    if sc["verdict"] != "undetermined" and (shares := sc["shares"]) is not None:
        for term, share in shares.items():
            f.gauge("step_time_share", "The step's scaling fit t = A·Σbw + B·Σbw² + C: each term's share of the "
                    "mean step at the run's widths (linear, quadratic, constant)", share, {"term": term})
    return f.out


def _dynamo_families(snap: Snapshot) -> list[Metric]:
    """``dynamo``: torch.compile's counts."""
    f = _Families(snap)
    d: Dynamo = snap["dynamo"]
    f.counter("recompiles", "torch.compile / dynamo recompiles", d["recompiles"])
    f.counter("graph_breaks", "dynamo graph breaks", d["graph_breaks"])
    f.counter("recompile_limit_hits", "dynamo recompile-limit hits (that frame then runs eagerly)",
              d["recompile_limit_hits"])
    return f.out


def _alert_families(snap: Snapshot) -> list[Metric]:
    """``alerts``: raised per kind, and those not acknowledged and still active."""
    f = _Families(snap)
    by_kind: dict[str, list[Alert]] = {}
    a: Alert
    for a in snap["alerts"]:
        by_kind.setdefault(_label(a["kind"]), []).append(a)
    kinds = sorted(by_kind)
    f.counters("alerts", "Alerts raised in the attempt, by kind", "kind", {k: float(len(by_kind[k])) for k in kinds})
    for kind in kinds:
        f.gauge("alerts_unacknowledged", "Alerts of a kind not acknowledged and still active",
                sum(1 for a in by_kind[kind] if a["active"] and not a["acknowledged"]), {"kind": kind})
    return f.out


def _metric_families(snap: Snapshot) -> list[Metric]:
    """``metrics``: the latest value of each metric the log or the emitter gave, by a name fit for a label."""
    f = _Families(snap)
    m: SnapMetric
    for name, m in snap["metrics"].items():
        if _METRIC_NAME.match(name):  # else a name the log made up: not a label
            f.gauge("log_metric", "The latest value the training log or the emitter gave a metric "
                    "(loss, learning rate, grad norm, eval loss)", m["value"], {"name": name})
    return f.out


#: ``loss_health.state`` as a number (absent while not judged)
_LOSS_STATE = {OK: 0.0, SPIKE: 1.0, PERSISTENT: 2.0, CATASTROPHIC: 3.0}


def _loss_health_families(snap: Snapshot) -> list[Metric]:
    """``loss_health``: the training loss's verdict and its episodes so far."""
    f = _Families(snap)
    lh: LossHealthPart = snap["loss_health"]
    f.gauge("loss_health_state", "The training loss: 0 ok, 1 spike, 2 persistent rise, 3 catastrophic; absent while "
            "not judged", _LOSS_STATE.get(lh["state"]))
    f.gauge("loss_health_episodes", "Bad stretches of the training loss so far (spikes, rises)", float(lh["episodes"])
            if lh["state"] != NOT_JUDGED or lh["episodes"] else None)
    return f.out


def _ranks_families(snap: Snapshot) -> list[Metric]:
    """``ranks``: each ranked process whose liveness is known."""
    f = _Families(snap)
    r: Rank
    steps: RankStepSummary | None
    for r in snap["ranks"]:
        if r["alive"] is not None:
            lab = {"rank": str(r["rank"])}
            f.gauge("rank_up", "1 while a rank's latest process is alive", 1.0 if r["alive"] else 0.0, lab)
            f.gauge("rank_step_time_p50_seconds", "A rank's median seconds per optimizer step (nearest-rank)",
                    steps["p50"] if (steps := r["steps"]) is not None else None, lab)
    return f.out


def _gpu_row(f: _Families, g: GpuDevice, src: dict[str, str]) -> None:
    """One device's series (``gpu[]``)."""
    lab = {"gpu": str(g["index"]), **src}
    f.gauge("gpu_utilization_ratio", "NVML utilization (kernel-active time), 0..1", _ratio(g["util_pct"]), lab)
    f.gauge("gpu_sm_active_ratio", "SM activity (GPM), 0..1", _ratio(g["sm_active_pct"]), lab)
    f.gauge("gpu_tensor_active_ratio", "Tensor-core activity (GPM), 0..1", _ratio(g["tensor_active_pct"]), lab)
    f.gauge("gpu_power_watts", "Power draw", g["power_w"], lab)
    f.gauge("gpu_power_limit_watts", "The enforced power limit", g["power_limit_w"], lab)
    f.gauge("gpu_memory_used_bytes", "Device memory in use", g["mem_used_bytes"], lab)
    f.gauge("gpu_used_by_run", "1 when a process of the run holds the device", 1.0 if g["used_by_run"] else 0.0, lab)


def _gpu_families(snap: Snapshot) -> list[Metric]:
    """``gpu``: each device NVML reports (or a recording replays), and how many (absent: NVML unavailable)."""
    f, src = _Families(snap), _source(snap)
    if (rows := snap["gpu"]) is not None:
        for g in rows:
            _gpu_row(f, g, src)
    f.gauge("gpu_visible", "GPUs NVML reports for the run (absent: NVML unavailable)",
            len(rows) if rows is not None else None, src)
    return f.out


def _scheduler_families(snap: Snapshot) -> list[Metric]:
    """``scheduler``: a Slurm run's job (a local run has none)."""
    f = _Families(snap)
    sch: Scheduler | None
    if (sch := snap["scheduler"]) is not None:
        for state in SCHEDULER_STATES:
            f.gauge("scheduler_state", "1 for the Slurm job's current state", 1.0 if sch["state"] == state else 0.0,
                    {"state": state})
        f.gauge("scheduler_time_left_seconds", "Seconds left of the Slurm job's time limit", sch["time_left_s"])
        f.gauge("scheduler_time_limit_seconds", "The Slurm job's time limit", sch["time_limit_s"])
    return f.out


#: One collector per part of the snapshot, in the order the exposition lists their families.
COLLECTORS: tuple[Callable[[Snapshot], list[Metric]], ...] = (
    _run_families, _step_families, _fallback_families, _stall_families, _phase_families, _liveness_families,
    _ledger_families, _eta_families, _throughput_families, _energy_families, _scaling_families, _dynamo_families,
    _alert_families, _metric_families, _loss_health_families, _ranks_families, _gpu_families, _scheduler_families)


def families(snap: Snapshot) -> list[Metric]:
    """Every metric family of one snapshot: each collector's, in :data:`COLLECTORS`' order."""
    return [fam for collect in COLLECTORS for fam in collect(snap)]
