"""The supervisor's saved fold of events.jsonl (events.state.json): an attach that starts from it
and reads only the tail must show exactly what folding every line shows, and a state that does not
fit the file, the attempt or the code must be refused (and the attach still right)."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from conftest import step_controls
from stepwatch.monitors.detectors.fallback import FallbackDetector
from stepwatch.monitors.fold.events import EventsFold
from stepwatch.monitors.fold.stepcolumns import StepColumns
from stepwatch.monitors.fold.savedstate import StateError, code_digest, decode, encode, follow, load, save
from stepwatch.monitors.readers.jsonl import EventReader
from stepwatch.monitors.runfiles import EVENTS_STATE
from stepwatch.monitors.snapshot.observer import RunObserver

PID = 2_147_483_000  # above any pid_max: never alive
T0 = 1_780_000_000.0
CONTROLS = ("variable_width_fallback", "full_fallback", "save_spikes", "recompile_burst", "variable_width_no_tokens")


def _control(name: str, seed: int = 0):
    return next(c for c in step_controls().all_controls(seed) if c.name == name)


def event_lines(name: str, seed: int = 0) -> list[bytes]:
    """A whole attempt's events.jsonl for one detector control, with every other kind of line a
    run writes, and the junk a file can hold (a corrupt line, an unusable step, rank 1, NaN)."""
    recs = _control(name, seed).records
    rng = random.Random(seed)
    out = [{"v": 1, "kind": "run_start", "t": T0, "step": None, "rank": 0, "max_steps": len(recs),
            "versions": {"python": "3.11", "torch": "2.13.0", "transformers": "5.0"},
            "attn_implementation": {"requested": None, "resolved": "sdpa"}}]
    lines: list[bytes] = []
    for i, r in enumerate(recs):
        r = dict(r)
        if i in (40, 41, 43, 44, 46) or rng.random() < 0.01:
            r["flags"] = list(r["flags"]) + ["recompile"]
        out.append(r)
        if i % 37 == 0:
            out.append({"v": 1, "kind": "log", "t": r["t"], "step": r["step"], "rank": 0,
                        "logs": {"loss": float("nan") if i == 74 else 2.0 - i / 1e4, "epoch": i / len(recs)}})
        if i % 101 == 0:
            out.append({"v": 1, "kind": "phase", "t": r["t"], "step": r["step"], "rank": 0, "name": "save",
                        "state": "begin" if i % 202 == 0 else "end"})
        if i % 90 == 0:
            out.append({"v": 1, "kind": "dynamo", "t": r["t"], "step": r["step"], "rank": 0,
                        "counters": {"stats": {"unique_graphs": i // 90}}, "recompiles": i // 90,
                        "recompile_limit_hits": 0})
        if i == 60:
            out.append(dict(r, dt="slow"))  # unusable: counted
        if i == 70:
            out.append(dict(r, rank=1, dt=999.0))  # another rank: not rank 0's story
    out.append({"v": 1, "kind": "run_end", "t": recs[-1]["t"] + 1, "step": recs[-1]["step"], "rank": 0,
                "dynamo": {"recompiles": 7, "recompile_limit_hits": 0}, "dropped_events": 0})
    for k, ev in enumerate(out):
        lines.append(json.dumps(ev).encode() + b"\n")
        if k == 120:
            lines.append(b'{"v": 1, "kind": "step", "dt": \n')  # a crash mid-write: corrupt
    return lines


def write_run(run_dir: Path, events: bytes, attempt: int = 1) -> tuple[int, float]:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.json").write_text(json.dumps({
        "v": 1, "name": run_dir.name, "attempt": attempt, "launched_at_unix": T0,
        "process": {"pid": PID, "create_time": T0, "pgid": PID}, "supervisor": {"pid": PID - 1, "create_time": T0}}))
    (run_dir / "events.jsonl").write_bytes(events)
    (run_dir / "exit.json").write_text(json.dumps({"returncode": 0, "signal": None, "ended_at_unix": T0 + 9e5,
                                                   "duration_s": 9e5}))
    return (attempt, T0)


def save_once(run_dir: Path, key) -> None:
    """What the supervisor does at the end of a run: fold what is there and save it."""
    done = threading.Event()
    done.set()
    follow(run_dir, key, done, every_s=0)


def comparable(snap: Any) -> str:
    snap = json.loads(json.dumps(snap))
    snap["events"]["resume"] = None
    snap["log"]["last_byte_age_s"] = None
    if snap.get("disk"):  # the file system's free space, read at each refresh: it moves between two
        snap["disk"]["free_bytes"] = None
    snap["health"] = None  # the host's load and the tree's CPU, read at each refresh: they move too
    for al in snap["alerts"]:
        if al["kind"] not in ("fallback", "watchdog"):
            al["at"] = None  # when this observer first saw it; the fallback's time is from the file
    return json.dumps(snap, sort_keys=True)


@pytest.mark.parametrize("name", CONTROLS)  # one control a test: each stays under the unit tier's 2 s
def test_a_resumed_attach_equals_folding_every_line_at_random_cut_points(tmp_path: Path, name: str):
    """The supervisor saved at a random byte (mid-line too); the run then wrote the rest. The attach
    that starts from the state shows the very snapshot a full fold shows, and the fold itself (every
    attribute, encoded) is the same."""
    rng = random.Random(f"3-{name}")
    cuts_tested = resumed = flagged = 0
    data = b"".join(event_lines(name))
    for k in range(3):
        cut = rng.randrange(1, len(data)) if k else len(data)  # k == 0: saved at the very end
        run_dir = tmp_path / f"{name}-{k}"
        key = write_run(run_dir, data[:cut])
        save_once(run_dir, key)
        (run_dir / "events.jsonl").write_bytes(data)  # the rest of the run (same inode: appended)
        fast, full = RunObserver(run_dir), RunObserver(run_dir, use_saved_state=False)
        s_fast, s_full = fast.refresh(), full.refresh()
        assert s_fast["events"]["resume"]["refused"] is None, s_fast["events"]["resume"]
        assert s_fast["events"]["resume"]["from_offset"] == cut
        assert s_full["events"]["resume"] is None
        assert comparable(s_fast) == comparable(s_full), (name, cut)
        assert encode(fast.a.ev) == encode(full.a.ev), (name, cut)
        cuts_tested += 1
        resumed += s_fast["events"]["resume"]["from_line"] > 0
        flagged += s_full["fallback"]["state"] == "flagged"
        # and after more lines, live: both observers follow on equally
        with open(run_dir / "events.jsonl", "ab") as f:
            f.write(b"".join(event_lines(name, seed=1)[1:200]))
        assert comparable(fast.refresh()) == comparable(full.refresh())
    # every cut, the ones after the first line resumed, and the full fold flags exactly the positive controls
    assert cuts_tested == 3 and resumed >= 2 and flagged == (3 if _control(name).polarity == "positive" else 0)


def test_the_codec_keeps_shared_objects_shared_and_the_detector_goes_on_the_same(tmp_path: Path):
    """A flagged detector holds each slow step once, referenced from its flag window, its slow
    list, its onset and its flag cluster; restored, they are still one object each, and the
    restored detector judges the next steps exactly as the original."""
    rows = [(r["step"], r["dt"], r["flags"], r["tokens"], r["padded_tokens"], r["t"])
            for r in _control("partial_fallback_15pct").records]
    half = len(rows) * 2 // 3
    d = FallbackDetector()
    d.add_many(rows[:half])
    assert d.state in ("suspected", "flagged") and d.to_state().onset is not None
    back = decode(json.loads(json.dumps(encode(d))))
    st = back.to_state()
    assert st.onset in st.slow and any(st.onset is s for s in st.slow)
    assert all(any(x is s for s in st.slow) for x, _, _ in st.window if x is not None)
    assert back.add_many(rows[half:]) == d.add_many(rows[half:])
    assert back.snapshot() == d.snapshot() and back.details() == d.details()


def test_floats_round_trip_exactly(tmp_path: Path):
    vals = [0.1, -0.0, 0.0, 1e-320, 1.7976931348623157e308, float("inf"), float("-inf"), 2**63, -(2**70)]
    back = decode(json.loads(json.dumps(encode({"v": vals, 0.5: (1, [2.5])}))))
    assert [repr(x) for x in back["v"]] == [repr(x) for x in vals]
    assert back[0.5] == (1, [2.5])
    nan = decode(json.loads(json.dumps(encode([float("nan")]))))[0]
    assert nan != nan


@pytest.mark.parametrize("spoil, why", [
    ("edit", "are not those the saved state was built from"),
    ("truncate", "is shorter"),
    ("attempt", "saved for attempt"),
    ("code", "another version of stepwatch"),
    ("format", "format 99"),
    ("not json", "not JSON"),
    ("class", "may not make a 'Popen'"),
    ("field", "has the wrong fields"),
    ("maxlen", "bad deque maxlen 1000000000000000000000000000000"),
    ("window length", "a saved EventsFold.recompile_steps keeps 16777216 items, not 1000"),
    ("type", "a saved EventsFold.stats is a dict, not a StepStats"),
    ("shared list", "a reference to no record: 999999"),
    ("record in a list's place", "FallbackDetector.excused is a StepRecord, not a tuple"),
    ("raw", "EventsFold.last_logs is not a value read from events.jsonl"),
    ("huge int", "a saved StepStats.last is a int (1000000000000000000000"),
    ("width index", "a saved detector window holds (1.0, -5.0), not (seconds, width)"),
    ("array of floats", "a saved StepStats' step times hold something else than floats"),
    ("flag window length", "a saved FallbackDetector.window keeps 41 items, more than 40"),
])
def test_a_state_that_does_not_fit_is_refused_and_the_attach_still_right(tmp_path: Path, spoil: str, why: str):
    data = b"".join(event_lines("variable_width_fallback"))
    run_dir = tmp_path / "r"
    key = write_run(run_dir, data[: len(data) // 2])
    save_once(run_dir, key)
    (run_dir / "events.jsonl").write_bytes(data)
    path = run_dir / EVENTS_STATE
    doc = json.loads(path.read_text())
    if spoil == "edit":  # a byte before the saved offset differs (same length)
        b = bytearray(data)
        i = b.index(b'"dt": ', 1000) + 6
        b[i] = ord("9") if b[i] != ord("9") else ord("8")
        (run_dir / "events.jsonl").write_bytes(bytes(b))
    elif spoil == "truncate":
        (run_dir / "events.jsonl").write_bytes(data[: len(data) // 4])
    elif spoil == "attempt":  # the dir was launched again without a rotation
        write_run(run_dir, data, attempt=2)
    elif spoil == "code":
        doc["code"] = "0" * 64
    elif spoil == "format":
        doc["v"] = 99
    elif spoil == "class":
        doc["state"]["f"]["stats"] = {"O": "Popen", "f": {}, "#": 10**6}
    elif spoil == "field":
        doc["state"]["f"]["extra"] = 1
    elif spoil == "maxlen":
        doc["state"]["f"]["recompile_steps"]["m"] = 10**30
    elif spoil == "window length":
        doc["state"]["f"]["recompile_steps"]["m"] = 1 << 24
    elif spoil == "type":
        doc["state"]["f"]["stats"] = {"D": []}
    elif spoil == "shared list":  # a list held twice could nest itself 2**60 times in 200 KB
        doc["state"]["f"]["detector"]["f"]["excused"] = {"R": 999999}
    elif spoil == "record in a list's place":
        doc["state"]["f"]["detector"]["f"]["excused"] = {"R": 0}
    elif spoil == "huge int":  # a float() of it would raise in a view's formatting
        doc["state"]["f"]["stats"]["f"]["last"] = 10**400
    elif spoil == "width index":  # a width without a logarithm: the window's width index could not be built
        doc["state"]["f"]["detector"]["f"]["base"]["f"]["steps"]["T"][0] = {"T": [1.0, -5.0]}
    elif spoil == "flag window length":  # the flag window one longer than the detector keeps
        window = doc["state"]["f"]["detector"]["f"]["window"]["T"]
        assert len(window) == 40
        window.append(window[-1])
    elif spoil == "raw":
        doc["state"]["f"]["last_logs"] = {"L": [{"R": 0}]}
    elif spoil == "array of floats":  # the step times waiting to be sorted in: floats only
        doc["state"]["f"]["stats"]["f"]["pending_s"]["T"][3] = "3"
    if spoil not in ("edit", "truncate", "attempt", "not json"):
        path.write_text(json.dumps(doc))
    if spoil == "not json":
        path.write_text(path.read_text()[:1000])
    snap = RunObserver(run_dir).refresh()
    assert why in (snap["events"]["resume"]["refused"] or ""), snap["events"]["resume"]
    assert snap["events"]["resume"]["from_offset"] is None
    assert comparable(snap) == comparable(RunObserver(run_dir, use_saved_state=False).refresh())


def test_a_state_that_checks_out_but_fails_in_use_falls_back_to_a_full_fold(tmp_path: Path):
    data = b"".join(event_lines("full_fallback"))
    run_dir = tmp_path / "r"
    key = write_run(run_dir, data[: len(data) // 2])
    save_once(run_dir, key)
    (run_dir / "events.jsonl").write_bytes(data)
    doc = json.loads((run_dir / EVENTS_STATE).read_text())
    fold = doc["state"]["f"]
    assert len(fold["stats"]["f"]["pending_s"]["T"]) > 100  # the supervisor never reads: all wait to be sorted in
    accounts = fold["interval_s"]["D"]
    assert accounts
    fold["interval_s"]["D"] = [[k, str(v)] for k, v in accounts]  # a dict of the ledger's accounts still checks out
    (run_dir / EVENTS_STATE).write_text(json.dumps(doc))
    snap = RunObserver(run_dir).refresh()  # the next step's interval is not added to a string
    assert "the saved state failed in use: TypeError" in snap["events"]["resume"]["refused"]
    assert comparable(snap) == comparable(RunObserver(run_dir, use_saved_state=False).refresh())


def test_no_state_file_is_no_resume_and_a_reader_needs_a_digest_to_say_where_it_is(tmp_path: Path):
    run_dir = tmp_path / "r"
    write_run(run_dir, b"".join(event_lines("save_spikes")))
    assert RunObserver(run_dir).refresh()["events"]["resume"] is None
    with pytest.raises(ValueError, match="digest=True"):
        EventReader(run_dir / "events.jsonl").position()
    r = EventReader(run_dir / "events.jsonl", digest=True)
    r.read_new()
    with pytest.raises(ValueError, match="read nothing"):
        r.resume(r.position())
    r.close()


def test_save_refuses_what_it_cannot_carry(tmp_path: Path):
    fold = EventsFold()
    fold.recompile_steps.append(object())  # not a step number: a bug, said so
    r = EventReader(tmp_path / "events.jsonl", digest=True)
    with pytest.raises(StateError, match="cannot save a builtins.object"):
        save(tmp_path, fold, r, (1, T0))
    fold = EventsFold()
    fold.phase_longest_s = fold.interval_s  # a container held twice would come back as two
    with pytest.raises(StateError, match="held in two places"):
        save(tmp_path, fold, r, (1, T0))
    assert not (tmp_path / EVENTS_STATE).exists()


@pytest.mark.system  # the supervisor's saving loop in a thread, waited on by wall time
def test_a_record_json_cannot_write_back_skips_a_save_not_the_following_ones(tmp_path: Path):
    """A log event nested deeper than json writes (orjson reads up to 1024 levels): that save is
    skipped and said once; the next log event replaces the value and saving goes on."""
    run_dir = tmp_path / "r"
    lines = event_lines("save_spikes")
    deep = b'{"v": 1, "kind": "log", "rank": 0, "logs": ' + b"[" * 1010 + b"]" * 1010 + b"}\n"
    key = write_run(run_dir, b"".join(lines[:300]) + deep)
    said: list[str] = []
    done = threading.Event()
    t = threading.Thread(target=follow, args=(run_dir, key, done),
                         kwargs={"every_s": 0.02, "log": said.append}, daemon=True)
    t.start()
    from conftest import wait_until

    wait_until(lambda: said, what="the failed save said")
    assert not (run_dir / EVENTS_STATE).exists() and "RecursionError" in said[0], said
    with open(run_dir / "events.jsonl", "ab") as f:
        f.write(b"".join(lines[300:]))
    size = (run_dir / "events.jsonl").stat().st_size
    wait_until(lambda: (run_dir / EVENTS_STATE).exists()
               and json.loads((run_dir / EVENTS_STATE).read_bytes())["events"]["offset"] == size, what="a save")
    done.set()
    t.join(10)
    assert len(said) == 1, said  # said once, although tried at every round before the next log event
    snap = RunObserver(run_dir).refresh()
    assert snap["events"]["resume"]["from_offset"] == (run_dir / "events.jsonl").stat().st_size
    assert comparable(snap) == comparable(RunObserver(run_dir, use_saved_state=False).refresh())


def test_load_checks_the_code_digest_of_the_source(tmp_path: Path):
    run_dir = tmp_path / "r"
    key = write_run(run_dir, b"".join(event_lines("save_spikes")))
    save_once(run_dir, key)
    assert json.loads((run_dir / EVENTS_STATE).read_text())["code"] == code_digest()
    fold, info = load(run_dir, key, EventReader(run_dir / "events.jsonl"))
    assert fold is not None and info["from_offset"] == (run_dir / "events.jsonl").stat().st_size


@pytest.mark.system  # the supervisor's saving loop in a thread, waited on by wall time
def test_the_supervisors_loop_saves_as_the_file_grows_and_once_more_at_the_end(tmp_path: Path):
    from conftest import wait_until

    lines = event_lines("full_fallback")
    run_dir = tmp_path / "r"
    key = write_run(run_dir, b"")
    done = threading.Event()
    t = threading.Thread(target=follow, args=(run_dir, key, done), kwargs={"every_s": 0.05}, daemon=True)
    t.start()
    ev = run_dir / "events.jsonl"

    def saved_offset() -> int | None:
        try:
            return json.loads((run_dir / EVENTS_STATE).read_bytes())["events"]["offset"]
        except (OSError, ValueError):
            return None

    with open(ev, "ab") as f:
        for part in (lines[:100], lines[100:300]):
            f.write(b"".join(part))
            f.flush()
            size = ev.stat().st_size
            wait_until(lambda: saved_offset() == size, what=f"a save at byte {size}")
        f.write(b"".join(lines[300:]) + b'{"v": 1, "kind": "st')  # the run ends mid-line
    done.set()
    t.join(10)
    assert not t.is_alive()
    assert saved_offset() == ev.stat().st_size
    snap = RunObserver(run_dir).refresh()
    assert snap["events"]["resume"]["from_offset"] == ev.stat().st_size
    assert comparable(snap) == comparable(RunObserver(run_dir, use_saved_state=False).refresh())
    assert snap["fallback"]["state"] == "flagged"


def test_an_oversized_state_is_refused_unread(tmp_path: Path, monkeypatch):
    import stepwatch.monitors.fold.savedstate as es

    run_dir = tmp_path / "r"
    key = write_run(run_dir, b"".join(event_lines("save_spikes")))
    save_once(run_dir, key)
    size = (run_dir / EVENTS_STATE).stat().st_size
    monkeypatch.setattr(es, "MAX_STATE_BYTES", size - 1)
    snap = RunObserver(run_dir).refresh()
    assert snap["events"]["resume"]["refused"] == f"{size} bytes, more than the {size - 1} a saved state may have"
    monkeypatch.setattr(es, "MAX_STATE_BYTES", size)
    assert RunObserver(run_dir).refresh()["events"]["resume"]["refused"] is None


def test_a_late_save_of_the_previous_attempt_is_not_rotated_with_this_ones_files(tmp_path: Path):
    """The previous supervisor's last save landed after a relaunch rotated the files: the next
    rotation drops it (derived data) instead of filing it under this attempt's stamp; a state of
    the attempt itself goes with its files."""
    from stepwatch.launcher.rotate import rotate
    from stepwatch.monitors.runfiles import utc_stamp

    run_dir = tmp_path / "r"
    data = b"".join(event_lines("save_spikes"))
    key1 = write_run(run_dir, data, attempt=1)
    save_once(run_dir, key1)
    write_run(run_dir, data, attempt=2)  # attempt 2 in run.json; attempt 1's state still here
    rotate(run_dir)
    stamp = utc_stamp(T0)
    assert not (run_dir / EVENTS_STATE).exists() and not (run_dir / f"events.{stamp}.state.json").exists()
    assert (run_dir / f"events.{stamp}.jsonl").exists()
    key3 = write_run(run_dir, data, attempt=3)
    save_once(run_dir, key3)
    rotate(run_dir)
    rotated = json.loads((run_dir / f"events.{stamp}-1.state.json").read_text())
    assert rotated["attempt"] == [3, T0]


def test_a_backlog_fed_in_pieces_folds_to_the_same_state(tmp_path: Path, monkeypatch):
    """EventsFold feeds a long backlog's steps FEED_ROWS at a time (bounded memory): the fold is
    the same as one feed of everything, to the last attribute."""
    import stepwatch.monitors.fold.events as ef

    data = b"".join(event_lines("variable_width_fallback") + event_lines("full_fallback", seed=1)[1:])
    run_dir = tmp_path / "r"
    write_run(run_dir, data)
    whole = RunObserver(run_dir, use_saved_state=False)
    s_whole = whole.refresh()
    import stepwatch.monitors.readers.jsonl as et

    monkeypatch.setattr(ef, "FEED_ROWS", 37)
    monkeypatch.setattr(et, "_CHUNK", 4096)  # ~20 events a read: a feed every two reads or so
    fed: list[int] = []
    feed = ef.EventsFold._feed
    monkeypatch.setattr(ef.EventsFold, "_feed", lambda self, cols: (fed.append(len(cols)), feed(self, cols)))
    pieces = RunObserver(run_dir, use_saved_state=False)
    s_pieces = pieces.refresh()
    assert comparable(s_pieces) == comparable(s_whole)
    assert encode(pieces.a.ev) == encode(whole.a.ev)
    assert s_whole["fallback"]["state"] == "flagged" and s_whole["step_seconds"]["n"] > 1200
    assert len(fed) > 20 and max(fed) < 80, fed


def _long_backlog(kind: str, n: int = 2000) -> bytes:
    """A steady run of one batch shape (a backlog's steady spans, monitors/detectors/steadyspan.py), with saves,
    evaluations, idle and stopped steps, a second `first` (a restart in the attempt) and, by ``kind``, step ends that
    go back, are missing or are ints."""
    rng = random.Random(5)
    out, t = [], 0.001 if kind == "ends near the epoch" else T0  # (sums of intervals of small ends round)
    for s in range(1, n + 1):
        dt = 19.5 * rng.lognormvariate(0, 0.08)
        flags = ["first"] if s in (1, n // 2) else [("save", "eval", "idle", "stopped", "silent", "recompile")[
            s // 97 % 6]] if s % 97 == 0 else []
        t += dt
        end: object = t
        if kind == "ends that go back" and s % 50 == 0:
            end = t - 100.0
        if kind == "ends missing or ints" and s % 70 == 0:
            end = None if s % 140 else int(t)
        ev = {"v": 1, "kind": "step", "t": t, "step": s, "rank": 0, "dt": round(dt, 6), "step_begin": t - dt,
              "step_end": end, "tokens": 26048, "padded_tokens": 26112, "flags": flags}
        if kind == "odd fields" and s % 37 == 0:
            k, v = rng.choice([("tokens", -1), ("tokens", 2**60), ("padded_tokens", 26112.0), ("padded_tokens", None),
                               ("step", float(s)), ("step", 2.5), ("step", None), ("t", int(t)), ("t", "x"),
                               ("t", -1.0), ("rank", 0.0), ("rank", 1), ("flags", None), ("dt", 19), ("dt", -1.0),
                               ("width", 512), ("timing", "shared"), ("timing", "reported"), ("width", [512]),
                               ("timing", {"shared": 1}), ("rank", [0]), ("flags", ["save", 1])])
            ev[k] = v
            if k == "timing":
                ev["arrival_dt_s"] = 19.4
        out.append(ev)
        if s % 10 == 0:
            out.append({"v": 1, "kind": "log", "t": t, "step": s, "rank": 0, "logs": {"loss": 2.0 - s / 1e5}})
    return b"".join(json.dumps(ev).encode() + b"\n" for ev in out)


#: The sorted views the baseline and the detector keep beside their windows (monitors/detectors/baseline.py): caches
#: whose every read gives the same values however they were last kept, rebuilt after a steady span
_VIEWS = frozenset(("_dts", "_dts_sync", "_dts_idle", "_pt", "_pt_sync", "_pt_idle", "_pt_evicted", "_scores",
                    "_scores_sync", "_scores_idle", "_scores_added", "_scores_evicted"))


def _ev(obs: RunObserver) -> EventsFold:
    assert obs.a is not None
    return obs.a.ev


def _without_views(x):
    if isinstance(x, dict):
        return {k: _without_views(v) for k, v in x.items() if k not in _VIEWS}
    return [_without_views(v) for v in x] if isinstance(x, list) else x


@pytest.mark.parametrize("kind", ["ends in order", "ends that go back", "ends missing or ints", "ends near the epoch",
                                  "odd fields"])
def test_a_long_backlog_folds_as_arrays_to_the_state_its_pieces_fold_to(tmp_path: Path, monkeypatch, kind):
    """A cold attach folds a long backlog's steps a whole read at a time (the step statistics, the ledger's accounts
    and the fallback detector's steady spans as arrays); fed in pieces too small for that, the fold is the same to
    the last attribute and the last bit of every sum."""
    import stepwatch.monitors.fold.events as ef
    import stepwatch.monitors.readers.jsonl as et

    run_dir = tmp_path / "r"
    write_run(run_dir, _long_backlog(kind))
    whole = RunObserver(run_dir, use_saved_state=False)
    s_whole = whole.refresh()
    monkeypatch.setattr(ef, "FEED_ROWS", 37)
    monkeypatch.setattr(et, "_CHUNK", 4096)
    pieces = RunObserver(run_dir, use_saved_state=False)
    assert comparable(pieces.refresh()) == comparable(s_whole)
    assert _without_views(encode(_ev(pieces))) == _without_views(encode(_ev(whole)))
    # a read decoded as the emitter's records (fold/records.py) folds as its dicts do, and a read's dicts taken a
    # field at a time (StepColumns.take) as the fold's own rule record by record
    monkeypatch.setattr(ef, "ReadDecoder", lambda: lambda body: None)
    dicts = RunObserver(run_dir, use_saved_state=False)
    assert comparable(dicts.refresh()) == comparable(s_whole)
    assert _without_views(encode(_ev(dicts))) == _without_views(encode(_ev(whole)))
    monkeypatch.setattr(StepColumns, "take", lambda self, evs: None)
    each = RunObserver(run_dir, use_saved_state=False)
    assert comparable(each.refresh()) == comparable(s_whole)
    assert _without_views(encode(_ev(each))) == _without_views(encode(_ev(whole)))
    ev = _ev(whole)
    assert set(ev.interval_s) == {"training", "evaluating", "saving", "stalled"} and ev.stats.n > 1850, ev.interval_s


def test_the_log_records_metrics_go_to_their_series_as_one_record_at_a_time_puts_them(tmp_path: Path):
    """A read's log records go to each metric's series at once: the same points, in the same order, and the series
    in the order their first points came, whatever the values (ints, huge ints, bools, NaN, text, a missing metric,
    logs that are no object)."""
    from stepwatch.monitors.protocol import METRICS_SHOWN_FIRST
    from stepwatch.monitors.stats.minmax import MinMaxSeries

    rng = random.Random(11)
    odd = [1, 2**2000, True, float("nan"), "0.5", None, [1], -3.5, float("inf")]
    recs, want = [], {}
    for i in range(3000):
        logs = {name: rng.choice([rng.uniform(0, 3), rng.uniform(0, 3), rng.choice(odd)])
                for name in rng.sample(METRICS_SHOWN_FIRST, rng.randint(0, 4))}
        logs["lr"] = rng.choice([1, 2**2000, 0.25, 0.5])  # in every record, numbers only, ints among them
        if i % 500 == 7:
            logs = rng.choice([["not", "an", "object"], "text", None])
        step = rng.choice([i, i, float(i), None, -1])
        recs.append({"v": 1, "kind": "log", "t": T0 + i, "step": step, "rank": 0, "logs": logs})
        if isinstance(logs, dict):  # the rule, one record at a time
            at = step if type(step) is int and 0 <= step < 2**53 else None
            for name in METRICS_SHOWN_FIRST:
                v = logs.get(name)
                if type(v) in (int, float):
                    want.setdefault(name, MinMaxSeries()).add(at, float(min(max(v, -2**1000), 2**1000))
                                                              if type(v) is int else v)
    run_dir = tmp_path / "r"
    write_run(run_dir, "".join(json.dumps(r) + "\n" for r in recs).encode())
    got = _ev(_observed(run_dir)).series
    assert list(got) == list(want) and len(want) >= 6
    for name in want:
        assert got[name].as_json() == want[name].as_json() and got[name].nonfinite == want[name].nonfinite, name


def _observed(run_dir: Path) -> RunObserver:
    obs = RunObserver(run_dir, use_saved_state=False)
    obs.refresh()
    return obs


def test_only_a_state_of_your_own_that_no_one_else_could_change_is_used(tmp_path: Path):
    """A saved state is trusted, not re-derived: one another user wrote (or could have changed) is
    never used; their runs are folded line by line, which is always right."""
    import os

    run_dir = tmp_path / "r"
    key = write_run(run_dir, b"".join(event_lines("save_spikes")))
    save_once(run_dir, key)
    path = run_dir / EVENTS_STATE
    assert (path.stat().st_mode & 0o777) == 0o644  # whatever the umask: no one else may write it
    cold = comparable(RunObserver(run_dir, use_saved_state=False).refresh())
    assert RunObserver(run_dir).refresh()["events"]["resume"]["refused"] is None
    path.chmod(0o664)
    snap = RunObserver(run_dir).refresh()
    assert "writable by others (mode 664)" in snap["events"]["resume"]["refused"] and comparable(snap) == cold
    path.chmod(0o644)
    if os.geteuid() == 0:  # only root can hand a file to another user here
        os.chown(path, 12345, -1)
        snap = RunObserver(run_dir).refresh()
        assert "written by uid 12345" in snap["events"]["resume"]["refused"] and comparable(snap) == cold


def test_a_fifo_in_place_of_a_file_never_hangs_a_view(tmp_path: Path):
    import os

    run_dir = tmp_path / "r"
    key = write_run(run_dir, b"".join(event_lines("save_spikes")))
    os.mkfifo(run_dir / EVENTS_STATE)  # no writer: a blocking open would wait for ever
    done = threading.Event()
    out: dict = {}
    threading.Thread(target=lambda: (out.update(RunObserver(run_dir).refresh()), done.set()), daemon=True).start()
    assert done.wait(20), "the view hung on a FIFO events.state.json"
    assert out["events"]["resume"]["refused"] == "not a regular file"
    assert out["step_seconds"]["n"] > 1000
    os.unlink(run_dir / "events.jsonl")
    os.mkfifo(run_dir / "events.jsonl")
    os.unlink(run_dir / EVENTS_STATE)
    done.clear()
    threading.Thread(target=lambda: (out.update(RunObserver(run_dir).refresh()), done.set()), daemon=True).start()
    assert done.wait(20), "the view hung on a FIFO events.jsonl"
    assert out["step_seconds"]["n"] == 0 and out["state"] == "exited"
    t = threading.Thread(target=save_once, args=(run_dir, key), daemon=True)  # the supervisor's loop too
    t.start()
    t.join(20)
    assert not t.is_alive(), "the supervisor's loop hung on a FIFO events.jsonl"
