"""A run's state in Prometheus' text format, from the status snapshot (the one object every view draws).

:class:`SnapshotCollector` turns a snapshot into metric families on each scrape (``prometheus_client``,
a registry of its own, never the process default). The supervisor serves it for its run when the
config asks (``[export] prometheus = "127.0.0.1:9464"``, or a port range ``"127.0.0.1:9464-9480"``:
the first free one; a port alone binds the loopback), from the snapshot its detector loop made last
(about once a second): a scrape reads no file. Whoever connects, the endpoint holds a bounded number
of descriptors and threads (:class:`BoundedHTTPServer`). ``stepwatch export`` (:mod:`.textfile`)
writes the same text to stdout or for node-exporter's textfile collector.

Names follow Prometheus' conventions: one ``stepwatch_`` prefix, base units (seconds, watts, ratios
0..1), ``_total`` for counters, ``stepwatch_run_info`` for identity; labels ``run`` and ``attempt`` on
every series, ``rank``, ``gpu``, ``kind``, ``quantile``, ``state``, ``name``, ``phase``, ``signal``, ``source``
(``nvml`` or ``replay``, on every GPU and energy figure) where they apply (a handful of values each). A value the snapshot does not know is absent, never 0. Each number is
the snapshot's own: step times nearest-rank, first step excluded, GPU figures from NVML via gpu.jsonl.
"""

from __future__ import annotations

import contextlib
import errno
import re
import socket
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any, cast
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, MetricsHandler, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from stepwatch.monitors import fdreserve
from stepwatch.monitors.snapshot.gpuview import replayed
from stepwatch.monitors.snapshot.types import LIVENESS_SIGNALS, Snapshot
from stepwatch.monitors.states import EXITED, FLAGGED, OK, PHASES, RUNNING, STALLED, SUSPECTED

#: Slurm job states exported as ``stepwatch_scheduler_state{state=...}`` (1 for the current one).
SCHEDULER_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "COMPLETED", "FAILED", "CANCELLED",
                    "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "UNKNOWN")
_FALLBACK: dict[str, float] = {OK: 0.0, SUSPECTED: 1.0, FLAGGED: 2.0}
_STALLED: dict[str, float] = {STALLED: 1.0, SUSPECTED: 0.0, OK: 0.0}  # suspected: busy but silent, no page yet

_LABEL_OK = re.compile(r"[^A-Za-z0-9 _.+:/@-]")
_METRIC_NAME = re.compile(r"^[A-Za-z0-9_./-]{1,32}$")


def _label(v: Any) -> str:
    """A label value read from a run's files: printable ASCII of a few safe kinds, at most 64 chars."""
    return _LABEL_OK.sub("?", str(v or ""))[:64]


def _num(v: Any) -> float | None:
    """A sample value: a finite int or float within +-1e300 (a file's 400-digit int is no value)."""
    return float(v) if type(v) in (int, float) and -1e300 < v < 1e300 else None


class SnapshotCollector(Collector):
    """Metric families from ``snapshot()`` (None: nothing to say yet, only ``stepwatch_exporter_up``)."""

    def __init__(self, snapshot: Callable[[], Snapshot | None]):
        self.snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        snap = self.snapshot()
        up = GaugeMetricFamily("stepwatch_exporter_snapshot_ready", "1 once the exporter holds a snapshot of the run")
        up.add_metric([], 0.0 if snap is None else 1.0)
        yield up
        if snap is None:
            return
        yield from families(snap)


def families(snap: Snapshot) -> list[Metric]:
    """Every metric family of one snapshot (see the module docstring for the names)."""
    base = ["run", "attempt"]
    lv = [_label(snap.get("run")), _label(snap.get("attempt"))]
    out: list[Metric] = []
    gauges: dict[str, GaugeMetricFamily] = {}

    def gauge(name: str, doc: str, value: Any, extra: dict[str, str] | None = None) -> None:
        """One sample of the gauge family ``name`` (made on first use); an unknown value adds none."""
        if name not in gauges:
            gauges[name] = GaugeMetricFamily(name, doc, labels=base + list(extra or {}))
            out.append(gauges[name])
        v = _num(value)
        if v is not None:
            gauges[name].add_metric(lv + list((extra or {}).values()), v)

    ident = snap.get("identity") or {}
    info = InfoMetricFamily("stepwatch_run", "The run's identity, sampled at launch", labels=base)
    versions = snap.get("versions") or {}
    info.add_metric(lv, {"commit": _label(ident.get("harness_commit"))[:12], "branch": _label(ident.get("branch")),
                         "torch": _label(versions.get("torch")), "transformers": _label(versions.get("transformers"))})
    out.append(info)
    gauge("stepwatch_training_process_up", "1 while the training process (pid + create time) is alive",
          1.0 if snap.get("state") == RUNNING else 0.0)
    gauge("stepwatch_supervisor_up", "1 while the run's supervisor is alive", 1.0 if snap.get("supervisor_alive") else 0.0)
    gauge("stepwatch_run_ended", "1 once the attempt ended (exit.json, or Slurm said so)",
          1.0 if snap.get("state") == EXITED else 0.0)
    if snap.get("state") == EXITED:
        gauge("stepwatch_exit_code", "The training process's exit code (absent when killed by a signal)",
              snap.get("returncode"))
    step = snap.get("step") or {}
    steps = CounterMetricFamily("stepwatch_steps", "Optimizer steps completed (global_step)", labels=base)
    if (global_step := _num(step.get("global_step"))) is not None:
        steps.add_metric(lv, global_step)
    out.append(steps)
    gauge("stepwatch_max_steps", "The planned number of optimizer steps", step.get("max_steps"))
    ss = snap.get("step_seconds") or {}
    counted = CounterMetricFamily("stepwatch_step_time_observations", "Step times counted (the first step excluded)",
                                  labels=base)
    counted.add_metric(lv, float(ss.get("n") or 0))
    out.append(counted)
    for key in ("p50", "p90", "p99", "min", "max"):  # not a Prometheus summary: nearest-rank over the attempt
        gauge(f"stepwatch_step_time_{key}_seconds", f"Seconds per optimizer step, {key} (nearest-rank over the "
              "attempt's counted steps, the first step excluded)", ss.get(key))
    gauge("stepwatch_step_time_last_seconds", "The last optimizer step's seconds", ss.get("last"))
    fb, st = snap.get("fallback") or {}, snap.get("stall") or {}
    gauge("stepwatch_fallback_state", "Bimodal step times (a silent eager fallback): 0 ok, 1 suspected, 2 flagged; "
          "absent while not judged", _FALLBACK.get(fb.get("state") or ""))
    gauge("stepwatch_stalled", "1 while the process is alive but no optimizer step ends (stall detector); absent "
          "while not judged", _STALLED.get(st.get("state") or ""))
    gauge("stepwatch_current_step_elapsed_seconds", "Seconds since the last optimizer step ended",
          st.get("current_step_elapsed_s"))
    gauge("stepwatch_stall_threshold_seconds", "How long the step in progress may run before it reads stalled "
          "(max(10 x p99, the floor), or the busy budget); absent while not judged", st.get("threshold_s"))
    ph = snap.get("phase") or {}
    for name in PHASES:  # one series per phase word, 1 for the one in force (as stepwatch_scheduler_state)
        gauge("stepwatch_phase", "1 for what the attempt is doing", 1.0 if ph.get("name") == name else 0.0, {"phase": name})
    gauge("stepwatch_phase_seconds", "Seconds the attempt has been in its current phase", ph.get("for_s"))
    gauge("stepwatch_phase_budget_seconds", "How long the current evaluation or save may run", ph.get("budget_s"))
    for signal in LIVENESS_SIGNALS:  # absent while unknown: no sample is ever a made-up 0
        gauge("stepwatch_liveness_seconds", "Seconds since the run's CPU time, train.log's bytes, its step moved",
              ((snap.get("liveness") or {}).get("signals_s") or {}).get(signal), {"signal": signal})
    led = snap.get("ledger") or {}  # where the run's hours went: every attempt, restart gaps, lost work (the ledger)
    spent = CounterMetricFamily("stepwatch_time_seconds", "The run's wall time by account (the ledger)", labels=base + ["phase"])
    for name, seconds in (led.get("phases_s") or {}).items():
        spent.add_metric(lv + [name], float(seconds))
    out.append(spent)
    gauge("stepwatch_goodput_ratio", "Training time over the run's wall time (0..1; the ledger)", led.get("goodput"))
    eta = snap.get("eta") or {}
    gauge("stepwatch_eta_seconds", "Seconds to the planned last step at the recent rate", eta.get("eta_s"))
    tp = snap.get("throughput") or {}
    gauge("stepwatch_tokens_per_second", "Padded tokens per second (the job's own counts)", tp.get("tokens_per_s"))
    gauge("stepwatch_real_tokens_per_second", "Real (unpadded) tokens per second", tp.get("real_tokens_per_s"))
    en = snap.get("energy") or {}
    src = {"source": "replay" if replayed(snap) else "nvml"}  # every GPU figure: NVML measured it, or a recording
    joules = CounterMetricFamily("stepwatch_energy_joules", "Energy of the run's GPUs this attempt", labels=base + ["source"])
    if (j := _num(en.get("joules"))) is not None:
        joules.add_metric(lv + [src["source"]], j)
    out.append(joules)
    gauge("stepwatch_energy_joules_per_step", "Joules per optimizer step (median of the recent steps)",
          en.get("joules_per_step"), src)
    gauge("stepwatch_tokens_per_joule", "Real tokens per joule over the recent steps", en.get("tokens_per_joule"), src)
    sc = snap.get("scaling") or {}
    if sc.get("verdict") not in (None, "undetermined"):
        for term, share in (sc.get("shares") or {}).items():
            gauge("stepwatch_step_time_share", "The step's scaling fit t = A·Σbw + B·Σbw² + C: each term's share of "
                  "the mean step at the run's widths (linear, quadratic, constant)", share, {"term": str(term)})
    d = snap.get("dynamo") or {}
    for key, name, doc in (("recompiles", "stepwatch_recompiles", "torch.compile / dynamo recompiles"),
                           ("graph_breaks", "stepwatch_graph_breaks", "dynamo graph breaks"),
                           ("recompile_limit_hits", "stepwatch_recompile_limit_hits",
                            "dynamo recompile-limit hits (that frame then runs eagerly)")):
        c = CounterMetricFamily(name, doc, labels=base)
        if _num(d.get(key)) is not None:
            c.add_metric(lv, float(d[key]))
        out.append(c)
    raised = CounterMetricFamily("stepwatch_alerts", "Alerts raised in the attempt, by kind", labels=base + ["kind"])
    active: dict[str, int] = {}
    for kind in sorted({_label(a.get("kind")) for a in snap.get("alerts") or [] if isinstance(a.get("kind"), str)}):
        mine = [a for a in snap["alerts"] if _label(a.get("kind")) == kind]
        raised.add_metric(lv + [kind], float(len(mine)))
        active[kind] = sum(1 for a in mine if a.get("active") is not False and not a.get("acknowledged"))
    out.append(raised)
    for kind, n in active.items():
        gauge("stepwatch_alerts_unacknowledged", "Alerts of a kind not acknowledged and still active", n, {"kind": kind})
    for name, m in (snap.get("metrics") or {}).items():
        if not (isinstance(name, str) and _METRIC_NAME.match(name)):
            continue  # a name the log made up: not a label
        gauge("stepwatch_log_metric", "The latest value the training log or the emitter gave a metric "
              "(loss, learning rate, grad norm, eval loss)", m.get("value") if isinstance(m, dict) else None,
              {"name": name})
    for r in snap.get("ranks") or []:
        if isinstance(r, dict) and isinstance(r.get("rank"), int) and r.get("alive") is not None:
            gauge("stepwatch_rank_up", "1 while a rank's latest process is alive", 1.0 if r.get("alive") else 0.0,
                  {"rank": str(r["rank"])})
            gauge("stepwatch_rank_step_time_p50_seconds", "A rank's median seconds per optimizer step (nearest-rank)",
                  (r.get("steps") or {}).get("p50"), {"rank": str(r["rank"])})
    for g in snap.get("gpu") or []:
        lab = {"gpu": str(g.get("index")), **src}
        pct = lambda k: None if _num(g.get(k)) is None else g[k] / 100.0  # noqa: E731 - percent to a ratio
        gauge("stepwatch_gpu_utilization_ratio", "NVML utilization (kernel-active time), 0..1", pct("util_pct"), lab)
        gauge("stepwatch_gpu_sm_active_ratio", "SM activity (GPM), 0..1", pct("sm_active_pct"), lab)
        gauge("stepwatch_gpu_tensor_active_ratio", "Tensor-core activity (GPM), 0..1", pct("tensor_active_pct"), lab)
        gauge("stepwatch_gpu_power_watts", "Power draw", g.get("power_w"), lab)
        gauge("stepwatch_gpu_power_limit_watts", "The enforced power limit", g.get("power_limit_w"), lab)
        gauge("stepwatch_gpu_memory_used_bytes", "Device memory in use", g.get("mem_used_bytes"), lab)
        gauge("stepwatch_gpu_used_by_run", "1 when a process of the run holds the device", 1.0 if g.get("used_by_run") else 0.0, lab)
    gauge("stepwatch_gpu_visible", "GPUs NVML reports for the run (absent: NVML unavailable)",
          len(gpu) if (gpu := snap.get("gpu")) is not None else None, src)
    sch = snap.get("scheduler")
    if sch:
        for state in SCHEDULER_STATES:
            gauge("stepwatch_scheduler_state", "1 for the Slurm job's current state", 1.0 if sch.get("state") == state else 0.0,
                  {"state": state})
        gauge("stepwatch_scheduler_time_left_seconds", "Seconds left of the Slurm job's time limit", sch.get("time_left_s"))
        gauge("stepwatch_scheduler_time_limit_seconds", "The Slurm job's time limit", sch.get("time_limit_s"))
    return out


def registry_for(snapshot: Callable[[], Snapshot | None]) -> CollectorRegistry:
    """A registry of its own holding one :class:`SnapshotCollector` (never the process default)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SnapshotCollector(snapshot))
    return reg


def text_of(snap: Snapshot) -> bytes:
    """The exposition text of one snapshot."""
    return generate_latest(registry_for(lambda: snap))


#: Where the endpoint binds when ``[export] prometheus`` names a port and no host (``"9464"``,
#: ``":9464-9480"``): the loopback, so only this machine scrapes it (issue 30; a scraper elsewhere
#: needs a host named on purpose, e.g. ``"0.0.0.0:9464"``).
DEFAULT_HOST = "127.0.0.1"
#: At most this many connections are served at once, each with a thread and a descriptor; one more is
#: closed as it is accepted, with no thread. A run has a scraper or an HA pair of them plus an operator's
#: curl, one connection each per scrape: 32 is ten times that, and 32 descriptors are 3% of the
#: 1,024-descriptor limit that 1,013 idle connections exhausted in issue 30.
MAX_CONNECTIONS = 32
#: Each read and write of a connection waits at most this long, so an idle connection is dropped after
#: it: a scraper sends its whole request (a few hundred bytes) as it connects, and Prometheus gives a
#: scrape 10 s (its default scrape_timeout), so 5 s of silence is no scraper's.
READ_TIMEOUT_S = 5.0
#: ... and however it trickles, a connection is shut down this long after it was accepted: Prometheus'
#: default scrape_timeout, after which the scraper has abandoned the answer.
CONNECTION_DEADLINE_S = 10.0
#: How often the serving loop looks for connections past their deadline (socketserver's own default).
POLL_INTERVAL_S = 0.5
#: Connections the kernel queues for the serving loop (they hold no descriptor of ours until accepted):
#: Linux's default net.core.somaxconn before 5.4. socketserver's 5 drops a burst's SYNs, each costing
#: its client a 1 s retransmission: 1,000 connections took 165 s to open (2026-12-03, 2 cores), 1.1 s with 128.
LISTEN_BACKLOG = 128
#: Out of descriptors, the serving loop waits this long before it accepts again.
SHORT_BACKOFF_S = 0.1


def parse_address(spec: str) -> tuple[str, list[int]]:
    """``"127.0.0.1:9464"`` or ``"127.0.0.1:9464-9480"`` -> (host, ports to try); a port or range with
    no host (``"9464"``, ``":9464-9480"``) -> :data:`DEFAULT_HOST`. Raises ValueError."""
    host, _, ports = str(spec).rpartition(":")
    lo, _, hi = ports.partition("-")
    if not lo.isdigit() or (hi and not hi.isdigit()):
        raise ValueError(f"prometheus must be [HOST:]PORT or [HOST:]FIRST-LAST, e.g. \"127.0.0.1:9464\" (a port alone "
                         f"binds {DEFAULT_HOST}): the port must be a number or a range FIRST-LAST; got {spec!r}")
    first, last = int(lo), int(hi or lo)
    if not 1 <= first <= last <= 65535 or last - first > 1000:
        raise ValueError(f"prometheus: ports {first}-{last} are not a range of at most 1,000 ports within 1-65535")
    return host.strip("[]") or DEFAULT_HOST, list(range(first, last + 1))


class _Handler(MetricsHandler):
    """prometheus_client's ``/metrics`` handler for the registry of the server it serves; each read and
    write waits at most the server's read timeout (a timeout ends the connection, quietly)."""

    def setup(self) -> None:
        server = cast(BoundedHTTPServer, self.server)
        self.request.settimeout(server.read_timeout_s)
        self.registry = server.registry
        super().setup()


class BoundedHTTPServer(ThreadingHTTPServer):
    """The standard library's thread-per-connection HTTP server, bounded: at most ``max_connections``
    served at once (one more is refused by :meth:`verify_request`, so socketserver closes it in the
    serving loop before any thread), each read or write waiting ``read_timeout_s`` at most, each
    connection shut down ``deadline_s`` after it was accepted (:meth:`service_actions`). A client's
    errors are counted, never printed (stderr is supervisor.log). ``refused``: connections closed at
    once, the cap reached."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], registry: CollectorRegistry, family: socket.AddressFamily,
                 max_connections: int = MAX_CONNECTIONS, read_timeout_s: float = READ_TIMEOUT_S,
                 deadline_s: float = CONNECTION_DEADLINE_S):
        self.address_family = family
        self.registry = registry
        self.max_connections, self.read_timeout_s, self.deadline_s = max_connections, read_timeout_s, deadline_s
        self.refused = self.errors = 0
        self._lock = threading.Lock()
        self._open: dict[Any, float] = {}  # each connection being served -> its deadline (time.monotonic)
        super().__init__(address, _Handler)

    @property
    def serving(self) -> int:
        """Connections being served now (each holds a thread and a descriptor)."""
        with self._lock:
            return len(self._open)

    def get_request(self) -> tuple[Any, Any]:
        """Accept a connection once the descriptors held back for exit.json and alerts are all back (a new
        connection never takes one); else it waits in the kernel's queue, and the loop never spins."""
        if not fdreserve.refill():
            time.sleep(SHORT_BACKOFF_S)
            raise OSError(errno.EMFILE, "the descriptors held back for exit.json and alerts are not all back")
        try:
            return super().get_request()
        except OSError as e:
            if fdreserve.is_short(e):
                time.sleep(SHORT_BACKOFF_S)
            raise

    def verify_request(self, request: Any, client_address: Any) -> bool:
        with self._lock:
            if len(self._open) >= self.max_connections:
                self.refused += 1
                return False
            self._open[request] = time.monotonic() + self.deadline_s
            return True

    def shutdown_request(self, request: Any) -> None:
        with self._lock:  # service_actions then never shuts down a descriptor closed here (and reused)
            self._open.pop(request, None)
            super().shutdown_request(request)

    def service_actions(self) -> None:
        now = time.monotonic()
        with self._lock:
            for conn in [c for c, deadline in self._open.items() if deadline <= now]:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)  # its thread's read or write returns, and it closes

    def handle_error(self, request: Any, client_address: Any) -> None:
        self.errors += 1

    def server_close(self) -> None:
        super().server_close()
        with self._lock:
            for conn in self._open:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)


def _bind_family(host: str, port: int) -> tuple[socket.AddressFamily, str]:
    """The family and address to bind ``host`` with (an IPv6 host needs AF_INET6)."""
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    return family, str(sockaddr[0])


class Exporter:
    """The supervisor's endpoint: ``start()`` binds the first free port of the configured address
    and serves ``/metrics`` in a daemon thread (a :class:`BoundedHTTPServer`, with the module's bounds
    unless given); :meth:`update` hands it the newest snapshot."""

    def __init__(self, spec: str, max_connections: int = MAX_CONNECTIONS, read_timeout_s: float = READ_TIMEOUT_S,
                 deadline_s: float = CONNECTION_DEADLINE_S):
        self.host, self.ports = parse_address(spec)
        self.max_connections, self.read_timeout_s, self.deadline_s = max_connections, read_timeout_s, deadline_s
        self._snap: Snapshot | None = None
        self._lock = threading.Lock()
        self.address: str | None = None
        self.server: BoundedHTTPServer | None = None

    def update(self, snap: Snapshot) -> None:
        with self._lock:
            self._snap = snap

    def _latest(self) -> Snapshot | None:
        with self._lock:
            return self._snap

    def start(self) -> str:
        """Serve; returns ``host:port``. Raises OSError when every port of the range is taken."""
        reg = registry_for(self._latest)
        last: OSError | None = None
        for port in self.ports:
            try:
                family, addr = _bind_family(self.host, port)
                server = BoundedHTTPServer((addr, port), reg, family, self.max_connections, self.read_timeout_s,
                                           self.deadline_s)
            except OSError as e:
                last = e
                continue
            threading.Thread(target=server.serve_forever, args=(POLL_INTERVAL_S,), name="prometheus-endpoint",
                             daemon=True).start()
            self.server = server
            self.address = f"{self.host}:{port}"
            return self.address
        raise OSError(f"no free port for the Prometheus endpoint in {self.host}:{self.ports[0]}-{self.ports[-1]}: {last}")

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
