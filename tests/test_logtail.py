"""LogFollower (train.log tailer) and ChangeNotifier, on real captures and crafted files.

Real captures live in ``tests/fixtures/real`` (see its README.md). Tests that wait, wait
on a condition with a deadline; none asserts a duration.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

from conftest import FIXTURES_REAL
from stepwatch.monitors.readers.changes import ChangeNotifier, follow
from stepwatch.monitors.readers.textlog import LogFollower, Segment
from stepwatch.monitors.parsers.hf_progress import ProgressTracker
from stepwatch.monitors.runfiles import TRAIN_LOG

FIXTURES = FIXTURES_REAL
REAL_LOGS = [
    "hf_trainer_plain.log",
    "hf_trainer_tty.log",
    "hf_trainer_slow.log",
    "hf_trainer_compile.log",
    "hf_trainer_printer_callback.log",
    "dynamo_recompiles.log",
    "dynamo_limit_default.log",
]


def wait_for(cond, timeout_s: float = 10.0, interval_s: float = 0.01) -> bool:
    """Poll ``cond()`` until true or the deadline passes; returns the last value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(interval_s)
    return bool(cond())


def texts(segs: list[Segment]) -> list[str]:
    return [s.text for s in segs if not s.is_note]


def lines_of(segs: list[Segment]) -> list[str]:
    return [s.text for s in segs if not s.is_note and s.end != "\r"]


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


# --------------------------------------------------------------------------- real captures


@pytest.mark.parametrize("name", REAL_LOGS)
def test_real_capture_segments_reassemble_the_file(name: str) -> None:
    """Every byte comes back: text + terminator of each segment rebuild the file (\\r\\n -> \\n)."""
    raw = (FIXTURES / name).read_bytes()
    f = LogFollower(FIXTURES / name, from_start=True)
    segs = [s for s in f.poll() if not s.is_note]
    rebuilt = "".join(s.text + s.end for s in segs)
    if f.partial_segment is not None:
        rebuilt += f.partial_segment.text
    assert rebuilt == raw.decode("utf-8").replace("\r\n", "\n")
    n_newlines = raw.count(b"\n")
    assert sum(1 for s in segs if s.end == "\n") == n_newlines
    assert sum(1 for s in segs if s.end == "\r") == raw.count(b"\r") - raw.count(b"\r\n")
    assert all(s.backfill for s in segs)
    assert f.bytes_read == len(raw)


def test_real_plain_log_lines_and_steps() -> None:
    f = LogFollower(FIXTURES / "hf_trainer_plain.log", from_start=True)
    segs = f.poll()
    # 9 newline-ended lines: 7 log dicts (6 + summary), the final bar, TrainOutput
    assert len(f.last_lines) == 9
    assert f.last_lines[0] == "{'loss': '5.558', 'grad_norm': '0.6336', 'learning_rate': '0.0009273', 'epoch': '0.1667'}"
    assert f.last_lines[-2] == "100%|██████████| 60/60 [00:00<00:00, 68.31it/s]"
    assert f.last_lines[-1].startswith("TrainOutput: TrainOutput(global_step=60,")
    assert f.current_partial is None
    t = ProgressTracker()
    steps = [a.step for s in segs for a in t.feed(s)]
    assert steps == [0, 6, 10, 13, 20, 21, 28, 30, 35, 40, 43, 50, 51, 59, 60]
    assert (t.global_step, t.total) == (60, 60)


def test_real_tty_log_crlf_are_newlines() -> None:
    f = LogFollower(FIXTURES / "hf_trainer_tty.log", from_start=True)
    segs = f.poll()
    assert f.last_lines[0].startswith("Script started on 2026-11-30")
    assert f.last_lines[-1].startswith("Script done on")
    # '\r\n' ended the dict lines: none of them is a '\r' segment followed by an empty line
    dict_segs = [s for s in segs if s.text.startswith("{'loss'")]
    assert len(dict_segs) == 6 and all(s.end == "\n" for s in dict_segs)
    t = ProgressTracker()
    for s in segs:
        t.feed(s)
    assert (t.global_step, t.total) == (60, 60)


def test_real_compile_log_glued_record_is_one_segment_after_the_bar() -> None:
    f = LogFollower(FIXTURES / "hf_trainer_compile.log", from_start=True)
    segs = f.poll()
    glued = [s for s in segs if "[__recompiles] Recompiling function" in s.text]
    assert len(glued) == 1
    assert glued[0].text.startswith("  2%|▎         | 1/40 [00:25<16:52, 25.96s/it]V1130 06:54:40.465000")
    assert glued[0].end == "\n"


# --------------------------------------------------------------------------- crafted files


def test_a_rank_prefix_glued_to_a_bar_frame_starts_a_line_of_its_own(tmp_path: Path) -> None:
    """torchrun --tee tails a rank's stdout and stderr apart: a dict line lands right after a bar frame that
    ended in \\r (tests/fixtures/real/torchrun_tee_dicts.log). The frame is read as a bar frame (\\r), the dict
    as its own line; a prefix at the start of a line, or after a space, stays where it is (the controls)."""
    log = tmp_path / TRAIN_LOG
    log.write_text("[default0]: 33%|███▎      | 10/30 [00:00<00:00, 47.25it/s][default0]:{'loss': '5.556'}\n"
                   "[rank0]:[default0]: plain\n" "said [default1]: as text\n")
    segs = [(s.text, s.end) for s in LogFollower(log, from_start=True).poll() if not s.is_note]
    assert segs == [("[default0]: 33%|███▎      | 10/30 [00:00<00:00, 47.25it/s]", "\r"),
                    ("[default0]:{'loss': '5.556'}", "\n"), ("[rank0]:[default0]: plain", "\n"),
                    ("said [default1]: as text", "\n")]


def test_partial_line_waits_and_is_exposed(tmp_path: Path) -> None:
    p = tmp_path / TRAIN_LOG
    p.write_bytes(b"")
    f = LogFollower(p)
    assert f.poll() == []
    append(p, b"hello")
    assert texts(f.poll()) == []
    assert f.current_partial == "hello"
    assert f.partial_segment is not None and f.partial_segment.end == ""
    append(p, b" world\nnext")
    segs = f.poll()
    assert [(s.text, s.end) for s in segs] == [("hello world", "\n")]
    assert list(f.last_lines) == ["hello world"]
    assert f.current_partial == "next"


def test_crlf_split_across_reads_is_one_newline(tmp_path: Path) -> None:
    p = tmp_path / TRAIN_LOG
    p.write_bytes(b"")
    f = LogFollower(p)
    f.poll()
    append(p, b"abc\r")
    assert f.poll() == []  # is a '\n' coming? wait
    append(p, b"\ndef\r")
    assert [(s.text, s.end) for s in f.poll()] == [("abc", "\n")]
    append(p, b"ghi\n")
    assert [(s.text, s.end) for s in f.poll()] == [("def", "\r"), ("ghi", "\n")]
    assert list(f.last_lines) == ["abc", "ghi"]


def test_cr_updates_overlay_like_a_terminal(tmp_path: Path) -> None:
    bar = " 10%|#  | 1/10 [00:01<00:09, 1.00s/it]"
    p = tmp_path / TRAIN_LOG
    p.write_bytes(f"\r{bar}\r      \r{{'loss': '1'}}\n".encode())
    f = LogFollower(p, from_start=True)
    segs = f.poll()
    assert [s.end for s in segs] == ["\r", "\r", "\r", "\n"]
    assert segs[1].is_progress and segs[1].text == bar and not segs[-1].is_progress
    # what a terminal shows: the dict written over the (partly erased) bar
    dict_text = "{'loss': '1'}"
    assert list(f.last_lines) == [dict_text + bar[len(dict_text):]]


def test_cr_only_3mb_without_newline(tmp_path: Path) -> None:
    """tqdm to a file for hours: 3 MB of '\\r' updates and not one newline."""
    p = tmp_path / TRAIN_LOG
    total = 40_000
    parts = []
    n = 0
    size = 0
    while size < 3_000_000:
        n += 1
        bar = f"\r {100 * n // total:3d}%|{'#' * (10 * n // total):<10}| {n}/{total} [00:{n % 60:02d}<00:00, 12.34it/s]"
        parts.append(bar)
        size += len(bar)
    p.write_text("".join(parts))
    assert b"\n" not in p.read_bytes() and p.stat().st_size >= 3_000_000
    last_bar = parts[-1][1:]

    # replay from the start: every update but the last is a '\r' segment; the last waits
    f = LogFollower(p, from_start=True)
    segs = f.poll()
    assert len(segs) == n  # the leading '\r' ends an empty first segment
    assert all(s.end == "\r" for s in segs)
    assert len(f.last_lines) == 0
    assert f.current_partial == last_bar
    t = ProgressTracker()
    for s in segs:
        t.feed(s)
    t.feed(f.partial_segment)
    assert t.global_step == n

    # attach with a small tail window: starts mid-file, still finds the latest bar
    g = LogFollower(p, tail_max_bytes=64 * 1024)
    gsegs = g.poll()
    assert g.bytes_read <= 64 * 1024
    assert all(s.end == "\r" for s in gsegs if not s.is_note)
    assert g.current_partial == last_bar
    t2 = ProgressTracker()
    for s in gsegs:
        t2.feed(s)
    t2.feed(g.partial_segment)
    assert t2.global_step == n


def test_attach_reads_only_the_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / TRAIN_LOG
    lines = [f"line {i:07d} " + "x" * 80 for i in range(200_000)]  # ~19 MB
    p.write_text("\n".join(lines) + "\npartial")
    read_total = 0
    real_pread = os.pread

    def counting_pread(fd: int, n: int, off: int) -> bytes:
        nonlocal read_total
        data = real_pread(fd, n, off)
        read_total += len(data)
        return data

    monkeypatch.setattr(os, "pread", counting_pread)
    f = LogFollower(p, keep_lines=200)
    segs = f.poll()
    assert list(f.last_lines) == lines[-200:]
    assert f.current_partial == "partial"
    assert lines_of(segs) == lines[-200:]
    assert all(s.backfill for s in segs if not s.is_note)
    # the tail was read backwards in 64 KiB blocks: far less than the 19 MB file
    assert read_total < 4 * 64 * 1024
    assert f.bytes_read < 64 * 1024
    # the attach time is not the last byte's time: that is the file's mtime
    assert f.last_byte_at == pytest.approx(p.stat().st_mtime)
    # then live appends are read and are not backfill
    monkeypatch.setattr(os, "pread", real_pread)
    append(p, b" done\nlive line\n")
    live = f.poll()
    assert [(s.text, s.backfill) for s in live] == [("partial done", False), ("live line", False)]


def test_attach_to_old_file_reports_its_mtime(tmp_path: Path) -> None:
    p = tmp_path / TRAIN_LOG
    p.write_text("a\nb\n")
    old = time.time() - 3600
    os.utime(p, (old, old))
    f = LogFollower(p)
    f.poll()
    assert f.last_byte_at == pytest.approx(old)
    assert f.last_byte_age_s is not None and f.last_byte_age_s >= 3000
    append(p, b"c\n")
    f.poll()
    assert f.last_byte_at > old + 3000


def test_a_live_bytes_age_is_on_the_monotonic_clock(tmp_path: Path, monkeypatch) -> None:
    """Once the follower saw a byte arrive, how long ago is timed on its monotonic clock: the wall
    clock stepping a day ahead (or a view whose clock is not the run's) does not age the log."""
    p = tmp_path / TRAIN_LOG
    p.write_text("a\n")
    f = LogFollower(p)
    f.poll()
    append(p, b"b\n")
    f.poll()
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 86400.0)
    age = f.last_byte_age_s
    assert age is not None and age < 60, age


def test_rotation_mid_follow_loses_no_line(tmp_path: Path) -> None:
    p = tmp_path / TRAIN_LOG
    with open(p, "w") as w:
        for i in range(50):
            w.write(f"old {i}\n")
    f = LogFollower(p, from_start=True)
    got = lines_of(f.poll())
    # more lines land in the old file after our last poll, plus an unterminated last line
    with open(p, "a") as w:
        for i in range(50, 100):
            w.write(f"old {i}\n")
        w.write("old tail")
    os.rename(p, tmp_path / "train.20260826T101500Z.log")
    with open(p, "w") as w:
        for i in range(30):
            w.write(f"new {i}\n")
    segs = f.poll()
    got += lines_of(segs)
    assert got == [f"old {i}" for i in range(100)] + ["old tail"] + [f"new {i}" for i in range(30)]
    notes = [s.text for s in segs if s.is_note]
    assert len(notes) == 1 and "replaced" in notes[0]
    # the note sits between the old file's last line and the new file's first
    order = [s.text for s in segs]
    assert order.index(notes[0]) == order.index("old tail") + 1
    assert f.rotations == 1 and f.state == "following"
    append(p, b"new 30\n")
    assert lines_of(f.poll()) == ["new 30"]


def test_rotation_then_writer_keeps_old_fd_is_drained(tmp_path: Path) -> None:
    """A writer that still holds the renamed file: its last bytes are drained before the switch."""
    p = tmp_path / TRAIN_LOG
    w = open(p, "w", buffering=1)
    w.write("a\n")
    f = LogFollower(p, from_start=True)
    assert lines_of(f.poll()) == ["a"]
    os.rename(p, tmp_path / "train.1.log")
    w.write("b\n")  # lands in the renamed file
    segs = f.poll()  # the path is missing now: keep draining the old fd
    assert lines_of(segs) == ["b"] and f.state == "missing"
    w.write("c\n")
    w.close()
    p.write_text("d\n")
    assert lines_of(f.poll()) == ["c", "d"]


def test_truncation_restarts_from_zero(tmp_path: Path) -> None:
    p = tmp_path / TRAIN_LOG
    p.write_text("".join(f"line {i}\n" for i in range(100)))
    f = LogFollower(p, from_start=True)
    assert len(lines_of(f.poll())) == 100
    with open(p, "w") as w:  # O_TRUNC: same inode, size 0
        w.write("fresh 0\nfresh 1\n")
    segs = f.poll()
    assert lines_of(segs) == ["fresh 0", "fresh 1"]
    assert any(s.is_note and "truncated" in s.text for s in segs)
    assert f.truncations == 1


def test_invalid_utf8_is_replaced_not_fatal(tmp_path: Path) -> None:
    p = tmp_path / TRAIN_LOG
    p.write_bytes(b"ok \xff\xfe bad\n\xc3\x28 also\nfine \xe2\x82\xac\n")
    f = LogFollower(p, from_start=True)
    assert lines_of(f.poll()) == ["ok \ufffd\ufffd bad", "\ufffd( also", "fine €"]


def test_ten_megabyte_line_is_cut_with_bounded_memory(tmp_path: Path) -> None:
    p = tmp_path / TRAIN_LOG
    p.write_bytes(b"before\n")
    cap = 4096
    f = LogFollower(p, max_line_bytes=cap, from_start=True)
    assert lines_of(f.poll()) == ["before"]
    chunk = b"y" * (1024 * 1024)
    for _ in range(5):
        append(p, chunk)
    assert f.poll() == []
    part = f.partial_segment
    assert part is not None and part.cut and len(part.text) == cap and part.nbytes == 5 * len(chunk)
    assert len(f._cur) <= cap  # the follower never holds more than the cap
    for _ in range(5):
        append(p, chunk)
    append(p, b"\nafter\n")
    segs = [s for s in f.poll() if not s.is_note]
    assert [s.text for s in segs][1:] == ["after"]
    big = segs[0]
    assert big.cut and big.nbytes == 10 * len(chunk) and big.text == "y" * cap
    assert f.last_lines[-2].startswith("y" * cap) and f.last_lines[-2].endswith(f"[... cut: {10 * len(chunk)} bytes]")
    assert f.last_lines[-1] == "after"


def test_long_line_read_in_one_chunk_is_cut(tmp_path: Path) -> None:
    p = tmp_path / TRAIN_LOG
    p.write_bytes(b"z" * 200_000 + b"\r" + b"w" * 100_000 + b"\nok\n")
    f = LogFollower(p, max_line_bytes=1000, from_start=True)
    segs = f.poll()
    assert [(len(s.text), s.end, s.cut, s.nbytes) for s in segs] == [
        (1000, "\r", True, 200_000), (1000, "\n", True, 100_000), (2, "\n", False, 2),
    ]
    assert f.last_lines[0] == "w" * 1000 + " [... cut: 100000 bytes]"


def test_deletion_then_recreation(tmp_path: Path) -> None:
    p = tmp_path / TRAIN_LOG
    p.write_text("one\ntwo\n")
    f = LogFollower(p)
    f.poll()
    assert list(f.last_lines) == ["one", "two"]
    p.unlink()
    segs = f.poll()
    assert f.state == "missing"
    assert any(s.is_note and "missing" in s.text for s in segs)
    assert list(f.last_lines) == ["one", "two"]  # kept
    assert f.poll() == []  # one note only
    p.write_text("three\n")
    assert lines_of(f.poll()) == ["three"]
    assert f.state == "following"
    assert list(f.last_lines) == ["one", "two", "three"]


def test_waits_for_a_file_that_does_not_exist_yet(tmp_path: Path) -> None:
    p = tmp_path / TRAIN_LOG
    f = LogFollower(p)
    assert f.poll() == [] and f.state == "waiting"
    p.write_text("first\n")
    # a file that appears after we started is read from its start, not its tail
    assert lines_of(f.poll()) == ["first"]


def test_poll_budget_sets_behind_and_continues(tmp_path: Path) -> None:
    p = tmp_path / TRAIN_LOG
    p.write_text("")
    f = LogFollower(p, max_bytes_per_poll=1000)
    f.poll()
    data = "".join(f"{i:09d}\n" for i in range(500))  # 5000 bytes
    append(p, data.encode())
    got = lines_of(f.poll())
    assert f.behind
    while f.behind:
        got += lines_of(f.poll())
    assert got == [f"{i:09d}" for i in range(500)]


# --------------------------------------------------------------------------- change notice


def _run_follow(follower: LogFollower, notifier: ChangeNotifier, sink: list[Segment], stop: threading.Event):
    def run() -> None:
        for batch in follow(follower, stop_event=stop, notifier=notifier):
            sink.extend(batch)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


class RecordingNotifier(ChangeNotifier):
    """A ChangeNotifier that remembers every notice it yielded."""

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        self.seen: list = []

    def __iter__(self):
        for n in super().__iter__():
            self.seen.append(n)
            yield n

    def watchfiles_notices_for(self, name: str) -> int:
        return sum(1 for n in list(self.seen) if n.source == "watchfiles" and any(x.endswith(name) for x in n.paths))


def test_change_notice_wakes_on_write_and_after_rotation(tmp_path: Path) -> None:
    p = tmp_path / TRAIN_LOG
    p.write_text("start\n")
    stop = threading.Event()
    notifier = RecordingNotifier(tmp_path, names={TRAIN_LOG}, stop_event=stop, tick_s=1.0)
    sink: list[Segment] = []
    th = _run_follow(LogFollower(p), notifier, sink, stop)
    try:
        assert wait_for(lambda: "start" in texts(sink))
        # the watcher may not be armed yet when we write: keep writing until a notice names the file
        i = 0
        while notifier.watchfiles_notices_for(TRAIN_LOG) == 0 and i < 50:
            append(p, f"written {i}\n".encode())
            i += 1
            wait_for(lambda: notifier.watchfiles_notices_for(TRAIN_LOG) > 0, timeout_s=0.2)
        assert notifier.watchfiles_notices_for(TRAIN_LOG) > 0
        assert wait_for(lambda: f"written {i - 1}" in texts(sink))
        # rotate: the directory watch keeps working for the new file (a watch on the file would not)
        os.rename(p, tmp_path / "train.1.log")
        p.write_text("after rotation\n")
        assert wait_for(lambda: "after rotation" in texts(sink))
        before = notifier.watchfiles_notices_for(TRAIN_LOG)
        append(p, b"second after\n")
        assert wait_for(lambda: "second after" in texts(sink))
        assert wait_for(lambda: notifier.watchfiles_notices_for(TRAIN_LOG) > before)
        assert notifier.mode == "watchfiles" and notifier.fallback_reason is None
    finally:
        stop.set()
        th.join(timeout=10)
    assert not th.is_alive()
    assert texts(sink)[: i + 1] == ["start"] + [f"written {k}" for k in range(i)]


def test_change_notice_falls_back_to_polling_with_one_notice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import watchfiles

    def broken_watch(*a, **k):
        raise OSError(28, "OS file watch limit reached")
        yield  # pragma: no cover

    monkeypatch.setattr(watchfiles, "watch", broken_watch)
    p = tmp_path / TRAIN_LOG
    p.write_text("")
    messages: list[str] = []
    stop = threading.Event()
    notifier = ChangeNotifier(tmp_path, stop_event=stop, tick_s=0.05, on_notice=messages.append)
    sink: list[Segment] = []
    th = _run_follow(LogFollower(p), notifier, sink, stop)
    try:
        assert wait_for(lambda: notifier.mode == "polling")
        append(p, b"seen by polling\n")
        assert wait_for(lambda: "seen by polling" in texts(sink))
        append(p, b"again\n")
        assert wait_for(lambda: "again" in texts(sink))
    finally:
        stop.set()
        th.join(timeout=10)
    assert not th.is_alive()
    assert len(messages) == 1 and "watch limit" in messages[0] and "polling every 0.05 s" in messages[0]
    assert notifier.fallback_reason == messages[0]


def test_tick_is_capped_at_one_second() -> None:
    assert ChangeNotifier(".", tick_s=30).tick_s == 1.0


async def test_async_change_notice(tmp_path: Path) -> None:
    p = tmp_path / TRAIN_LOG
    p.write_text("")
    f = LogFollower(p)
    f.poll()
    stop = asyncio.Event()
    notifier = ChangeNotifier(tmp_path, names={TRAIN_LOG}, stop_event=stop)
    got: list[str] = []
    sources: list[str] = []

    async def consume() -> None:
        async for n in notifier.aiter():
            sources.append(n.source)
            got.extend(texts(f.poll()))
            if "async line" in got:
                stop.set()

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.2)  # give the watcher thread a moment; a tick would still catch the write
    append(p, b"async line\n")
    await asyncio.wait_for(task, timeout=10)
    assert "async line" in got
    assert notifier.mode == "watchfiles"


def test_a_fifo_in_place_of_train_log_is_said_not_followed(tmp_path: Path) -> None:
    """No writer on the FIFO: a blocking open would hang the view for ever."""
    path = tmp_path / TRAIN_LOG
    os.mkfifo(path)
    done = threading.Event()
    got: list[Segment] = []
    f = LogFollower(path)
    threading.Thread(target=lambda: (got.extend(f.poll()), done.set()), daemon=True).start()
    assert done.wait(20), "LogFollower hung on a FIFO"
    assert f.state == "unreadable" and any("not a regular file" in s.text for s in got), got
