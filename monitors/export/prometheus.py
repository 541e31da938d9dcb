"""A run's state in Prometheus' text format, from the status snapshot (the one object every view draws).

:class:`SnapshotCollector` turns a snapshot into metric families on each scrape (``prometheus_client``,
a registry of its own, never the process default; :mod:`.families` makes them, one collector per part of the
snapshot). The supervisor serves it for its run when the
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
import socket
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any, cast
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, MetricsHandler, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from stepwatch.monitors import fdreserve
from stepwatch.monitors.export.families import PREFIX, families as families  # re-exported: the tests import it here
from stepwatch.monitors.snapshot.types import Snapshot


class SnapshotCollector(Collector):
    """Metric families from ``snapshot()`` (None: nothing to say yet, only ``stepwatch_exporter_up``)."""

    def __init__(self, snapshot: Callable[[], Snapshot | None]):
        self.snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        snap = self.snapshot()
        up = GaugeMetricFamily(PREFIX + "exporter_snapshot_ready", "1 once the exporter holds a snapshot of the run")
        up.add_metric([], 0.0 if snap is None else 1.0)
        yield up
        if snap is None:
            return
        yield from families(snap)


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
