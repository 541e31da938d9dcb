"""Signals only to the run's own processes: ``stop`` and ``stop --survivors`` signal a
process only when the run's supervisor recorded its identity (pid + create time, ``procs.json``) and
it belongs to the run dir's owner; a crafted run.json, a reused pid or a stranger in a recorded
group/session is left alone; a stop whose supervisor died mid-way is finished by ``stepwatch stop``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import make_repo, stepwatch, wait_until
from stepwatch.monitors.runfiles import read_json

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a run dir to another uid (CI runs as root)")
NOBODY = 65534


def _victim(new_session: bool = True) -> subprocess.Popen:
    """A process the attacker wants signalled: default SIGUSR1/SIGINT/SIGKILL would end it."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=new_session)


def _ident(p: subprocess.Popen) -> dict:
    return {"pid": p.pid, "create_time": psutil.Process(p.pid).create_time()}


def _crafted_run(run_dir: Path, process: dict, supervisor: dict | None, extra: dict | None = None,
                 procs: list[dict] | None = None, owner: int | None = None) -> None:
    run_dir.mkdir(parents=True)
    run = {"v": 1, "name": run_dir.name, "attempt": 1, "launched_at_unix": time.time() - 5, "argv": ["x"],
           "cwd": str(run_dir), "process": process, "supervisor": supervisor, **(extra or {})}
    (run_dir / "run.json").write_text(json.dumps(run))
    if procs is not None:
        (run_dir / "procs.json").write_text(json.dumps({"v": 1, "processes": procs}))
    if owner is not None:
        for p in [run_dir, *run_dir.iterdir()]:
            os.chown(p, owner, owner)


def _alive(p: subprocess.Popen) -> bool:
    return p.poll() is None


def _cleanup(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


@ROOT_ONLY
def test_a_crafted_run_json_of_another_user_makes_root_signal_nothing(tmp_path: Path):
    """nobody's run dir names two of root's processes as its training process and supervisor, and a
    root process group as its pgid: root's ``stop`` refuses, saying why, and both live on."""
    a, b = _victim(), _victim()
    try:
        run_dir = tmp_path / "runs" / "bait"
        _crafted_run(run_dir, {**_ident(a), "pgid": b.pid}, {**_ident(b), "sid": b.pid}, owner=NOBODY)
        r = stepwatch("stop", str(run_dir), "--grace", "0.2")
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert f"refusing to signal pid {a.pid}" in r.stderr and "does not belong to the run dir's owner" in r.stderr
        r = stepwatch("stop", "--survivors", str(run_dir))
        time.sleep(0.3)  # a wrongly sent SIGKILL would have landed by now (checked by the control below)
        assert _alive(a) and _alive(b)
        assert "killed 0" in r.stdout or r.returncode != 0
    finally:
        _cleanup(a, b)


@ROOT_ONLY
def test_a_run_dir_whose_records_another_user_wrote_is_refused_for_stop(tmp_path: Path):
    """A group-writable run dir of nobody's where root's (or anyone's) run.json was put: not a
    record its owner's supervisor wrote, so nothing is signalled."""
    a = _victim()
    try:
        run_dir = tmp_path / "runs" / "planted"
        _crafted_run(run_dir, {**_ident(a), "pgid": a.pid}, None)
        os.chown(run_dir, NOBODY, NOBODY)  # run.json stays root's
        r = stepwatch("stop", str(run_dir), "--grace", "0.2")
        assert r.returncode == 1 and "run.json belongs to uid 0, not to the run dir's owner" in r.stderr, r.stderr
        r = stepwatch("stop", "--survivors", str(run_dir))
        assert r.returncode == 1 and "refusing to signal anything" in r.stderr, r.stderr
        assert _alive(a)
    finally:
        _cleanup(a)


def test_a_crafted_pgid_never_selects_a_group_only_the_recorded_leaders(tmp_path: Path):
    """The run's own user, its supervisor gone: run.json names a live process as the command but
    another process group as its pgid. The CLI's ladder signals the command's own group (it leads
    it) and leaves the named group alone."""
    a, b = _victim(), _victim()
    try:
        run_dir = tmp_path / "runs" / "r"
        _crafted_run(run_dir, {**_ident(a), "pgid": b.pid}, {"pid": 999999, "create_time": 1.0, "sid": b.pid})
        r = stepwatch("stop", str(run_dir), "--grace", "0.5")
        assert r.returncode == 0, r.stderr
        assert "escalated itself" in r.stdout
        wait_until(lambda: not _alive(a), 5, what="the command to end")
        assert _alive(b)
        sent = read_json(run_dir / "stop.json")["signals"]
        assert sent[0]["signal"] == "SIGINT" and sent[0]["pgid"] == a.pid
    finally:
        _cleanup(a, b)


def test_survivors_are_matched_by_recorded_identity_never_by_group_or_a_reused_pid(tmp_path: Path):
    """``--survivors`` of an ended run: a process in the session run.json names but not recorded is
    a stranger (left alone); a recorded pid whose create time differs is a reuse (left alone); the
    recorded one, same create time, is killed (the positive control)."""
    stranger, reused, recorded = _victim(), _victim(), _victim()
    try:
        run_dir = tmp_path / "runs" / "r"
        procs = [{**_ident(reused), "create_time": _ident(reused)["create_time"] - 100.0}, _ident(recorded)]
        _crafted_run(run_dir, {"pid": 999999, "create_time": 1.0, "pgid": stranger.pid},
                     {"pid": 999998, "create_time": 1.0, "sid": stranger.pid}, procs=procs)
        (run_dir / "exit.json").write_text(json.dumps({"v": 1, "returncode": 0}))
        r = stepwatch("status", str(run_dir), "--json")
        assert [p["pid"] for p in json.loads(r.stdout)["survivors"]] == [recorded.pid]
        r = stepwatch("stop", "--survivors", str(run_dir))
        assert r.returncode == 0 and f"pid {recorded.pid}" in r.stdout, r.stdout
        wait_until(lambda: not _alive(recorded), 5, what="the recorded survivor to die")
        assert _alive(stranger) and _alive(reused)
    finally:
        _cleanup(stranger, reused, recorded)


def _repo_with(tmp_path: Path, files: dict[str, str]) -> Path:
    return make_repo(tmp_path / "repo", files)


def _launch_setsid_worker(tmp_path: Path, then: str) -> Path:
    """Launch a command that starts a worker in a session of its own, prints its pid, then ``then``."""
    repo = _repo_with(tmp_path, {"spawn.py": (
        "import subprocess, sys, time\n"
        "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
        f"print('worker', w.pid, flush=True)\n{then}")})
    r = stepwatch("launch", "--no-tui", "--name", "r", "--", sys.executable, "spawn.py", cwd=repo)
    assert r.returncode == 0, r.stderr
    return repo / "runs" / "r"


def test_stop_reaches_a_worker_in_a_session_of_its_own_even_frozen(tmp_path: Path):
    """A worker that left the command's group and session (setsid) and is frozen (SIGSTOP): the
    ladder reaches it by its recorded identity, and goes on past the command's end until it is gone."""
    run_dir = _launch_setsid_worker(tmp_path, "time.sleep(600)\n")
    worker = int(wait_until(lambda: (run_dir / "train.log").read_text().split()[1:2], 20, what="the worker")[0])
    try:
        wait_until(lambda: worker in [p["pid"] for p in (read_json(run_dir / "procs.json") or {}).get("processes", [])],
                   10, what="the worker recorded")
        assert os.getsid(worker) != os.getsid(read_json(run_dir / "run.json")["process"]["pid"])
        os.kill(worker, signal.SIGSTOP)
        r = stepwatch("stop", str(run_dir), "--grace", "1")
        assert r.returncode == 0, (r.stdout, r.stderr)
        wait_until(lambda: not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE,
                   10, what="the frozen worker to die")
        stop = read_json(run_dir / "stop.json")
        assert any(worker in s.get("pids", []) for s in stop["signals"]), stop
        assert stepwatch("status", str(run_dir), "--json").stdout.count('"survivors": []') == 1
    finally:
        if psutil.pid_exists(worker):
            os.kill(worker, signal.SIGKILL)


def test_stop_takes_over_when_the_supervisor_dies_mid_stop(tmp_path: Path):
    """The supervisor SIGKILLed after sending SIGINT to a command that ignores it: a second
    ``stepwatch stop`` no longer answers "already in progress" forever; it finishes the ladder from
    the next rung (SIGTERM) and says so."""
    repo = _repo_with(tmp_path, {"deaf.py": (
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(600)\n")})
    r = stepwatch("launch", "--no-tui", "--name", "r", "--", sys.executable, "deaf.py", cwd=repo)
    assert r.returncode == 0, r.stderr
    run_dir = repo / "runs" / "r"
    wait_until(lambda: "up" in (run_dir / "train.log").read_text(), 20, what="the command to start")
    run = read_json(run_dir / "run.json")
    child = run["process"]["pid"]
    r = stepwatch("stop", str(run_dir), "--grace", "30", "--no-wait")
    assert r.returncode == 0
    wait_until(lambda: [s["signal"] for s in (read_json(run_dir / "stop.json") or {}).get("signals", [])] == ["SIGINT"],
               10, what="the supervisor's SIGINT")
    os.kill(run["supervisor"]["pid"], signal.SIGKILL)
    wait_until(lambda: not psutil.pid_exists(run["supervisor"]["pid"])
               or psutil.Process(run["supervisor"]["pid"]).status() == psutil.STATUS_ZOMBIE, 5, what="the supervisor gone")
    try:
        t0 = time.monotonic()
        r = stepwatch("stop", str(run_dir), "--grace", "1")
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert "escalated itself" in r.stdout and "already in progress" not in r.stdout
        assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
        stop = read_json(run_dir / "stop.json")
        assert [s["signal"] for s in stop["signals"]] == ["SIGINT", "SIGTERM"]
        assert any("took the escalation over" in n for n in stop.get("notes", []))
        assert stop["ended_by"]["last_signal_sent"] == "SIGTERM"
        assert time.monotonic() - t0 < 20  # the takeover used its own grace (1 s), not the first stop's 30 s
    finally:
        if psutil.pid_exists(child):
            os.kill(child, signal.SIGKILL)


def test_survivors_are_recorded_whatever_session_they_moved_to(tmp_path: Path):
    """A worker that setsid()s and outlives its parent: recorded by the supervisor (it is re-parented
    to the supervisor, a child subreaper, then to init once the supervisor is done), listed as a
    survivor and killed by ``--survivors``."""
    run_dir = _launch_setsid_worker(tmp_path, "")
    wait_until(lambda: read_json(run_dir / "exit.json"), 20, what="the end")
    worker = int((run_dir / "train.log").read_text().split()[1])
    try:
        r = stepwatch("stop", str(run_dir))
        assert r.returncode == 0 and "already ended" in r.stdout and f"{worker}" in r.stderr, r.stderr
        r = stepwatch("stop", "--survivors", str(run_dir))
        assert r.returncode == 0 and f"pid {worker}" in r.stdout
        wait_until(lambda: not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE,
                   5, what="the survivor to die")
    finally:
        if psutil.pid_exists(worker):
            os.kill(worker, signal.SIGKILL)


def test_a_symlinked_stop_json_is_never_read_through_nor_copied(tmp_path: Path):
    """stop.json as a symlink to a secret (another user's push tokens): a stop that takes over never
    reads it and writes a fresh record in its place; the secret is untouched."""
    a = _victim()
    try:
        secret = tmp_path / "elsewhere" / "alerts.urls.json"
        secret.parent.mkdir()
        secret.write_text(json.dumps({"urls": ["tgram://TOKEN/123"], "signals": [], "ended_by": None,
                                      "requested_at_unix": 9e9}))
        run_dir = tmp_path / "runs" / "r"
        _crafted_run(run_dir, {**_ident(a), "pgid": a.pid}, {"pid": 999999, "create_time": 1.0})
        os.symlink(secret, run_dir / "stop.json")
        r = stepwatch("stop", str(run_dir), "--grace", "0.5")
        assert r.returncode == 0, (r.stdout, r.stderr)
        wait_until(lambda: not _alive(a), 5, what="the command to end")
        assert not (run_dir / "stop.json").is_symlink() and "TOKEN" not in (run_dir / "stop.json").read_text()
        assert "TOKEN" in secret.read_text()
    finally:
        _cleanup(a)


def test_a_run_dir_replaced_during_a_stop_stops_the_stop(tmp_path: Path):
    """The run dir (or a directory above it) swapped for another after the stop pinned it: the
    ladder signals nothing more and writes nothing more."""
    from stepwatch.launcher.stop import PinnedDir, StopError

    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    pin = PinnedDir(run_dir)
    assert pin.same()
    (tmp_path / "runs").rename(tmp_path / "runs-moved")
    other = tmp_path / "someone-elses" / "r"
    other.mkdir(parents=True)
    os.symlink(tmp_path / "someone-elses", tmp_path / "runs")
    assert not pin.same()
    with pytest.raises(StopError, match="was replaced while the stop ran"):
        pin.check()


@ROOT_ONLY
def test_a_planted_rotated_record_is_refused(tmp_path: Path):
    """A rotated procs.<stamp>.json another uid put into the run dir names a live process with its
    right create time: refused for --survivors, and the process lives."""
    a = _victim()
    try:
        run_dir = tmp_path / "runs" / "r"
        _crafted_run(run_dir, {"pid": 999999, "create_time": 1.0}, None, owner=NOBODY)
        (run_dir / "run.20260101T000000Z.json").write_text(json.dumps({"process": {"pid": 999998, "create_time": 1.0}}))
        (run_dir / "procs.20260101T000000Z.json").write_text(json.dumps({"v": 1, "processes": [_ident(a)]}))
        os.chown(run_dir / "run.20260101T000000Z.json", NOBODY, NOBODY)  # the planted procs file stays root's
        r = stepwatch("stop", "--survivors", str(run_dir))
        assert r.returncode == 1 and "procs.20260101T000000Z.json belongs to uid 0" in r.stderr, r.stderr
        assert _alive(a)
    finally:
        _cleanup(a)


def test_a_record_nested_too_deep_reads_as_no_record(tmp_path: Path):
    from stepwatch.monitors.runfiles import read_json as rj

    p = tmp_path / "run.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    assert rj(p) is None
    p.write_text('{"a":' * 50_000 + "1" + "}" * 50_000)
    assert rj(p) is None


@ROOT_ONLY
def test_root_signals_a_group_only_with_the_owners_permissions(tmp_path: Path):
    """signal_group as root for a run of uid 65534: sent from a child that dropped to that uid (the
    kernel decides what the owner may signal): the owner's group leader gets it (positive)."""
    from stepwatch.monitors.signalling import signal_group
    from stepwatch.monitors.watchdog import ProcessRef

    p = subprocess.Popen(["sleep", "120"], start_new_session=True, user=NOBODY, group=NOBODY, cwd="/")
    try:
        wait_until(lambda: psutil.Process(p.pid).uids().real == NOBODY, 5, what="the process as nobody")
        leader = ProcessRef.of_pid(p.pid)
        assert signal_group(leader, signal.SIGTERM, 0) is False  # not root's process
        assert signal_group(leader, signal.SIGTERM, NOBODY) is True
        assert p.wait(5) == -signal.SIGTERM
    finally:
        _cleanup(p)
