"""What stands between a detector's verdict and a page (monitors/watch/paging.py, applied by the Deliverer):
the [alerts] paging settings and their refusals, a channel's own minimum level, quiet hours, a storm folded
into one digest page with its counts by kind, and the finished page only where it was asked for. Real
commands as the channel; the clock and the hour are passed in."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from stepwatch.launcher.config import ConfigError, load_config
from stepwatch.monitors.watch.delivery import Deliverer
from stepwatch.monitors.watch.paging import PagingSettings, digest_words, paging_settings, paging_settings_of


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def deliverer(tmp_path: Path, records: list[dict], minute: int = 12 * 60, clock: Clock | None = None,
              **config: object) -> Deliverer:
    return Deliverer(tmp_path, records.append, dict(config), "myrun", clock=clock or Clock(), local_minute=lambda: minute)


def page_log(tmp_path: Path) -> tuple[list[str], Path]:
    out = tmp_path / "pages.jsonl"
    script = ("import json, os, sys; open(sys.argv[1], 'a').write(json.dumps({'kind': os.environ['STEPWATCH_ALERT_KIND'],"
              " 'message': os.environ['STEPWATCH_ALERT_MESSAGE']}) + '\\n')")
    return [sys.executable, "-c", script, str(out)], out


def outcomes(records: list[dict]) -> list[tuple[str, str, str]]:
    return sorted((r["alert_id"], r["channel"], r["outcome"]) for r in records)


def test_the_settings_read_and_their_refusals_name_the_key(tmp_path: Path):
    s = paging_settings({"confirm_s": {"stall": 120, "fallback": 0}, "channel_min_level": {"command": "error"},
                         "quiet_hours": "23:00-07:30", "quiet_min_level": "warning", "digest_after": 3,
                         "digest_window_s": 300})
    assert (s.confirm_window_s("stall"), s.confirm_window_s("watchdog"), s.quiet_hours, s.digest_after) == (
        120.0, 0.0, (23 * 60, 7 * 60 + 30), 3)
    assert [s.quiet_at(m) for m in (22 * 60 + 59, 23 * 60, 0, 7 * 60 + 29, 7 * 60 + 30, 12 * 60)] == [
        False, True, True, True, False, False]
    day = paging_settings({"quiet_hours": "09:00-17:00"})
    assert [day.quiet_at(m) for m in (8 * 60 + 59, 9 * 60, 16 * 60 + 59, 17 * 60)] == [False, True, True, False]
    for bad, words in (({"confirm_s": {"stall": -1}}, "confirm_s.stall must be a number of seconds"),
                       ({"confirm_s": 30}, "confirm_s must be a table"),
                       ({"channel_min_level": {"command": "loud"}}, "channel_min_level['command'] must be"),
                       ({"quiet_hours": "25:00-07:00"}, "quiet_hours must be \"HH:MM-HH:MM\""),
                       ({"quiet_hours": "07:00-07:00"}, "quiet_hours must be"),
                       ({"digest_after": 0}, "digest_after must be a whole number")):
        with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("(", r"\(")):
            paging_settings(bad)
        assert paging_settings_of(bad) == PagingSettings()  # a hostile run.json pages as the defaults would
    cfg = tmp_path / "run.toml"
    cfg.write_text('name = "r"\ncommand = ["true"]\n[alerts]\ncommand = ["true"]\nquiet_hours = "late"\n')
    with pytest.raises(ConfigError, match=r"\[alerts\]: quiet_hours must be"):
        load_config(cfg)
    cfg.write_text('name = "r"\ncommand = ["true"]\n[alerts]\ncommand = ["true"]\nconfirm_s = { stall = 30 }\nfinished = ["command"]\n')
    assert load_config(cfg).alerts["confirm_s"] == {"stall": 30}


def test_a_channel_s_own_minimum_level_holds_back_what_another_channel_gets(tmp_path: Path):
    records: list[dict] = []
    d = deliverer(tmp_path, records, command=["true"], urls=["json://127.0.0.1:9/hook"], min_level="info",
                  channel_min_level={"json://127.0.0.1": "error"})
    d.submit({"id": "gpu-1", "kind": "gpu", "message": "tensor idle"})  # a warning
    assert d.wait(10)
    assert outcomes(records) == [("gpu-1", "command", "delivered"), ("gpu-1", "json://127.0.0.1", "below_min_level")]
    assert next(r for r in records if r["outcome"] == "below_min_level")["detail"] == "warning < min_level error"


@pytest.mark.parametrize("minute, held", [(23 * 60 + 30, True), (3 * 60, True), (12 * 60, False)])
def test_quiet_hours_hold_back_what_is_below_their_level_and_let_an_error_through(tmp_path: Path, minute: int,
                                                                                  held: bool):
    records: list[dict] = []
    d = deliverer(tmp_path, records, minute=minute, command=["true"], quiet_hours="23:00-07:00")
    d.submit({"id": "gpu-1", "kind": "gpu", "message": "tensor idle"})
    d.submit({"id": "stall-1", "kind": "stall", "message": "alive but stuck"})
    assert d.wait(10)
    assert outcomes(records) == [("gpu-1", "command", "quiet_hours" if held else "delivered"),
                                 ("stall-1", "command", "delivered")]


def test_a_storm_is_folded_into_one_digest_page_with_its_counts_by_kind(tmp_path: Path):
    command, out = page_log(tmp_path)
    records: list[dict] = []
    clock = Clock()
    d = deliverer(tmp_path, records, clock=clock, command=command, digest_after=2, rate_limit_s=30)
    kinds = ["straggler", "gpu", "straggler", "stall", "straggler", "straggler"]
    for n, kind in enumerate(kinds):
        d.submit({"id": f"{kind}-{n}", "kind": kind, "message": f"{kind} {n}"})
    got = [(r["alert_id"], r["outcome"]) for r in records]
    assert got == [("straggler-2", "rate_limited"), ("stall-3", "digested"), ("straggler-4", "rate_limited"),
                   ("straggler-5", "rate_limited")], got  # two went; the third kind waits for the digest
    d.flush_digest("command")  # the window's end
    assert d.wait(20)
    pages = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(p["kind"] for p in pages) == ["digest", "gpu", "straggler"]
    digest = next(p for p in pages if p["kind"] == "digest")
    assert digest["message"] == ("4 more alerts in 60 s, not paged one by one: straggler 3 (straggler 5; straggler 4; "
                                 "…), stall 1 (stall 3); status lists each")  # each kind named by its newest
    assert ("digest-1", "delivered") in [(r["alert_id"], r["outcome"]) for r in records]
    clock.t += 61  # a new window: the next alert goes on its own
    d.submit({"id": "watchdog-9", "kind": "watchdog", "message": "exited with code 1"})
    assert d.wait(20) and records[-1]["alert_id"] == "watchdog-9" and records[-1]["outcome"] == "delivered"


def test_a_death_a_restart_decision_and_a_stop_are_never_folded_into_a_digest_nor_rate_limited(tmp_path: Path):
    command, out = page_log(tmp_path)
    records: list[dict] = []
    d = deliverer(tmp_path, records, clock=Clock(), command=command, digest_after=2, rate_limit_s=30)
    for n in range(20):  # a storm: two pages go, the rest wait for the digest
        d.submit({"id": f"straggler-{n}", "kind": "straggler" if n % 2 else "gpu", "message": f"slow {n}"})
    own = [{"id": "a1-watchdog-end", "kind": "watchdog", "message": "process 812 KILLED SIGKILL: exit code -9"},
           {"id": "a1-restart", "kind": "restart", "level": "warning", "message": "restarting in 30 s from ckpt_40"},
           {"id": "a2-watchdog-end", "kind": "watchdog", "message": "process 913 exited with code 1"},
           {"id": "a2-restart", "kind": "restart", "level": "error", "message": "not restarting: crash loop"}]
    for a in own:
        d.submit(a)
    assert d.wait(20)
    pages = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(p["message"] for p in pages if p["kind"] in ("watchdog", "restart")) == sorted(a["message"] for a in own)
    held = {r["alert_id"] for r in records if r["outcome"] in ("digested", "rate_limited")}
    assert not held & {a["id"] for a in own} and len(held) == 18  # the control: the storm itself was folded


def test_a_storm_at_the_end_of_the_attempt_still_gets_its_digest(tmp_path: Path):
    records: list[dict] = []
    d = deliverer(tmp_path, records, command=["true"], digest_after=1)
    for n in range(50):
        d.submit({"id": f"straggler-{n}", "kind": "straggler", "message": "slow rank"})
    assert d.wait(20)  # the supervisor's last wait sends what waits
    # the first page and the digest, each sent once (in either order: they may be in flight together)
    assert sorted(r["alert_id"] for r in records if r["outcome"] == "delivered") == ["digest-1", "straggler-0"]
    held = [{"kind": "straggler", "message": "slow rank"}] * 48 + [{"kind": "resolved", "message": "resolved after "
                                                                    "0:01:00: alive but stuck: no optimizer step for 61 s"}]
    assert digest_words(held, 60) == ("49 more alerts in 60 s, not paged one by one: straggler 48 (slow rank; slow "
                                      "rank; …), resolved 1 (resolved after 0:01:00: alive but stuck: no optimizer step "
                                      "…); status lists each")  # a digested resolved says what cleared


def test_the_finished_page_goes_only_to_the_channels_that_asked(tmp_path: Path):
    records: list[dict] = []
    d = deliverer(tmp_path, records, command=["true"], urls=["json://127.0.0.1:9/hook"], finished=["command"])
    d.submit({"id": "a1-finished", "kind": "finished", "level": "info", "wanted": True, "message": "finished"})
    assert d.wait(10)
    assert outcomes(records) == [("a1-finished", "command", "delivered"), ("a1-finished", "json://127.0.0.1", "not_asked")]


def _ended_snapshot(tmp_path: Path) -> Any:  # a snapshot the test rewrites part by part
    import shutil

    from conftest import REPO_ROOT
    from stepwatch.monitors.snapshot.observer import snapshot

    run_dir = tmp_path / "runs" / "ended-sigkill"
    shutil.copytree(REPO_ROOT / "tests" / "fixtures" / "runs" / "ended-sigkill", run_dir)
    return dict(snapshot(run_dir))


def _message(page: dict[str, Any] | None) -> str:
    assert page is not None, "no page"
    return page["message"]


def test_a_full_disks_resolution_and_the_finished_page_say_what_train_log_lost(tmp_path: Path):
    from stepwatch.monitors.watch.lifecycle import finished_page, resolved_page

    snap = _ended_snapshot(tmp_path)
    lost = "; train.log lost 1.2 MiB (1240982 bytes) of the run's output (No space left on device); the run went on"
    snap["state"] = "running"
    snap["disk"] = dict(snap["disk"], log_lost_bytes=1_240_982, log_lost_reason="No space left on device")
    disk_full = {"id": "a1-disk_full-run_dir", "kind": "disk_full", "active": False, "at": "2026-12-05T15:00:00Z",
                 "message": "the run dir's file system is full"}
    page = resolved_page(disk_full, snap, "vm", 1_796_482_860.0)
    assert page is not None and page["message"] == "resolved after 0:01:00: the run dir's file system is full" + lost
    stall = dict(disk_full, id="a1-stall-40", kind="stall", message="alive but stuck")
    assert _message(resolved_page(stall, snap, "vm", 1_796_482_860.0)) == "resolved after 0:01:00: alive but stuck"
    snap.update(state="exited", returncode=0, signal=None)
    finished = finished_page(snap, "vm", 1)
    assert finished is not None and finished["message"].endswith(lost), finished
    snap["disk"] = dict(snap["disk"], log_lost_bytes=None, log_lost_reason=None)  # the control: nothing lost
    assert "lost" not in _message(finished_page(snap, "vm", 1))
    snap["state"] = "running"
    assert _message(resolved_page(disk_full, snap, "vm", 1_796_482_860.0)).endswith("file system is full")


def test_a_stall_or_stuck_rank_a_stopped_process_causes_is_the_frozen_pages_evidence_not_a_page():
    """One cause, one page (issue 44): while a process of the tree is held stopped, a stall or a stuck rank due to
    page waits for the frozen detector (STOPPED_S) and then is that alert's evidence; with nothing held stopped, or
    for another kind, it pages on its own."""
    from stepwatch.monitors.snapshot.model import null_snapshot
    from stepwatch.monitors.watch.lifecycle import WAIT_FOR_FROZEN, stopped_cause

    from stepwatch.monitors.snapshot.types import Alert

    def al(kind: str, aid: str, active: bool = True) -> Alert:
        return {"id": aid, "kind": kind, "at": "2026-12-07T15:00:00Z", "message": "m", "recorded": True,
                "active": active, "delivered": None, "acknowledged": False}

    snap = null_snapshot()
    stall, stuck, death = al("stall", "stall-3"), al("stuck_rank", "stuck_rank-1"), al("watchdog", "watchdog")
    snap["alerts"] = [stall, stuck, death]
    assert stopped_cause(stall, snap, held_stopped=False) is None  # the control: nothing held stopped, it pages
    assert stopped_cause(stall, snap, held_stopped=True) == WAIT_FOR_FROZEN  # held, the frozen verdict not in yet
    snap["alerts"].append(al("frozen", "frozen-812"))
    assert stopped_cause(stall, snap, held_stopped=True) == "frozen-812"
    assert stopped_cause(stuck, snap, held_stopped=True) == "frozen-812"
    assert stopped_cause(death, snap, held_stopped=True) is None  # a death is its own page, always
    snap["alerts"][-1]["active"] = False  # the frozen alert cleared: a stall that still holds is a cause of its own
    assert stopped_cause(stall, snap, held_stopped=True) == WAIT_FOR_FROZEN


def test_the_finished_page_of_a_later_attempt_gives_the_runs_whole_time_and_its_attempts(tmp_path: Path):
    """The finished page gave the last attempt's time alone (issue 44): after a restart it says the run's time since
    its first launch and the attempt; a first attempt's page says its own time once."""
    from stepwatch.monitors.watch.lifecycle import finished_page

    snap = _ended_snapshot(tmp_path)
    snap.update(state="exited", returncode=0, signal=None)
    assert snap["ended"] is not None
    snap["ended"] = {**snap["ended"], "duration_s": 80.0, "ended_at_unix": 1_796_482_800.0}
    first = _message(finished_page(snap, "vm", 1, run_began_unix=1_796_482_720.0))
    assert first.startswith("finished: exit 0 after 0:01:20, ") and "attempt" not in first, first
    third = _message(finished_page(snap, "vm", 3, run_began_unix=1_796_482_800.0 - 3723))
    assert third.startswith("finished: exit 0 after 0:01:20 (attempt 3; the run 1:02:03 since its first launch), "), third


def test_a_rank_death_waits_for_the_groups_end_and_is_then_its_evidence_or_pages_when_the_run_goes_on():
    """One cause, one page (issue 44): a rank's death due to page waits GROUP_END_WAIT_S for the group's end (torchrun
    tears the others down within its monitor interval); when the run ended it is the death page's evidence; when the
    run went on past the wait it pages on its own ("the run goes on" is then true)."""
    from stepwatch.monitors.snapshot.model import null_snapshot
    from stepwatch.monitors.snapshot.types import Alert
    from stepwatch.monitors.watch.lifecycle import GROUP_END_WAIT_S, WAIT_FOR_FROZEN, group_end_cause, unix_of

    def al(kind: str, aid: str) -> Alert:
        return {"id": aid, "kind": kind, "at": "2026-12-07T15:00:00Z", "message": "m", "recorded": True,
                "active": True, "delivered": None, "acknowledged": False}

    died = unix_of("2026-12-07T15:00:00Z")
    assert died is not None
    death = al("rank_death", "a1-rank_death-1-812")
    snap = null_snapshot()
    snap["state"], snap["alerts"] = "running", [death]
    assert group_end_cause(death, snap, died + 0.5) == WAIT_FOR_FROZEN  # the group may end with it
    assert group_end_cause(death, snap, died + GROUP_END_WAIT_S + 0.1) is None  # the run went on: its own page
    snap["state"] = "exited"
    snap["alerts"].append(al("watchdog", "a1-watchdog-end"))
    assert group_end_cause(death, snap, died + 0.5) == "a1-watchdog-end"  # the group ended: the death's page says it
    assert group_end_cause(al("stall", "a1-stall-3"), snap, died + 0.5) is None  # another kind
