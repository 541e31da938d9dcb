"""Issue 43, finding 2: a team keeps its runs dir group-writable and its members work with ``umask 002``. Every
file stepwatch writes there is the owner's alone (0644, the run dir 0755) whatever the umask, so a member's in-place
edit is refused by the kernel; and where the owner opens a file or the run dir to the group (``chmod g+w``), what
stepwatch decides from it (what was paged, whom a stop signals, a stop in progress, a frozen process, py-spy's
targets) no longer believes it: the file is read as if absent, said once in supervisor.log. A real second user in
the owner's group does each edit (tests/conftest.py ``member``); each has its positive control."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from conftest import MEMBER_PY, as_member, git, make_repo, stepwatch, wait_exit, wait_until
from stepwatch.monitors.runfiles import read_json

pytestmark = pytest.mark.system

#: steps every 0.05 s until the file argv[1] names exists, then idle (a stall at ``[stall] step_floor_s``)
STEPS_PY = r"""
import os, subprocess, sys, time
tel = None
if "emit" in sys.argv[2:]:  # instrumented: events.jsonl, and the supervisor's saved fold of it
    from stepwatch.telemetry import StepTelemetry
    tel = StepTelemetry()
if "worker" in sys.argv[2:]:  # a worker in a session of its own: only the recorded tree reaches it on a stop
    code = ("import signal, sys, time\n"  # a SIGINT it gets is noted in <go>.worker-int
            "signal.signal(signal.SIGINT, lambda *a: (open(sys.argv[1] + '.worker-int', 'w').close(), sys.exit(0)))\n"
            "time.sleep(600)\n")
    w = subprocess.Popen([sys.executable, "-c", code, sys.argv[1]], start_new_session=True)
    print(f"worker {w.pid}", flush=True)
for s in range(1, 100_000):
    if tel is not None:
        tel.step_begin()
        tel.step_end()
    print(f"step {s}/100000 loss {1.0 / s:.4f}", flush=True)
    if os.path.exists(sys.argv[1]):
        time.sleep(600)
    time.sleep(0.05)
"""
PING_PY = r"""
import json, os, sys
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"kind": os.environ["STEPWATCH_ALERT_KIND"], "message": os.environ["STEPWATCH_ALERT_MESSAGE"]}) + "\n")
"""
#: the member's edit of a file in place (never a replace: the run dir is not theirs to write); prints "refused"
#: when the kernel says no
EDIT = r"""
import json
try:
    if mode == "a":
        with open(path, "a") as f:
            f.write(text)
    else:
        doc = json.load(open(path))
        doc.update(json.loads(text)) if isinstance(doc, dict) else None
        if "add_processes" in doc:
            doc["processes"] = doc.get("processes", []) + doc.pop("add_processes")
        with open(path, "r+") as f:
            f.seek(0)
            f.truncate()
            json.dump(doc, f)
    print("written")
except PermissionError:
    print("refused")
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "harness", {"steps.py": STEPS_PY, "ping.py": PING_PY})


def _launch(repo: Path, shared: Path, name: str, pings: Path, go: Path, extra: str = "", args: str = "") -> Path:
    """A run of root's in the team's runs dir, launched with umask 002, paging into ``pings``; returns its run
    dir once a few steps were printed."""
    (repo / f"{name}.toml").write_text(
        f'name = "{name}"\ncommand = [{json.dumps(sys.executable)}, "steps.py", {json.dumps(str(go))}'
        f'{args}]\n{extra}'
        f'[alerts]\ncommand = [{json.dumps(sys.executable)}, {json.dumps(str(repo / "ping.py"))}, '
        f'{json.dumps(str(pings))}]\n')
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", name)
    r = stepwatch("launch", "--no-tui", "--runs-dir", str(shared), f"{name}.toml", cwd=repo, umask=0o002)
    assert r.returncode == 0, r.stderr
    run_dir = shared / name
    wait_until(lambda: b"step 5/" in (run_dir / "train.log").read_bytes(), 30, what="a few steps")
    return run_dir


def _edit(member: tuple[int, int], path: Path, text: str, mode: str = "a") -> str:
    """The member's in-place edit of ``path``: "written" or "refused"."""
    return as_member(member, f"path = {str(path)!r}\ntext = {text!r}\nmode = {mode!r}\n" + EDIT).stdout.strip()


def _pages(pings: Path) -> list[dict]:
    return [json.loads(ln) for ln in pings.read_text().splitlines()] if pings.exists() else []


def _steps(run_dir: Path) -> int:
    found = re.findall(rb"step (\d+)/", (run_dir / "train.log").read_bytes()[-400:])
    return int(found[-1]) if found else 0


def _said(run_dir: Path, text: str) -> bool:
    return text in (run_dir / "supervisor.log").read_text(errors="replace")


def test_every_file_the_supervisor_writes_under_umask_002_is_the_owners_alone_and_the_members_edit_is_refused(
        repo: Path, shared: Path, member: tuple[int, int], tmp_path: Path):
    """A run that writes every file (a ``frozen`` page: its process held stopped 3 s; then stopped by ``stop``):
    each is 0644 or narrower, never group-writable, the run dir 0755; the member's append to each is refused."""
    pings = tmp_path / "pings.jsonl"
    run_dir = _launch(repo, shared, "modes", pings, tmp_path / "go", args=', "emit"')
    run = read_json(run_dir / "run.json")
    assert run is not None
    os.kill(run["process"]["pid"], signal.SIGSTOP)
    try:
        wait_until(lambda: [p for p in _pages(pings) if p["kind"] == "frozen"], 20, what="the frozen page")
    finally:
        os.kill(run["process"]["pid"], signal.SIGCONT)
    r = stepwatch("stop", str(run_dir), "--grace", "2", timeout=60)
    assert r.returncode == 0, (r.stdout, r.stderr)
    wait_exit(run_dir)
    wait_until(lambda: (read_json(run_dir / "stop.json") or {}).get("ended_by"), 20, what="the stop's end")
    wait_until(lambda: (run_dir / "ledger.json").exists() and (run_dir / "events.state.json").exists(), 20,
               what=f"the supervisor's last records: {sorted(os.listdir(run_dir))}")
    wanted = {"procs.json", "alerts.jsonl", "stop.json", "exit.json", "ledger.json", "events.state.json",
              "logsteps.jsonl", "gpu.jsonl", "train.log", "supervisor.log", "run.json", "events.jsonl"}
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in run_dir.iterdir() if p.is_file()}
    assert wanted <= set(modes), sorted(modes)
    loose = {n: f"{m:04o}" for n, m in modes.items() if m & 0o022}
    assert not loose, loose  # nothing the group (or anyone) may write
    assert {n: m for n, m in modes.items() if n in wanted} == dict.fromkeys(wanted, 0o644)  # others may read them
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o2755  # the team's runs dir's setgid bit kept: its group
    assert json.loads((run_dir / "alerts.jsonl").read_text().splitlines()[0])["alert_kind"] == "frozen"
    for name in sorted(wanted):
        assert _edit(member, run_dir / name, "{}\n") == "refused", name  # the kernel's refusal, file by file


def test_a_death_is_paged_though_a_member_wrote_its_id_into_an_alerts_file_the_owner_opened_to_the_group(
        repo: Path, shared: Path, member: tuple[int, int], tmp_path: Path):
    """The death alert's id is fixed (``a1-watchdog-end``): a line with it in alerts.jsonl once made the recorder
    take it as recorded and never page it. Opened to the group, the file is not believed: the death is paged."""
    pings = tmp_path / "pings.jsonl"
    run_dir = _launch(repo, shared, "death", pings, tmp_path / "go")
    alerts = run_dir / "alerts.jsonl"
    line = json.dumps({"v": 1, "kind": "alert", "id": "a1-watchdog-end", "alert_kind": "watchdog", "level": "critical",
                       "message": "fine", "at": "2026-01-01T00:00:00Z", "t": 1.0}) + "\n"
    wait_until(alerts.exists, 10, what="alerts.jsonl, opened by the supervisor's detector loop")
    assert _edit(member, alerts, line) == "refused"  # 0644: the kernel refuses the member
    alerts.chmod(0o664)  # the owner opens it to the team
    assert _edit(member, alerts, line) == "written"
    run = read_json(run_dir / "run.json")
    assert run is not None
    os.kill(run["process"]["pid"], signal.SIGKILL)
    deaths = wait_until(lambda: [p for p in _pages(pings) if p["kind"] == "watchdog"], 15, what="the death paged")
    assert f"process {run['process']['pid']}" in deaths[0]["message"], deaths
    wait_exit(run_dir)
    assert _said(run_dir, f"not trusting {alerts}: {alerts} is writable by group")


def _member_process(member: tuple[int, int]) -> subprocess.Popen:
    uid, gid = member

    def drop() -> None:
        os.setgroups([gid])
        os.setgid(gid)
        os.setuid(uid)

    return subprocess.Popen([MEMBER_PY, "-c", "import time; time.sleep(600)"], preexec_fn=drop, cwd="/",
                            env={"PATH": "/usr/bin:/bin"}, stdin=subprocess.DEVNULL)


def _recorded(p: subprocess.Popen, uid: int) -> dict:
    return {"pid": p.pid, "create_time": psutil.Process(p.pid).create_time(), "ppid": os.getpid(), "uid": uid,
            "pgid": os.getpgid(p.pid), "sid": os.getsid(p.pid), "name": "python3", "rank": None,
            "first_seen_unix": 1.0, "ended_at_unix": None, "exit": None}


def test_a_procs_file_opened_to_the_group_never_makes_stop_signal_an_owners_process_frozen_page_or_py_spy_attach(
        repo: Path, shared: Path, member: tuple[int, int], tmp_path: Path):
    """The member adds to procs.json, in place, an unrelated process of the owner's (its real pid and create time)
    and a process of their own held stopped. Nothing pages ``frozen``; the stall's stacks never name either; a
    live ``stop`` and ``stop --survivors`` leave the owner's process alone, and the stop still reaches the run's
    own worker in a session of its own (the supervisor signals the tree it holds, never the file read back)."""
    pings, go = tmp_path / "pings.jsonl", tmp_path / "go"
    owners = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL)  # the owner's, unrelated to the run
    members = _member_process(member)
    try:
        wait_until(lambda: psutil.Process(members.pid).uids().real == member[0], 10, what="the member's process")
        os.kill(members.pid, signal.SIGSTOP)  # as its owner may (root here): held stopped
        planted = json.dumps({"add_processes": [_recorded(owners, 0), _recorded(members, member[0])]})
        run_dir = _launch(repo, shared, "tree", pings, go, extra="[stall]\nstep_floor_s = 1\n", args=', "worker"')
        worker = int(re.search(rb"worker (\d+)", (run_dir / "train.log").read_bytes()).group(1))  # type: ignore[union-attr]
        procs = run_dir / "procs.json"
        wait_until(lambda: worker in {p["pid"] for p in (read_json(procs) or {}).get("processes", [])}, 10,
                   what="the worker recorded (the tree then stays as it is: procs.json is not rewritten)")
        assert _edit(member, procs, planted, mode="json") == "refused"  # 0644: the kernel refuses the member
        procs.chmod(0o664)  # the owner opens it to the team
        assert _edit(member, procs, planted, mode="json") == "written"
        assert owners.pid in {p["pid"] for p in read_json(procs)["processes"]}  # type: ignore[index]
        wait_until(lambda: _said(run_dir, f"not trusting {procs}: {procs} is writable by group"), 10,
                   what="the supervisor's word that it ignores procs.json")
        at = _steps(run_dir)
        wait_until(lambda: _steps(run_dir) >= at + 100, 30, what="100 more steps (5 s: a frozen page's 3 s passed)")
        assert not [p for p in _pages(pings) if p["kind"] == "frozen"], _pages(pings)
        go.touch()  # the run goes idle: a stall, paged after every recorded process's stack
        wait_until(lambda: [p for p in _pages(pings) if p["kind"] == "stall"], 30, what="the stall page")
        stacks = [json.loads(ln) for ln in (run_dir / "alerts.jsonl").read_text().splitlines()
                  if json.loads(ln).get("kind") == "stack"]
        attached = {pid for s in stacks for g in s.get("groups") or [] for pid in g["pids"]} | {
            s.get("pid") for s in stacks}
        failed = sum(int(m.group(1)) for s in stacks if (m := re.search(r"no stack of (\d+) process",
                                                                        s.get("summary") or "")))
        assert owners.pid not in attached and members.pid not in attached and not failed, stacks

        r = stepwatch("stop", str(run_dir), "--grace", "1", timeout=60)
        assert r.returncode == 0, (r.stdout, r.stderr)
        wait_exit(run_dir)
        wait_until(lambda: (read_json(run_dir / "stop.json") or {}).get("ended_by"), 20, what="the stop's end")
        assert owners.poll() is None and members.poll() is None  # neither got the ladder's INT, TERM or KILL
        wait_until(lambda: not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE,
                   20, what="the run's own worker stopped")
        # its first rung, SIGINT, came from the tree the supervisor holds in memory (the file, not trusted then,
        # named no one: the worker would have waited for a later rung, after the end's rewrite of procs.json)
        assert Path(f"{go}.worker-int").exists()

        procs.chmod(0o664)  # the ended run's record (rewritten 0644 at the end), opened to the team again
        assert _edit(member, procs, planted, mode="json") == "written"
        r = stepwatch("stop", str(run_dir), "--survivors", timeout=60)
        assert r.returncode == 0 and str(owners.pid) not in r.stdout, (r.stdout, r.stderr)
        assert owners.poll() is None and members.poll() is None
        assert f"not trusting {procs}" in r.stderr, r.stderr  # said where the owner sees it
    finally:
        for p in (owners, members):
            p.kill()
            p.wait()


def test_a_stop_record_opened_to_the_group_neither_holds_the_owners_stop_back_nor_slows_it(
        repo: Path, shared: Path, member: tuple[int, int], tmp_path: Path):
    """An owner's stop.json the group may write, rewritten in place by the member as a stop "in progress" with a
    grace of eleven days: the owner's ``stop`` is not "already in progress" and ends the run in its own grace."""
    run_dir = _launch(repo, shared, "held", tmp_path / "pings.jsonl", tmp_path / "go")
    stop = run_dir / "stop.json"
    stop.write_text("{}")
    stop.chmod(0o644)
    huge = json.dumps({"v": 1, "requested_at_unix": 9e9, "requested_at": "2255-01-01T00:00:00Z", "grace_s": 1e6,
                       "signals": [], "ended_by": None})
    assert _edit(member, stop, huge, mode="json") == "refused"  # 0644: the kernel refuses the member
    stop.chmod(0o664)  # the owner opens it to the team
    assert _edit(member, stop, huge, mode="json") == "written"
    r = stepwatch("stop", str(run_dir), "--grace", "2", timeout=60)
    assert r.returncode == 0 and "already in progress" not in r.stdout + r.stderr, (r.stdout, r.stderr)
    ex = wait_exit(run_dir, 20)
    assert ex["stop_requested"] is True, ex
    rec = wait_until(lambda: (read_json(stop) or {}).get("ended_by") and read_json(stop), 20, what="the stop's end")
    assert rec["grace_s"] == 2 and stat.S_IMODE(stop.stat().st_mode) == 0o644, rec
