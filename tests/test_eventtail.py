"""EventReader: incremental events.jsonl reading, half-written lines, corruption, truncation, rotation."""

from __future__ import annotations

import json
import os
from pathlib import Path

from stepwatch.monitors.readers.jsonl import EventReader
from stepwatch.monitors.runfiles import EVENTS_JSONL, append_jsonl


def step_event(i: int) -> dict:
    return {"v": 1, "kind": "step", "t": 1780000000.0 + i, "step": i, "rank": 0, "dt": 19.48,
            "step_begin": 1780000000.2 + i, "step_end": 1780000019.6 + i, "tokens": 26048,
            "padded_tokens": 26112, "flags": []}


def write_events(path: Path, start: int, stop: int) -> None:
    with open(path, "a") as f:
        for i in range(start, stop):
            f.write(json.dumps(step_event(i), separators=(",", ":")) + "\n")


def test_reads_100k_lines_from_the_start_then_only_new(tmp_path: Path) -> None:
    p = tmp_path / EVENTS_JSONL
    write_events(p, 0, 100_000)
    r = EventReader(p)
    ev = r.read_new()
    assert len(ev) == 100_000
    assert [e["step"] for e in ev[:3]] == [0, 1, 2] and ev[-1]["step"] == 99_999
    assert ev[12345] == step_event(12345)
    assert r.corrupt_lines == 0 and r.offset == p.stat().st_size
    assert r.read_new() == []
    append_jsonl(p, {"v": 1, "kind": "run_end"})
    assert r.read_new() == [{"v": 1, "kind": "run_end"}]


def test_half_written_last_line_waits(tmp_path: Path) -> None:
    p = tmp_path / EVENTS_JSONL
    p.write_bytes(b'{"a":1}\n{"b":')
    r = EventReader(p)
    assert r.read_new() == [{"a": 1}]
    assert r.read_new() == []
    with open(p, "ab") as f:
        f.write(b"2}\n")
    assert r.read_new() == [{"b": 2}]
    assert r.corrupt_lines == 0


def test_corrupt_lines_are_counted_and_skipped(tmp_path: Path) -> None:
    p = tmp_path / EVENTS_JSONL
    p.write_bytes(
        b'{"a":1}\n'
        b"not json\n"
        b"[1,2]\n"
        b'{"v":1,"ki{"v":1,"kind":"step"}\n'  # a crash mid-write, then the next line appended
        b"\xff\xfe\n"
        b"\n"
        b'{"a":1}, {"b":2}\n'  # two values on one line: not one object
        b'{"b":2}\n'
    )
    r = EventReader(p)
    assert r.read_new() == [{"a": 1}, {"b": 2}]
    assert r.corrupt_lines == 5


def test_truncation_restarts_and_says_so(tmp_path: Path) -> None:
    p = tmp_path / EVENTS_JSONL
    write_events(p, 0, 10)
    r = EventReader(p)
    assert len(r.read_new()) == 10 and not r.restarted
    with open(p, "w") as f:
        f.write(json.dumps(step_event(100)) + "\n")
    ev = r.read_new()
    assert [e["step"] for e in ev] == [100]
    assert r.restarted and r.restarts == 1 and r.generation == 1
    assert r.last_restart is not None and r.last_restart.reason == "truncated"
    assert r.read_new() == [] and not r.restarted


def test_replacement_by_rename_restarts_on_the_new_file(tmp_path: Path) -> None:
    p = tmp_path / EVENTS_JSONL
    write_events(p, 0, 5)
    r = EventReader(p)
    assert len(r.read_new()) == 5
    os.rename(p, tmp_path / "events.20260826T101500Z.jsonl")
    write_events(p, 0, 20)  # larger than the old one: only the inode tells
    ev = r.read_new()
    assert [e["step"] for e in ev] == list(range(20))
    assert r.restarted and r.last_restart is not None and r.last_restart.reason == "replaced"
    assert r.last_restart.old_offset > 0 and r.generation == 1


def test_missing_file_then_appears(tmp_path: Path) -> None:
    p = tmp_path / EVENTS_JSONL
    r = EventReader(p)
    assert r.read_new() == [] and not r.exists
    write_events(p, 0, 2)
    assert [e["step"] for e in r.read_new()] == [0, 1] and r.exists


def test_over_long_line_is_skipped_as_corrupt_with_bounded_buffer(tmp_path: Path) -> None:
    p = tmp_path / EVENTS_JSONL
    r = EventReader(p, max_line_bytes=1000)
    p.write_bytes(b'{"a":1}\n' + b"x" * 5000)
    assert r.read_new() == [{"a": 1}]
    assert len(r._carry) <= 1000 and r.corrupt_lines == 1
    with open(p, "ab") as f:
        f.write(b"x" * 5000 + b'\n{"b":2}\n')
    assert r.read_new() == [{"b": 2}]
    assert r.corrupt_lines == 1


def test_chunk_boundaries_do_not_split_events(tmp_path: Path) -> None:
    """Lines straddling the 1 MiB read chunks come out whole."""
    p = tmp_path / EVENTS_JSONL
    payload = "z" * 997
    with open(p, "w") as f:
        for i in range(10_000):  # ~10 MB
            f.write(json.dumps({"i": i, "p": payload}) + "\n")
    ev = EventReader(p).read_new()
    assert [e["i"] for e in ev] == list(range(10_000))


def test_a_line_holding_two_objects_is_corrupt_even_when_the_batch_parses(tmp_path: Path) -> None:
    """The whole-batch fast path must not turn one bad line into two events."""
    p = tmp_path / EVENTS_JSONL
    p.write_bytes(b'{"a":1}\n{"b":2}, {"c":3}\n{"d":4}\n')
    r = EventReader(p)
    assert r.read_new() == [{"a": 1}, {"d": 4}]
    assert r.corrupt_lines == 1


def _json_reading(raw: bytes) -> list:
    """What the standard library reads from each line (the definition), corrupt lines dropped."""
    out = []
    for line in raw.split(b"\n"):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if type(obj) is dict:
            out.append(obj)
    return out


def _same_values(a, b) -> bool:
    """Equal, with the same types all the way down (an int must not come back a float), NaN == NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_values(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_values(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return repr(a) == repr(b)
    return a == b


def test_every_line_reads_as_the_standard_library_reads_it(tmp_path: Path) -> None:
    """orjson parses the chunks; what it refuses or reads differently (NaN / Infinity, 1e400, a lone
    surrogate, a BOM, an integer beyond 64 bits, which it turns into a float) must come out as
    ``json`` reads it, whichever chunk the line falls in."""
    import random

    rng = random.Random(3)
    specials = [b'{"loss":NaN}', b'{"loss":-Infinity,"x":1}', b'{"v":1e400}', b'{"s":"\\ud800"}',
                b'\xef\xbb\xbf{"bom":1}', b'{"big":123456789012345678901234567890}',
                b'{"neg":-9223372036854775809}', b'{"u64":18446744073709551615}', b'{"z":-0.0,"e":5e-324}',
                b'{"nested":{"a":[1,2.5,"\\u00e9",null,true]}}', b"[1,2]", b"{not json}", b'"str"', b"\xff\xfe"]
    lines = []
    for i in range(12_000):  # ~1.7 MB: two chunks; ~60 specials, as many as before
        if rng.random() < 0.005:
            lines.append(rng.choice(specials))
        else:
            ev = step_event(i)
            ev["dt"] = rng.choice([rng.lognormvariate(0, 1), rng.random() * 1e-9, float(rng.randint(0, 10**6)),
                                   rng.uniform(-1e300, 1e300)])
            ev["tokens"] = rng.choice([None, rng.randint(0, 2**63 - 1), -rng.randint(0, 2**63)])
            lines.append(json.dumps(ev, separators=(",", ":")).encode())
    raw = b"\n".join(lines) + b"\n"
    p = tmp_path / EVENTS_JSONL
    p.write_bytes(raw)
    r = EventReader(p)
    got = r.read_new()
    want = _json_reading(raw)
    assert len(got) == len(want) and all(_same_values(x, y) for x, y in zip(got, want))
    assert r.corrupt_lines == sum(1 for ln in lines if ln in (b"[1,2]", b"{not json}", b'"str"', b"\xff\xfe"))
    assert any(type(e.get("big")) is int for e in got)  # the specials were drawn


def test_iter_new_hands_the_backlog_over_in_chunks_and_resumes(tmp_path: Path) -> None:
    p = tmp_path / EVENTS_JSONL
    write_events(p, 0, 20_000)  # ~4 MB: several chunks
    r = EventReader(p)
    it = r.iter_new()
    first = next(it)
    assert 0 < len(first) < 20_000 and first[0]["step"] == 0
    del it  # the caller stops early: the next read goes on from the chunk after
    rest = r.read_new()
    assert [e["step"] for e in first + rest] == list(range(20_000))
    write_events(p, 20_000, 20_005)
    assert [len(b) for b in r.iter_new()] == [5] and list(r.iter_new()) == []


def test_corrupt_lines_never_join_into_events_and_deep_nesting_is_not_fatal(tmp_path: Path) -> None:
    """Two halves of a broken line pair must not read as events (as they would joined into one JSON
    array); a line nested 100,000 deep (json's RecursionError) is corrupt, not a crash."""
    p = tmp_path / EVENTS_JSONL
    deep = b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    p.write_bytes(b'{"a":1},{"b":2\n"c":3}\n{"ok":1}\n{"a":1},{"b":2}\n[1\n2]\n' + deep + b'\n{"ok":2}\n')
    r = EventReader(p)
    assert r.read_new() == [{"ok": 1}, {"ok": 2}]
    assert r.corrupt_lines == 6


def test_how_a_line_reads_never_depends_on_where_the_reads_split_the_file(tmp_path: Path) -> None:
    """A saved reader state may stop anywhere: a line over the limit is corrupt wherever the 1 MiB
    reads cut it, and a line is parsed by json only for its own long digit run, not a neighbour's."""
    limit = 3000
    over = b'{"kind": "log", "pad": "' + b"x" * 3200 + b'"}\n'
    deep = b'{"kind": "log", "deep": ' + b"[" * 1010 + b"]" * 1010 + b"}\n"  # orjson reads it, json cannot
    big = b'{"kind": "log", "n": 123456789012345678901234567890}\n'
    seen = set()
    for pad in (10, 1500, 2900, 3100, 3300, 5000, 6000, 9000):
        head = b'{"kind": "x"}\n' * ((1024 * 1024 - pad) // 14)
        p = tmp_path / f"e{pad}.jsonl"
        p.write_bytes(head + over + deep + big + b'{"kind": "end"}\n')
        r = EventReader(p, max_line_bytes=limit)
        evs = r.read_new()
        r.close()
        tail = [e["kind"] + ("-deep" if "deep" in e else "") + (f"-{e['n']}" if "n" in e else "") for e in evs[-3:]]
        seen.add((r.corrupt_lines, tuple(tail)))
    assert seen == {(1, ("log-deep", "log-123456789012345678901234567890", "end"))}, seen
