"""The ranks of a run (torchrun, accelerate): each rank's process from the supervisor's record of
the process tree (procs.json: pid, create time, ``RANK`` / ``LOCAL_RANK`` from its environment, how
it ended as the kernel told the supervisor), and torchrun's failure table from train.log.

A rank is the topmost recorded process carrying that rank (its DataLoader workers inherit ``RANK``
but have a parent of the same rank). A rank that ended by a signal or a non-zero code is a death;
the first one of a cascade (torchrun tears the others down with SIGTERM right after) is the alert,
the rest are named in it. Deaths after a stop request are the stop's doing, not alerts.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, MutableMapping

from stepwatch.monitors.parsers.torchrun import FailureTable
from stepwatch.monitors.runfiles import PROCS_JSON, STOP_JSON, read_json, utc_iso
from stepwatch.monitors.watchdog import PID_MAX, ProcessRef, probe

#: Deaths within this many seconds of the first one are its cascade (torchrun's teardown).
CASCADE_S = 5.0


def _int(v: Any, lo: int = 0, hi: int = PID_MAX) -> int | None:
    return v if type(v) is int and lo <= v <= hi else None


def _num(v: Any) -> float | None:
    return float(v) if type(v) in (int, float) and math.isfinite(v) else None


class RankWatch:
    """Fed train.log's lines (:meth:`feed`); :meth:`part` gives the snapshot's ``ranks``."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.table = FailureTable()
        self._stamp: tuple[int, int] | None = None
        self._records: list[dict[str, Any]] = []

    def feed(self, line: str) -> None:
        self.table.feed(line)

    def _read(self) -> list[dict[str, Any]]:
        path = self.run_dir / PROCS_JSON
        try:
            st = os.stat(path)
        except OSError:
            return self._records
        if (st.st_mtime_ns, st.st_size) != self._stamp:
            rec = read_json(path)
            items = rec.get("processes") if isinstance(rec, dict) else None
            self._records = [d for d in items if isinstance(d, dict)] if isinstance(items, list) else []
            self._stamp = (st.st_mtime_ns, st.st_size)
        return self._records

    def part(self) -> list[dict[str, Any]]:
        """``[{rank, local_rank, pid, alive, ended_at_unix, returncode, signal, exit_source,
        root_cause, after_stop}]``, by rank then start; [] for a run without ranked processes."""
        recs = self._read()
        ranked = {r["pid"]: r for r in recs if _int(r.get("pid"), 1) and _int(r.get("rank"), 0, 10**6) is not None}
        failures = self.table.by_pid()
        stop = read_json(self.run_dir / STOP_JSON)
        stop_t = _num(stop.get("requested_at_unix")) if isinstance(stop, dict) else None
        out = []
        for pid, r in ranked.items():
            parent = ranked.get(r.get("ppid"))
            if parent is not None and parent.get("rank") == r["rank"]:
                continue  # a worker of that rank
            ended = _num(r.get("ended_at_unix"))
            ex = r.get("exit") if isinstance(r.get("exit"), dict) else {}
            rc, sig, source = _int(ex.get("returncode"), 0, 255), ex.get("signal"), "kernel" if ex else None
            f = failures.get(pid)
            if f is not None and rc is None and not sig:
                rc, sig, source = (None, f.how()[len("killed by "):], "torchrun") if f.exitcode < 0 else (
                    f.exitcode, None, "torchrun")
            alive = ended is None and probe(ProcessRef(pid, _num(r.get("create_time")))) == "alive"
            out.append({"rank": r["rank"], "local_rank": _int(r.get("local_rank"), 0, 10**6), "pid": pid,
                        "alive": alive, "ended_at_unix": ended, "returncode": rc,
                        "signal": sig if isinstance(sig, str) else None, "exit_source": source,
                        "root_cause": bool(f and f.root_cause),
                        "after_stop": bool(stop_t is not None and ended is not None and ended >= stop_t),
                        "started_at_unix": _num(r.get("first_seen_unix"))})
        return sorted(out, key=lambda d: (d["rank"], d["started_at_unix"] or 0))


def _how(r: dict[str, Any]) -> str:
    if r.get("signal"):
        return f"killed by {r['signal']}"
    return f"exited with code {r['returncode']}"


def died(r: dict[str, Any]) -> bool:
    """The rank ended by a signal or a non-zero code."""
    return not r["alive"] and (bool(r.get("signal")) or (r.get("returncode") or 0) != 0)


def cascades(deaths: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Deaths grouped by time: one starts a group, those within CASCADE_S of it follow it."""
    groups: list[list[dict[str, Any]]] = []
    for r in sorted(deaths, key=lambda r: r["ended_at_unix"] or 0):
        if groups and (r["ended_at_unix"] or 0) - (groups[-1][0]["ended_at_unix"] or 0) < CASCADE_S:
            groups[-1].append(r)
        else:
            groups.append([r])
    return groups


def rank_alerts(snap: dict[str, Any], make: Any, first_seen: MutableMapping[str, float]) -> list[dict[str, Any]]:
    """One alert per cascade of rank deaths, naming its first (torchrun's root cause where the table
    says, else the earliest) and listing the rest (``make`` is snapshot.alerts.alert)."""
    out = []
    for group in cascades([r for r in snap.get("ranks") or [] if died(r) and not r["after_stop"]]):
        first = next((r for r in group if r["root_cause"]), group[0])
        others = [r for r in group if r is not first]
        lr = f"local_rank {first['local_rank']}, " if first.get("local_rank") is not None else ""
        src = {"kernel": "its exit status", "torchrun": "torchrun's failure table"}.get(first["exit_source"], "?")
        then = ("; then " + ", ".join(f"rank {r['rank']} (pid {r['pid']}) {_how(r)}" for r in others)) if others else ""
        going = "; the run goes on" if snap.get("state") == "running" else ""
        out.append(make(first_seen, snap["attempt"], "rank_death", f"{first['rank']}-{first['pid']}",
                        f"rank {first['rank']} ({lr}pid {first['pid']}) {_how(first)} at "
                        f"{utc_iso(first['ended_at_unix'])} (from {src}){then}{going}", first["ended_at_unix"]))
    return out
