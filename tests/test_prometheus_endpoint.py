"""The supervisor's Prometheus endpoint stays bounded whoever connects (issue 30, item 4: another
local user held 1,013 idle connections, the supervisor ran out of descriptors, ``stop`` sent nothing
and no exit.json was written).

Unit tier, in-process (an :class:`Exporter` on a loopback port, real sockets, no sleeps): a port
alone binds the loopback; connections beyond the cap are closed at once and get no thread; an idle
connection is dropped after the read timeout and a trickling one at its deadline; a scrape is
answered while the cap is partly used. System tier: a real run with an endpoint, 1,000 idle
connections held by a second user (a member of a team's group, created by the test), and the supervisor
still stops the run, writes exit.json and delivers an alert; after they close, a scrape says what
``status --json`` says. And with every descriptor of the supervisor taken (its limit lowered to what it
holds, the member's connections queued for the rest), an alert is still delivered and exit.json written:
the descriptors the supervisor holds back (monitors/fdreserve.py) are the exporter's last to take.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import socket
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from conftest import REPO_ROOT, git, make_repo, stepwatch, wait_until
from stepwatch.monitors.export.prometheus import (
    DEFAULT_HOST, MAX_CONNECTIONS, READ_TIMEOUT_S, BoundedHTTPServer, Exporter, parse_address)
from stepwatch.monitors.snapshot.observer import snapshot

STATIC_RUN = REPO_ROOT / "tests" / "fixtures" / "runs" / "ended-sigkill"
#: The longest a test waits for something that should happen at once (a close, an answer).
PROMPT_S = 5.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server(ex: Exporter) -> BoundedHTTPServer:
    assert ex.server is not None, "the exporter is not serving"
    return ex.server


def _port(ex: Exporter) -> int:
    return int(_server(ex).server_address[1])


def _handler_threads() -> int:
    """Threads serving a connection (socketserver names them after process_request_thread)."""
    return sum("process_request_thread" in t.name for t in threading.enumerate())


def _closed_by_server(conn: socket.socket, within_s: float) -> bool:
    """True once the server closed ``conn`` (end of file or a reset) within ``within_s``; False when
    it is still open then (0: look without waiting)."""
    try:
        conn.settimeout(within_s if within_s > 0 else 0.0)  # 0: non-blocking, a look
        return conn.recv(1) == b""
    except (BlockingIOError, TimeoutError):
        return False
    except ConnectionError:
        return True


def _scrape(ex: Exporter) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{_port(ex)}/metrics", timeout=PROMPT_S) as resp:
        assert resp.status == 200
        return resp.read().decode()


@pytest.fixture
def serve() -> Iterator[Callable[..., Exporter]]:
    """``serve(spec=None, **bounds)``: a started Exporter holding the fixture run's snapshot (a port
    range with no host unless ``spec`` is given); closed at the end."""
    made: list[Exporter] = []

    def start(spec: str | None = None, **bounds: Any) -> Exporter:
        first = _free_port()
        ex = Exporter(spec or f":{first}-{first + 20}", **bounds)
        ex.update(snapshot(STATIC_RUN))
        ex.start()
        made.append(ex)
        return ex

    yield start
    for ex in made:
        ex.close()


@pytest.fixture
def connect() -> Iterator[Callable[[Exporter], socket.socket]]:
    """``connect(ex)``: a TCP connection to the endpoint that sends nothing; closed at the end."""
    opened: list[socket.socket] = []

    def one(ex: Exporter) -> socket.socket:
        conn = socket.create_connection(("127.0.0.1", _port(ex)), timeout=PROMPT_S)
        opened.append(conn)
        return conn

    yield one
    for conn in opened:
        conn.close()


def test_a_port_without_a_host_binds_the_loopback_and_a_named_host_is_kept(serve: Callable[..., Exporter]):
    assert parse_address("9464") == (DEFAULT_HOST, [9464]) == ("127.0.0.1", [9464])
    assert parse_address(":9464-9466") == ("127.0.0.1", [9464, 9465, 9466])
    assert parse_address("0.0.0.0:9464") == ("0.0.0.0", [9464])  # control: a host named is the host bound
    assert parse_address("[::1]:9464") == ("::1", [9464])
    for bad in ("", ":", "127.0.0.1:", "localhost", "127.0.0.1:0", "127.0.0.1:9464-9000", "9464:x"):
        with pytest.raises(ValueError):
            parse_address(bad)
    ex = serve()  # ":FIRST-LAST"
    assert _server(ex).server_address[0] == "127.0.0.1" and ex.address == f"127.0.0.1:{_port(ex)}"
    assert "stepwatch_steps_total" in _scrape(ex)
    anywhere = serve(f"0.0.0.0:{_free_port()}")
    assert _server(anywhere).server_address[0] == "0.0.0.0"
    taken = socket.create_server(("127.0.0.1", _free_port()))  # the range's first port is busy: the next one
    try:
        first = taken.getsockname()[1]
        nxt = serve(f":{first}-{first + 20}")
        assert _port(nxt) != first and nxt.address == f"127.0.0.1:{_port(nxt)}"
    finally:
        taken.close()


def test_connections_beyond_the_cap_are_closed_at_once_and_get_no_thread(
        serve: Callable[..., Exporter], connect: Callable[[Exporter], socket.socket], monkeypatch: pytest.MonkeyPatch):
    ex = serve(max_connections=3, read_timeout_s=60.0, deadline_s=60.0)
    server = _server(ex)
    threads_started: list[object] = []
    real = server.process_request  # what starts a connection's thread (socketserver.ThreadingMixIn)
    monkeypatch.setattr(server, "process_request", lambda req, addr: (threads_started.append(addr), real(req, addr)))
    before = _handler_threads()
    held = [connect(ex) for _ in range(3)]
    wait_until(lambda: server.serving == 3, PROMPT_S, what="three connections served")
    assert _handler_threads() == before + 3 and len(threads_started) == 3
    beyond = [connect(ex) for _ in range(5)]
    assert all(_closed_by_server(c, PROMPT_S) for c in beyond)
    assert server.refused == 5 and server.serving == 3
    assert len(threads_started) == 3 and _handler_threads() == before + 3  # no thread for the five
    assert not any(_closed_by_server(c, 0) for c in held)  # control: those within the cap are still open
    held[0].close()  # a slot comes back when one closes
    wait_until(lambda: server.serving == 2, PROMPT_S, what="the closed connection to leave")
    assert "stepwatch_steps_total" in _scrape(ex) and server.refused == 5
    ex.close()  # closing the endpoint ends the connections it still held
    assert all(_closed_by_server(c, PROMPT_S) for c in held[1:])
    wait_until(lambda: _handler_threads() == before, PROMPT_S, what="the handler threads to end")


def test_an_idle_connection_is_dropped_after_the_read_timeout(
        serve: Callable[..., Exporter], connect: Callable[[Exporter], socket.socket]):
    patient = serve(read_timeout_s=60.0, deadline_s=60.0)
    quick = serve(read_timeout_s=0.3, deadline_s=60.0)
    kept = connect(patient)
    t0 = time.monotonic()
    idle = connect(quick)
    assert _closed_by_server(idle, PROMPT_S)
    took = time.monotonic() - t0
    assert 0.3 <= took < PROMPT_S, took
    assert not _closed_by_server(kept, 0)  # control: with a long read timeout the idle one is still open
    wait_until(lambda: _server(quick).serving == 0, PROMPT_S, what="the dropped connection to leave")
    assert _server(patient).serving == 1 and _server(quick).errors == 0  # a timeout is no error to print


def test_a_trickling_connection_is_shut_down_at_its_deadline(
        serve: Callable[..., Exporter], connect: Callable[[Exporter], socket.socket]):
    ex = serve(read_timeout_s=60.0, deadline_s=0.3)
    conn = connect(ex)
    t0 = time.monotonic()

    def trickle_then_look() -> bool:
        try:
            conn.send(b"G")  # a byte per poll: the read timeout never fires
        except OSError:
            return True
        return _closed_by_server(conn, 0)

    wait_until(trickle_then_look, PROMPT_S, interval_s=0.05, what="the deadline to shut the connection")
    assert time.monotonic() - t0 < PROMPT_S
    wait_until(lambda: _server(ex).serving == 0, PROMPT_S, what="the connection to leave")


def test_a_scrape_is_answered_while_the_cap_is_partly_used_and_refused_when_full(
        serve: Callable[..., Exporter], connect: Callable[[Exporter], socket.socket]):
    ex = serve(max_connections=4, read_timeout_s=60.0, deadline_s=60.0)
    server = _server(ex)
    held = [connect(ex) for _ in range(3)]
    wait_until(lambda: server.serving == 3, PROMPT_S, what="three idle connections served")
    text = _scrape(ex)
    assert 'stepwatch_steps_total{attempt="1",run="ended-sigkill"} 100.0' in text
    assert "stepwatch_exporter_snapshot_ready 1.0" in text and server.refused == 0
    held.append(connect(ex))  # control: with the cap full, a scrape is refused
    wait_until(lambda: server.serving == 4, PROMPT_S, what="four idle connections served")
    with pytest.raises(OSError):  # the connection closed without a response
        _scrape(ex)
    assert server.refused == 1


# ---------------------------------------------------------------- system tier

TRAIN_PY = r'''
import time
for step in range(1, 100000):
    time.sleep(0.05)
    print(f"step {step}/100000 loss {1.0 / step:.4f}", flush=True)
'''
PING_PY = r'''
import json, os, sys
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"kind": os.environ["STEPWATCH_ALERT_KIND"], "id": os.environ["STEPWATCH_ALERT_ID"]}) + "\n")
'''
#: The connections the second user holds (issue 30: 1,013 of a 1,024-descriptor limit).
IDLE_CONNECTIONS = 1000
#: The supervisor's descriptor limit in the test: the limit issue 30's supervisor ran under.
SUPERVISOR_NOFILE = 1024


def _hold_as_second_user(port: int, n: int, member: tuple[int, int]) -> tuple[int, int, int]:
    """Fork a child that becomes the team's member (``member``: uid, gid), opens ``n`` idle connections to ``port`` and holds them
    (its side) until the parent closes the returned release descriptor. Returns (pid, report fd,
    release fd); the report is one JSON line: opened, closed (by the server, counted until all
    but the cap are, or for half the read timeout) and uid."""
    report_r, report_w = os.pipe()
    release_r, release_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the second user
        try:
            os.close(report_r)
            os.close(release_w)
            _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            os.setgroups([member[1]])
            os.setgid(member[1])
            os.setuid(member[0])
            conns = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]
            poller = select.poll()
            for c in conns:
                poller.register(c, select.POLLIN)
            closed: set[int] = set()
            until = time.monotonic() + READ_TIMEOUT_S / 2  # before the served ones' read timeout
            while len(closed) < n - MAX_CONNECTIONS and time.monotonic() < until:
                for fd, _ in poller.poll(50):
                    closed.add(fd)
                    poller.unregister(fd)
            os.write(report_w, json.dumps({"opened": len(conns), "closed": len(closed), "uid": os.getuid()}).encode())
            os.close(report_w)
            os.read(release_r, 1)  # held until the parent says
            for c in conns:
                c.close()
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            os.write(report_w, json.dumps({"error": repr(e)}).encode())
        finally:
            os._exit(0)
    os.close(report_w)
    os.close(release_r)
    return pid, report_r, release_w


def _read_all(fd: int) -> bytes:
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    os.close(fd)
    return data


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _samples(text: str) -> dict[str, float]:
    """``name{labels}`` -> value of each sample line of the exposition text."""
    out: dict[str, float] = {}
    for ln in text.splitlines():
        if ln and not ln.startswith("#"):
            key, _, value = ln.rpartition(" ")
            out[key] = float(value)
    return out


def _status(run_dir: Path) -> dict[str, Any]:
    r = stepwatch("status", str(run_dir), "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _scrape_at(addr: str) -> dict[str, float] | None:
    try:
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=PROMPT_S) as resp:
            return _samples(resp.read().decode())
    except OSError:
        return None


def _at_nofile_limit() -> None:
    """In the launcher before exec (inherited by the supervisor): issue 30's descriptor limit."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (SUPERVISOR_NOFILE, hard))


def _launch_with_endpoint(tmp_path: Path, name: str) -> tuple[Path, Path, str, int, int]:
    """A run with an endpoint on a loopback port and an ``[alerts] command`` that appends each alert to
    the returned pings file, launched under a 1,024-descriptor limit, 10 steps scraped. Returns (pings, run
    dir, the endpoint's address, the supervisor's pid, the command's pid)."""
    first = _free_port()
    pings = tmp_path / "pings.jsonl"
    repo = make_repo(tmp_path / "repo", {"train.py": TRAIN_PY, "ping.py": PING_PY})
    ping = [sys.executable, str(repo / "ping.py"), str(pings)]
    (repo / "run.toml").write_text(
        f'name = "{name}"\ncommand = [{json.dumps(sys.executable)}, "train.py"]\n[alerts]\ncommand = {json.dumps(ping)}\n'
        f'[export]\nprometheus = ":{first}-{first + 40}"\nlinger_s = 20\n')  # a port range, no host
    git(repo, "add", "run.toml")
    git(repo, "commit", "-qm", "config")
    r = stepwatch("launch", "run.toml", "--no-tui", cwd=repo, preexec_fn=_at_nofile_limit)
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / name
    run = cast(dict[str, Any], wait_until(lambda: (doc := json.loads((run_dir / "run.json").read_text())).get("export")
                                          and doc, 20, what="the endpoint's address in run.json"))
    addr: str = run["export"]["prometheus"]
    assert addr.rpartition(":")[0] == "127.0.0.1", addr  # no host named: the loopback
    sup, child = int(run["supervisor"]["pid"]), int(run["process"]["pid"])
    limits = Path(f"/proc/{sup}/limits").read_text()
    assert any(ln.startswith("Max open files") and f" {SUPERVISOR_NOFILE} " in ln for ln in limits.splitlines()), limits
    wait_until(lambda: (_scrape_at(addr) or {}).get(f'stepwatch_steps_total{{attempt="1",run="{name}"}}', 0) >= 10,
               20, interval_s=0.2, what="10 steps scraped")
    return pings, run_dir, addr, sup, child


def _alert_delivered(child: int, pings: Path) -> None:
    """Stop the command (SIGSTOP) until its alert (``frozen``; the stall it causes is that page's evidence) reached
    the ``[alerts] command``, then let it go on."""
    os.kill(child, signal.SIGSTOP)
    try:
        wait_until(lambda: pings.exists() and '"frozen"' in pings.read_text(), 30, interval_s=0.2,
                   what="the frozen alert delivered by the [alerts] command")
    finally:
        os.kill(child, signal.SIGCONT)


@pytest.mark.system
def test_a_thousand_idle_connections_from_a_group_member_leave_stop_exit_json_and_alerts_working(
        tmp_path: Path, member: tuple[int, int]):
    pings, run_dir, addr, sup, child = _launch_with_endpoint(tmp_path, "held")
    port = addr.rpartition(":")[2]
    fds0, threads0 = _fds(sup), _threads(sup)
    holder, report_fd, release_fd = _hold_as_second_user(int(port), IDLE_CONNECTIONS, member)
    released = False
    try:
        report = json.loads(_read_all(report_fd))
        fds1, threads1 = _fds(sup), _threads(sup)  # the cap's connections still within their read timeout
        print(f"\nsupervisor descriptors {fds0} -> {fds1}, threads {threads0} -> {threads1} with {report}")
        assert "error" not in report, report
        assert report["uid"] == member[0] and report["opened"] == IDLE_CONNECTIONS, report
        assert report["closed"] >= IDLE_CONNECTIONS - MAX_CONNECTIONS, report  # closed at once, beyond the cap
        assert fds1 <= fds0 + MAX_CONNECTIONS + 4, (fds0, fds1)  # a few for the supervisor's own files
        assert threads1 <= threads0 + MAX_CONNECTIONS + 4, (threads0, threads1)
        # while they are held: an alert is delivered (the child held stopped), stop works, exit.json comes
        _alert_delivered(child, pings)
        stop = stepwatch("stop", str(run_dir), "--grace", "2", timeout=30)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        wait_until(lambda: (run_dir / "exit.json").exists(), 20, what="exit.json")
        assert json.loads((run_dir / "exit.json").read_text())["stop_requested"] is True
        print(f"after stop: supervisor descriptors {_fds(sup)}, threads {_threads(sup)}")
        os.close(release_fd)
        released = True
        os.waitpid(holder, 0)
    finally:
        if not released:
            os.close(release_fd)
            os.waitpid(holder, 0)
    # after they closed: the endpoint (lingering) says what status --json says of the ended run
    lab = '{attempt="1",run="held"}'
    scraped = cast(dict[str, float], wait_until(
        lambda: (s := _scrape_at(addr)) and s.get("stepwatch_run_ended" + lab) == 1.0 and s, 20, interval_s=0.2,
        what="a scrape of the ended run"))
    snap = _status(run_dir)
    assert snap["state"] == "exited"
    assert scraped["stepwatch_steps_total" + lab] == snap["step"]["global_step"]
    assert scraped["stepwatch_step_time_observations_total" + lab] == snap["step_seconds"]["n"]
    assert scraped["stepwatch_step_time_p50_seconds" + lab] == pytest.approx(snap["step_seconds"]["p50"])
    assert scraped.get("stepwatch_exit_code" + lab) == snap["returncode"]
    assert scraped["stepwatch_alerts_total" + '{attempt="1",kind="frozen",run="held"}'] >= 1
    log = (run_dir / "supervisor.log").read_text()
    assert "Too many open files" not in log and "crashed" not in log, log[-2000:]


#: Connections the member queues while every descriptor is taken: fewer than the listen backlog, so each
#: connect completes in the kernel and waits there for a descriptor.
QUEUED_CONNECTIONS = 100


@pytest.mark.system
def test_with_every_descriptor_of_the_supervisor_taken_an_alert_is_delivered_and_exit_json_written(
        tmp_path: Path, member: tuple[int, int]):
    pings, run_dir, addr, sup, child = _launch_with_endpoint(tmp_path, "starved")
    fds0 = _fds(sup)  # the descriptors held back for exit.json and alerts among them
    _, hard = resource.prlimit(sup, resource.RLIMIT_NOFILE)
    resource.prlimit(sup, resource.RLIMIT_NOFILE, (fds0 + 4, hard))  # four left, then the member's connections
    holder, report_fd, release_fd = _hold_as_second_user(int(addr.rpartition(":")[2]), QUEUED_CONNECTIONS, member)
    try:
        report = json.loads(_read_all(report_fd))
        assert "error" not in report and report["opened"] == QUEUED_CONNECTIONS, report
        taken = wait_until(lambda: _fds(sup) >= fds0 + 4 and _fds(sup), 10, interval_s=0.05,
                           what="every descriptor of the supervisor taken")
        print(f"\nsupervisor descriptors {fds0} -> {taken} (limit {fds0 + 4}); {report}")
        _alert_delivered(child, pings)
        wait_until(lambda: _fds(sup) >= fds0 + 4, 8, interval_s=0.02,  # the pressure held: the member's
                   what="the member's queued connections to take every descriptor again")  # next ones, once served
        stop = stepwatch("stop", str(run_dir), "--grace", "2", timeout=30)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        wait_until(lambda: (run_dir / "exit.json").exists(), 20, what="exit.json")
    finally:
        os.close(release_fd)
        os.waitpid(holder, 0)
    assert json.loads((run_dir / "exit.json").read_text())["stop_requested"] is True
    assert "frozen" in [a["kind"] for a in map(json.loads, pings.read_text().splitlines())]
    log = (run_dir / "supervisor.log").read_text()
    assert "crashed" not in log and "could not write exit.json" not in log and "not delivered" not in log, log[-2000:]
    outcomes = {r["outcome"] for r in map(json.loads, (run_dir / "alerts.jsonl").read_text().splitlines())
                if r["kind"] == "delivery"}
    assert outcomes <= {"delivered", "rate_limited", "same_cause"}, outcomes  # same_cause: the stall the stop made
