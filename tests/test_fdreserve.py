"""The supervisor's last records with every descriptor taken (issue 30: "the supervisor never dies of a
descriptor shortage: its exit record and alert delivery keep working with every descriptor taken").

Unit tier. Each case runs in a forked child (its descriptor limit and the process-wide reserve are
its own): the child lowers its limit, takes every descriptor left, then writes exit.json or delivers an
alert through an ``[alerts] command``, with the reserve held (it works) and without (the negative
control: EMFILE, said in the record).
"""

from __future__ import annotations

import http.server
import json
import os
import resource
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stepwatch.launcher.exitrecord import new_exit_record, record_exit
from stepwatch.monitors import fdreserve
from stepwatch.monitors.watch.delivery import Deliverer

#: The child's descriptor limit: low, so taking every descriptor is quick.
LIMIT = 64


def _in_child(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``fn`` in a forked child; its result (a JSON object) or the error it raised."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            out = fn()
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            out = {"error": repr(e)}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


def _take_every_descriptor() -> list[int]:
    """Lower this process's limit to LIMIT and open /dev/null until no descriptor is left."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, hard))
    taken: list[int] = []
    try:
        while True:
            taken.append(os.open(os.devnull, os.O_RDONLY))
    except OSError as e:
        assert fdreserve.is_short(e), e
    return taken


def _exit_record(run_dir: Path, reserve: bool) -> dict[str, Any]:
    def child() -> dict[str, Any]:
        held = fdreserve.hold() if reserve else 0
        _take_every_descriptor()
        rec = new_exit_record(1_780_000_000.0, 12.5, returncode=0)
        written = record_exit(run_dir, rec, None, retry_for_s=0.0)
        return {"held": held, "written": written, "write_errors": rec["write_errors"]}
    return _in_child(child)


def test_exit_json_is_written_with_every_descriptor_taken_when_the_reserve_is_held(tmp_path: Path):
    out = _exit_record(tmp_path, reserve=True)
    assert out.get("held") == fdreserve.RESERVE_FDS and out.get("written") is True, out
    assert out["write_errors"] == []
    assert json.loads((tmp_path / "exit.json").read_text())["returncode"] == 0


def test_without_the_reserve_exit_json_cannot_be_written_and_the_record_says_why(tmp_path: Path):
    out = _exit_record(tmp_path, reserve=False)
    assert out.get("written") is False, out
    assert any("EMFILE" in e for e in out["write_errors"]), out
    assert not (tmp_path / "exit.json").exists()


def _deliver_by_command(run_dir: Path, reserve: bool) -> dict[str, Any]:
    marker = run_dir / "delivered.txt"
    command = [sys.executable, "-c", f"import os; open({str(marker)!r}, 'w').write(os.environ['STEPWATCH_ALERT_KIND'])"]
    records: list[dict[str, Any]] = []

    def child() -> dict[str, Any]:
        held = fdreserve.hold() if reserve else 0
        d = Deliverer(run_dir, records.append, {"command": command}, "run")
        _take_every_descriptor()
        d.submit({"id": "stall-1", "kind": "stall", "message": "no step for 120 s", "at": 1_780_000_000.0})
        d.wait(20.0)
        return {"held": held, "deliveries": [r for r in records if r["kind"] == "delivery"],
                "left_held": fdreserve.held()}
    return _in_child(child)


def test_an_alert_command_is_delivered_with_every_descriptor_taken_when_the_reserve_is_held(tmp_path: Path):
    out = _deliver_by_command(tmp_path, reserve=True)
    assert "error" not in out, out
    assert [(d["channel"], d["outcome"]) for d in out["deliveries"]] == [("command", "delivered")], out
    assert (tmp_path / "delivered.txt").read_text() == "stall"
    assert out["left_held"] == fdreserve.RESERVE_FDS  # given back once the command ended


def test_without_the_reserve_the_alert_command_cannot_start_and_the_failure_is_recorded(tmp_path: Path):
    out = _deliver_by_command(tmp_path, reserve=False)
    assert "error" not in out, out
    [d] = out["deliveries"]
    assert d["outcome"] == "failed" and "Too many open files" in d["detail"], d
    assert not (tmp_path / "delivered.txt").exists()


def test_a_process_that_holds_nothing_back_pays_nothing_for_room():
    """Views and tests never call hold(): room() neither probes nor closes anything there."""
    def child() -> dict[str, Any]:
        before = len(os.listdir("/proc/self/fd"))
        with fdreserve.room(8):
            inside = len(os.listdir("/proc/self/fd"))
        return {"held": fdreserve.held(), "before": before, "inside": inside}
    out = _in_child(child)
    assert out["held"] == 0 and out["inside"] == out["before"], out


def test_blocks_side_by_side_each_get_the_descriptors_they_asked_for_and_all_come_back_after():
    """Two deliveries at once: the second block's room is beside what the first was given, not the same."""
    def child() -> dict[str, Any]:
        fdreserve.hold()
        taken = _take_every_descriptor()
        opened: list[int] = []
        with fdreserve.room(8):
            with fdreserve.room(8):
                opened += [os.open(os.devnull, os.O_RDONLY) for _ in range(16)]
                inner_held = fdreserve.held()
            for fd in opened:
                os.close(fd)
            between = fdreserve.held()  # the outer block is still inside: nothing taken back yet
        after = fdreserve.held()
        os.close(taken.pop())
        return {"opened": len(opened), "inner_held": inner_held, "between": between, "after": after}
    out = _in_child(child)
    assert out == {"opened": 16, "inner_held": 0, "between": 0, "after": fdreserve.RESERVE_FDS}, out


class _Hook(http.server.BaseHTTPRequestHandler):
    received: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        _Hook.received.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass


PUSH_CHILD = r"""
import json, os, resource, sys
from pathlib import Path
from stepwatch.monitors import fdreserve
from stepwatch.monitors.watch.delivery import Deliverer

run_dir, url, reserve, limit = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "held", int(sys.argv[4])
if reserve:
    fdreserve.hold()
records = []
d = Deliverer(run_dir, records.append, {"urls": [url], "retries": 0}, "run")
out = os.dup(1)
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
try:  # every descriptor taken; apprise is imported after this, at the first push, as in the supervisor
    while True:
        os.open(os.devnull, os.O_RDONLY)
except OSError:
    pass
d.submit({"id": "stall-1", "kind": "stall", "message": "no step for 120 s", "at": 1780000000.0})
d.wait(20.0)
os.write(out, json.dumps([r for r in records if r["kind"] == "delivery"]).encode())
"""


@pytest.mark.parametrize("reserve", [True, False], ids=["held", "control-none-held"])
def test_a_push_reaches_a_local_endpoint_with_every_descriptor_taken_only_when_the_reserve_is_held(
        tmp_path: Path, reserve: bool):
    """In a fresh interpreter (apprise in a forked copy of a process that used it may wait forever on a lock)."""
    server = http.server.HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Hook.received = []
    url = f"json://127.0.0.1:{server.server_address[1]}/hook"
    try:
        p = subprocess.run([sys.executable, "-c", PUSH_CHILD, str(tmp_path), url, "held" if reserve else "none",
                            str(LIMIT)], capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
    assert p.returncode == 0, p.stderr
    [d] = json.loads(p.stdout)
    if reserve:
        assert d["outcome"] == "delivered", d
        assert [r["message"] for r in _Hook.received] == ["no step for 120 s"], _Hook.received
    else:
        assert d["outcome"] == "failed" and _Hook.received == [], (d, _Hook.received)
