"""The run dir's file guards on real files (the hostile-input guards, one file at a time):
what open_regular and read_json refuse (a symlink, a FIFO, a directory, another uid's file, an
oversized, empty, broken, too deep or non-object JSON), what the atomic and append writers leave
(modes, no temp file, never through a symlink or into a FIFO), the names and stamps, and what a
view shows of hostile text (tui/safe.py: every control character a visible stand-in)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from stepwatch.monitors import runfiles as rf


def _owned_by_nobody(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("this test needs root: it gives a file to uid 65534")
    os.chown(path, 65534, 65534)


def test_open_regular_opens_only_a_regular_file_of_the_owner_asked(tmp_path: Path):
    f = tmp_path / "run.json"
    f.write_text("{}")
    fd = rf.open_regular(f)
    assert fd is not None and os.read(fd, 10) == b"{}"
    os.close(fd)
    fd = rf.open_regular(f, os.geteuid())
    assert fd is not None
    os.close(fd)
    (tmp_path / "link.json").symlink_to(f)
    assert rf.open_regular(tmp_path / "link.json") is None  # a symlink is never followed
    os.mkfifo(tmp_path / "fifo.json")
    assert rf.open_regular(tmp_path / "fifo.json") is None  # opened without blocking, then refused
    (tmp_path / "dir.json").mkdir()
    assert rf.open_regular(tmp_path / "dir.json") is None
    _owned_by_nobody(f)
    assert rf.open_regular(f, os.geteuid()) is None and rf.read_json(f, os.geteuid()) is None
    fd = rf.open_regular(f, 65534)
    assert fd is not None
    os.close(fd)
    with pytest.raises(FileNotFoundError):
        rf.open_regular(tmp_path / "missing.json")


@pytest.mark.parametrize("content, expected", [
    (b'{"a": 1}', {"a": 1}), (b"", None), (b"  \n\t", None), (b"{", None), (b"[1, 2]", None), (b'"x"', None),
    (b"\xff\xfe{}", None), (b"[" * 100_000 + b"]" * 100_000, None), (b'{"a": "\xc3\xa9"}', {"a": "é"}),
])
def test_read_json_takes_one_object_and_nothing_else(tmp_path: Path, content: bytes, expected):
    f = tmp_path / "x.json"
    f.write_bytes(content)
    assert rf.read_json(f) == expected


def test_read_json_refuses_a_file_over_16_mib_and_takes_one_at_it(tmp_path: Path):
    assert rf.MAX_JSON_BYTES == 16 * 1024 * 1024
    body = b'{"a": "' + b"x" * (rf.MAX_JSON_BYTES - 10) + b'"}'
    at = tmp_path / "at.json"
    at.write_bytes(body + b" " * (rf.MAX_JSON_BYTES - len(body)))
    assert at.stat().st_size == rf.MAX_JSON_BYTES and rf.read_json(at) is not None
    over = tmp_path / "over.json"
    over.write_bytes(body + b" " * (rf.MAX_JSON_BYTES - len(body) + 1))
    assert rf.read_json(over) is None
    assert rf.read_json(tmp_path / "missing.json") is None and rf.read_json(tmp_path / "nodir" / "x.json") is None
    (tmp_path / "plain").write_text("x")
    assert rf.read_json(tmp_path / "plain" / "x.json") is None  # a path through a file: NotADirectoryError


def test_atomic_writes_leave_0644_whatever_the_umask_or_the_mode_asked_and_no_temp_file(tmp_path: Path):
    old = os.umask(0o027)
    try:
        rf.write_json_atomic(tmp_path / "a.json", {"b": [1, 2], "a": 1})
        assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644  # a record others read
        assert os.umask(0o027) == 0o027  # the umask left as it was
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").read_text() == '{\n  "b": [\n    1,\n    2\n  ],\n  "a": 1\n}\n'  # keys in order
    rf.write_json_atomic(tmp_path / "c.json", {"b": [1, 2], "a": 1}, indent=None, mode=0o600)
    assert (tmp_path / "c.json").read_text() == '{"b":[1,2],"a":1}\n'
    assert stat.S_IMODE((tmp_path / "c.json").stat().st_mode) == 0o600
    rf.write_bytes_atomic(tmp_path / "d.bin", b"\x00\x01")
    assert (tmp_path / "d.bin").read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "c.json", "d.bin"]  # no .tmp left
    with pytest.raises(TypeError):
        rf.write_json_atomic(tmp_path / "e.json", {"x": object()})
    with pytest.raises(OSError):
        rf.write_bytes_atomic(tmp_path / "nodir" / "f.json", b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "c.json", "d.bin"]  # a failed write leaves nothing


def test_appends_never_go_through_a_symlink_or_into_a_fifo(tmp_path: Path):
    f = tmp_path / "alerts.jsonl"
    rf.append_jsonl(f, {"k": 1})
    rf.append_jsonl(f, {"k": "é"})
    assert f.read_text() == '{"k":1}\n{"k":"\\u00e9"}\n'
    rf.append_bytes(f, b"x" * 200_000)
    assert f.stat().st_size == len('{"k":1}\n{"k":"\\u00e9"}\n') + 200_000
    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / "l.jsonl").symlink_to(target)
    with pytest.raises(OSError):
        rf.append_jsonl(tmp_path / "l.jsonl", {"k": 1})
    assert target.read_text() == ""
    os.mkfifo(tmp_path / "p.jsonl")
    with pytest.raises(OSError):
        rf.append_jsonl(tmp_path / "p.jsonl", {"k": 1})
    fd = rf.open_append(f)
    try:
        assert os.get_blocking(fd) and os.fstat(fd).st_size > 0
    finally:
        os.close(fd)


def test_names_stamps_sizes_and_push_urls(tmp_path: Path):
    assert rf.stamped_name("train.log", "S") == "train.S.log" and rf.stamped_name("events.rank1.jsonl", "S") == "events.S.rank1.jsonl"
    assert rf.stamped_name("jobwatch", "S") == "jobwatch.S"
    assert rf.utc_stamp(1_780_000_000.9) == "20260528T202640Z" and rf.utc_iso(None) is None
    assert rf.utc_iso(1_780_000_000.25) == "2026-05-28T20:26:40.250Z"
    assert rf.rank_events_name(0) == "events.jsonl" and rf.rank_events_name(3) == "events.rank3.jsonl"
    assert rf.rank_log_steps_name(0) == "logsteps.jsonl" and rf.rank_log_steps_name(2) == "logsteps.rank2.jsonl"
    for name in ("train.log", "events.rank2.jsonl", "logsteps.rank7.jsonl", "events.rank0.jsonl", "acks.jsonl",
                 "events.rankx.jsonl", "run.json"):
        (tmp_path / name).write_text("")
    assert rf.attempt_files(tmp_path) == ["train.log", "run.json", "events.rank2.jsonl", "logsteps.rank7.jsonl"]
    assert rf.attempt_files(tmp_path / "missing") == []
    (tmp_path / "s").write_bytes(b"12345")
    assert rf.size_at_most(tmp_path / "s", 5) and not rf.size_at_most(tmp_path / "s", 4)
    assert rf.size_at_most(tmp_path / "missing", 0)
    assert rf.read_push_urls(tmp_path) == []
    (tmp_path / rf.PUSH_URLS_JSON).write_text(json.dumps({"urls": ["ntfy://t/x", 5, None, "json://h"]}))
    assert rf.read_push_urls(tmp_path) == ["ntfy://t/x", "json://h"]
    (tmp_path / rf.PUSH_URLS_JSON).write_text(json.dumps({"urls": "ntfy://t/x"}))
    assert rf.read_push_urls(tmp_path) == []


def test_a_views_text_shows_every_control_character_and_keeps_styles():
    from rich.text import Text

    from stepwatch.tui.safe import SafeWriter, safe_text, visible

    assert visible("a\x1b[2Jb\x07\x00\x7f\x9b\u202e\tc") == "a\u241b[2Jb\u2407\u2400\u2421\ufffd\ufffd\tc"
    assert visible("1\n2\r3") == "1\u240a2\u240d3" and visible("1\n2\r3", newlines=True) == "1\n2\u240d3"
    assert visible(42) == "42" and visible("\x1f \x20 \x80 \u2069 \u2066") == "\u241f \x20 \ufffd \ufffd \ufffd"
    t = safe_text("[red]x[/red]\x1b", "bold")
    assert t.plain == "[red]x[/red]\u241b" and str(t.style) == "bold" and t.spans == []  # never markup
    styled = Text.assemble(("ab\x1b", "red"), "cd")
    out = safe_text(styled)
    assert out.plain == "ab\u241bcd" and [(s.start, s.end, str(s.style)) for s in out.spans] == [(0, 3, "red")]
    cut = safe_text(Text("a\x1bb", overflow="ellipsis", no_wrap=True, justify="right", tab_size=2, end=""))
    assert (cut.plain, cut.overflow, cut.no_wrap, cut.justify, cut.tab_size, cut.end) == (
        "a\u241bb", "ellipsis", True, "right", 2, "")  # made visible, every other attribute kept
    with pytest.raises(TypeError):
        visible("x", True)  # newlines is keyword-only
    with pytest.raises(TypeError):
        safe_text("x", "", True)
    clean = Text("fine", style="dim")
    assert safe_text(clean).plain == "fine" and safe_text(clean) is not clean and str(safe_text(clean).style) == "dim"
    assert safe_text(Text("a\nb"), newlines=True).plain == "a\nb" and safe_text(Text("a\nb")).plain == "a\u240ab"

    class Sink:
        def __init__(self):
            self.got = []

        def write(self, s):
            self.got.append(s)

        def flush(self):
            self.got.append("<flush>")

    sink = Sink()
    w = SafeWriter(sink)
    assert w.write("a\x1b]52;c;x\x07\n") == len("a\x1b]52;c;x\x07\n") and sink.got == ["a\u241b]52;c;x\u2407\n"]
    w.flush()
    assert sink.got[-1] == "<flush>"


@pytest.mark.system
def test_the_headless_commands_start_without_rich():
    import subprocess
    import sys

    code = "import sys, stepwatch.tui.safe as s; s.visible('x'); print('rich' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stdout + r.stderr


def test_modes_under_a_group_writable_umask_and_a_failed_replace_leaves_no_temp_file(tmp_path: Path):
    old = os.umask(0o002)
    try:
        rf.write_json_atomic(tmp_path / "a.json", {"a": 1})
        fd = rf.open_append(tmp_path / "b.jsonl")
        os.close(fd)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644  # never the group's to write (issue 43)
    assert stat.S_IMODE((tmp_path / "b.jsonl").stat().st_mode) == 0o644
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("")  # a non-empty directory where the file should go
    with pytest.raises(OSError):
        rf.write_bytes_atomic(tmp_path / "taken", b"data")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.jsonl", "taken"]  # the temp file removed
    small = tmp_path / "small"
    small.write_bytes(b"12")
    assert rf.size_at_most(small, 10) and rf.SCHEMA_VERSION == 1  # the files' "v"


def test_a_root_file_read_for_another_owner_is_refused(tmp_path: Path):
    if os.geteuid() != 0:
        pytest.fail("this test needs root: it reads root's file on behalf of uid 65534")
    f = tmp_path / "run.json"
    f.write_text("{}")  # root's
    assert rf.open_regular(f, 65534) is None and rf.read_json(f, 65534) is None


def test_a_field_shown_on_one_line_never_breaks_it():
    """tui/safe.py one_line: LF, CR and the Unicode line / paragraph separators are shown, never
    followed (a version string "2.4\\nALERT ..." read from events.jsonl would print a fake line); the
    length stays, so styles stay on their characters. safe_text without ``newlines`` is one line too."""
    from rich.text import Text

    from stepwatch.tui.safe import one_line, safe_text

    hostile = "2.4\nALERT [stall] fake\r\n\u2028x\u2029y\x1b[2J"
    shown = one_line(hostile)
    assert shown == "2.4\u240aALERT [stall] fake\u240d\u240a\u2424x\u2424y\u241b[2J" and len(shown) == len(hostile)
    assert len(shown.splitlines()) == 1 and one_line(7) == "7" and one_line("\tok") == "\tok"
    styled = safe_text(Text.assemble(("a\u2028", "red"), "b\nc"))
    assert styled.plain == "a\u2424b\u240ac" and [(s.start, s.end) for s in styled.spans] == [(0, 2)]
    assert safe_text("x\u2028y").plain == "x\u2424y" and safe_text("x\ny", newlines=True).plain == "x\ny"


def test_a_panels_line_and_a_gpu_row_stay_one_line(monkeypatch):
    """The run screen's panels: a version or backend read from events.jsonl, a GPU name read from
    gpu.jsonl, never start a line of their own (Panel._set shows one line unless asked for lines; the
    GPU panel's rows are one line each)."""
    from stepwatch.monitors.gpu.reading import status_row
    from stepwatch.monitors.snapshot.model import null_snapshot
    from stepwatch.tui.widgets.dynamo import DynamoPanel
    from stepwatch.tui.widgets.gpu import device_line

    shown: dict[str, str] = {}

    class Child:
        def __init__(self, selector: str):
            self.selector = selector

        def update(self, text) -> None:
            shown[self.selector] = text.plain

    panel = DynamoPanel()
    monkeypatch.setattr(panel, "query_one", lambda selector, *_: Child(selector))  # no app: its drawing, caught
    snap = null_snapshot()
    snap["versions"] = {"python": "3.11", "torch": "2.4\nALERT fake", "transformers": "4.4\u2028x"}
    snap["attn_implementation"] = {"requested": "sdpa\nGPU0 fake", "resolved": "sdpa"}
    panel.show(snap)
    assert "torch 2.4\u240aALERT fake" in shown["#dyn-attn"] and "sdpa\u240aGPU0 fake" in shown["#dyn-attn"], shown
    assert all(len(v.splitlines()) == 1 for v in shown.values()), shown
    # a row as the snapshot makes it from a gpu.jsonl device (every key), with a hostile name and verdict
    device: Any = {**status_row({"index": 0, "name": "H100\nGPU1 NVIDIA fake"}, []), "verdict": "ok\rx"}
    row = device_line(device).plain
    assert row.startswith("GPU0 H100\u240aGPU1 NVIDIA fake") and len(row.splitlines()) == 1, row


# ----------------------------------------------------------------------------- the trust rule (issue 43)
def _record(path: Path, obj: dict[str, Any], mode: int = 0o644) -> Path:
    path.write_text(json.dumps(obj))
    os.chmod(path, mode)
    return path


def test_a_file_read_to_decide_is_believed_only_when_no_one_else_can_have_written_it(tmp_path: Path, capsys):
    """ssh's rule (runfiles.trust_problem): the owner's, writable by no group or other, one link. A view's plain
    read_json still reads what it can; a reader that acts (``private=True``) reads it as absent and says so once."""
    f = _record(tmp_path / "stop.json", {"grace_s": 1e6})
    assert rf.trust_problem(f.stat(), "f") is None  # positive control: the owner's 0644
    assert rf.read_json(f, private=True) == {"grace_s": 1e6}
    os.chmod(f, 0o664)
    assert "writable by group" in (rf.trust_problem(f.stat(), "f") or "")
    assert rf.read_json(f) == {"grace_s": 1e6}  # a view shows it
    capsys.readouterr()
    assert rf.read_json(f, private=True) is None and rf.read_json(f, os.geteuid(), private=True) is None
    said = capsys.readouterr().err
    assert said.count(f"not trusting {f}: {f} is writable by group") == 1, said  # once, naming the path and why
    os.chmod(f, 0o646)
    assert "writable by every user" in (rf.trust_problem(f.stat(), "f") or "")
    os.chmod(f, 0o644)
    os.link(f, tmp_path / "other-name")
    assert "2 hard links" in (rf.trust_problem(f.stat(), "f") or "") and rf.read_json(f, private=True) is None
    os.unlink(tmp_path / "other-name")
    assert rf.read_json(f, 65534, private=True) is None  # another owner asked for than the file's
    assert "belongs to uid" in (rf.trust_problem(f.stat(), "f", 65534) or "")


def test_appending_creates_0644_and_never_appends_to_a_file_planted_or_linked(tmp_path: Path, capsys):
    ok = tmp_path / "train.log"
    old = os.umask(0o002)
    try:
        rf.append_bytes(ok, b"a\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE(ok.stat().st_mode) == 0o644  # positive control: created, whatever the umask
    rf.append_bytes(ok, b"b\n")
    assert ok.read_bytes() == b"a\nb\n"
    planted = tmp_path / "alerts.jsonl"
    planted.write_text("")
    _owned_by_nobody(planted)
    with pytest.raises(PermissionError, match="belongs to uid 65534"):
        rf.append_bytes(planted, b"x\n")
    assert planted.read_text() == ""  # the owner's records never go into a member's file
    os.link(ok, tmp_path / "second")
    with pytest.raises(PermissionError, match="2 hard links"):
        rf.append_bytes(ok, b"c\n")
    os.unlink(tmp_path / "second")
    os.chmod(ok, 0o664)  # the owner's, opened to the group: appended to, said, its mode left as the owner set it
    capsys.readouterr()
    rf.append_bytes(ok, b"c\n")
    assert ok.read_bytes() == b"a\nb\nc\n" and stat.S_IMODE(ok.stat().st_mode) == 0o664
    assert "appended to all the same" in capsys.readouterr().err
    acks = tmp_path / "acks.jsonl"  # a view's shared notes: any user's file, the umask's mode
    acks.write_text("")
    _owned_by_nobody(acks)
    rf.append_bytes(acks, b"ack\n", mode=None)
    assert acks.read_text() == "ack\n"


def test_an_acting_reader_of_alerts_or_procs_goes_as_if_the_file_were_absent(tmp_path: Path):
    """alerts.jsonl read for the owner's watchers (EventReader ``trust_uid``), procs.json for whom to signal
    (recorded_processes with an owner): a file the group may write names nothing, and one that was once group-
    writable is not believed later either (a line a member appended meanwhile)."""
    from stepwatch.monitors.proctree import recorded_processes
    from stepwatch.monitors.readers.jsonl import EventReader

    alerts = tmp_path / "alerts.jsonl"
    alerts.write_text('{"kind":"alert","id":"a1-watchdog-end"}\n')
    os.chmod(alerts, 0o644)
    assert len(EventReader(alerts, trust_uid=os.geteuid()).read_new()) == 1  # positive control
    reader = EventReader(alerts, trust_uid=os.geteuid())
    os.chmod(alerts, 0o664)
    assert reader.read_new() == [] and reader.untrusted
    assert len(EventReader(alerts).read_new()) == 1  # a view shows it
    os.chmod(alerts, 0o644)
    assert reader.read_new() == []  # once untrusted, this file stays so
    procs = _record(tmp_path / "procs.json", {"processes": [{"pid": os.getpid(), "create_time": 1.0}]})
    assert [p.ref.pid for p in recorded_processes(procs, os.geteuid())] == [os.getpid()]  # positive control
    os.chmod(procs, 0o664)
    assert recorded_processes(procs, os.geteuid()) == [] and len(recorded_processes(procs)) == 1


def test_a_stop_record_the_group_may_write_neither_holds_a_stop_nor_sets_its_grace(tmp_path: Path):
    from stepwatch.launcher.escalation import DEFAULT_GRACE_S, own_stop_record, stop_grace_s

    _record(tmp_path / "stop.json", {"grace_s": 2.0, "ended_by": None})
    assert stop_grace_s(tmp_path) == 2.0 and own_stop_record(tmp_path) is not None  # positive control
    _record(tmp_path / "stop.json", {"grace_s": 1e6, "ended_by": None}, mode=0o664)
    assert stop_grace_s(tmp_path) == DEFAULT_GRACE_S and own_stop_record(tmp_path) is None
