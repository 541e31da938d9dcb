"""monitors/fold/records.py: a read of events.jsonl made of the emitter's step, log and phase records is decoded
into typed records, and folds to exactly what its dicts fold to; a read with anything the dict way could read differently is
left to the dict way. Each line below shares one read with the emitter's ordinary records."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import stepwatch.monitors.fold.events as ef
from stepwatch.monitors.fold.events import EventsFold
import stepwatch.monitors.fold.records as records
from stepwatch.monitors.fold.records import DecodedRead, ReadDecoder, decode_read
from stepwatch.monitors.fold.savedstate import encode
from stepwatch.monitors.readers.jsonl import EventReader

T0 = 1_780_000_000.0


def _ordinary() -> list[bytes]:
    out, t = [], T0
    for s in range(1, 41):
        t += 19.5 + (s % 7) / 10
        flags = ["first"] if s == 1 else ["save"] if s == 20 else ["eval", "recompile"] if s == 30 else []
        out.append(json.dumps({"v": 1, "kind": "step", "t": t, "step": s, "rank": 0, "dt": 19.5 + (s % 7) / 10,
                               "step_begin": t - 19.5, "step_end": t, "tokens": 26048, "padded_tokens": 26112,
                               "flags": flags}, separators=(",", ":")).encode())
        if s % 10 == 0:
            out.append(b'{"v":1,"kind":"log","t":%r,"step":%d,"rank":0,"logs":{"loss":%r,"grad_norm":0.5}}'
                       % (t, s, 2.0 - s / 100))
        if s % 15 == 0:
            out.append(b'{"v":1,"kind":"phase","t":%r,"step":%d,"rank":0,"name":"save","state":"begin"}' % (t, s))
    return out


_STEP = b'{"v":1,"kind":"step","t":1780001000.5,"step":41,"rank":0,"dt":19.0,"step_begin":1780000981.5,'
_TAIL = b'"step_end":1780001000.5,"tokens":26048,"padded_tokens":26112,"flags":[]}'


def _step(**change: object) -> bytes:
    """The next step record, with fields changed (written as given: ``json.dumps`` of each value)."""
    rec = json.loads(_STEP + _TAIL)
    rec.update(change)
    return json.dumps(rec).encode()


#: Lines the typed reading takes, each folded as its dict is (odd but valid values, all within the types).
DECODED = {
    "an int dt": _step(dt=19),
    "an int clock": _step(t=1780001000, step_end=1780001000),
    "no step number, no token counts, no clock": _step(step=None, tokens=None, padded_tokens=None, t=None,
                                                        step_end=None),
    "rank null": _step(rank=None),
    "flags null": _step(flags=None),
    "keys missing": b'{"kind":"step","dt":19.0}',
    "keys in another order": b'{"flags":["save"],"dt":19.0,"step":41,"kind":"step","rank":0}',
    "a CRLF line": _STEP + _TAIL + b"\r",
    "spaces around the record": b"  " + _STEP + _TAIL + b" ",
    "a duplicate key": _STEP.replace(b'"dt":19.0', b'"dt":5.0,"dt":19.0') + _TAIL,
    "escaped keys and kind": _STEP.replace(b'"dt"', b'"d\\u0074"').replace(b'"step",', b'"st\\u0065p",') + _TAIL,
    "a flag of escapes": _step(flags=["\u0000sa\u00e9ve", "save"]),
    "a width and a timing": _step(width=512, batch_size=4, timing="reported", arrival_dt_s=18.5, steps_in_update=1),
    "tiny and negative-zero values": _step(dt=5e-324, t=-0.0, step=-0),
    "a dt that underflows to zero": _STEP.replace(b'"dt":19.0', b'"dt":1e-400') + _TAIL,
    "a log of a huge int and a long float": b'{"kind":"log","step":41,"logs":{"loss":123456789012345678901234567890,'
                                            b'"grad_norm":0.12345678901234567890123}}',
    "a log of odd metrics": b'{"kind":"log","step":41.0,"rank":null,"logs":{"loss":"nan","lr":true,"x":null}}',
    "a log without logs": b'{"kind":"log","step":-3}',
    "an exponent of five digits, a mantissa of 3,000": _step(dt=0.0).replace(b'"dt": 0.0', b'"dt": 1e-99999').replace(
        b'"t": 1780001000.5', b'"t": 0.' + b"0" * 3000 + b"1780001000e3010"),
    "a huge int step on a log": b'{"kind":"log","step":123456789012345678901234567890,"logs":{}}',
    "a phase named oddly": b'{"kind":"phase","name":7,"state":"begin"}',
}

#: Lines the typed reading leaves to the dict way (json reads them otherwise, or the fold changes their values).
REFUSED = {
    "NaN dt": _STEP.replace(b'"dt":19.0', b'"dt":NaN') + _TAIL,
    "a dt of 1e400": _STEP.replace(b'"dt":19.0', b'"dt":1e400') + _TAIL,
    "a negative dt": _step(dt=-1.0),
    "a dt of 2**53": _step(dt=2**53),
    "a bool dt": _step(dt=True),
    "a lone surrogate in a flag": _STEP + _TAIL.replace(b'"flags":[]', b'"flags":["\\ud800"]'),
    "a BOM": b"\xef\xbb\xbf" + _STEP + _TAIL,
    "a step of 2**64": _step(step=2**64),
    "a float step": _step(step=41.0),
    "a bool step": _step(step=True),
    "negative tokens": _step(tokens=-1),
    "a clock in the year 3000": _step(t=4e10),
    "a text clock": _step(step_end="x"),
    "rank 0.0": _step(rank=0.0),
    "rank false": _step(rank=False),
    "rank 1": _step(rank=1),
    "flags of a number": _step(flags=["save", 1]),
    "flags an empty string": _step(flags=""),
    "a field the emitter never writes": _step(extra=1),
    "a nested width": _step(width=[512]),
    "no dt": b'{"kind":"step","step":41}',
    "another kind": b'{"kind":"run_end","step":41,"rank":0}',
    "no kind": b'{"step":41,"dt":19.0}',
    "a kind that is no string": b'{"kind":1,"dt":19.0}',
    "two records on a line": _STEP + _TAIL + b" " + _STEP + _TAIL,
    "a record over two lines": _STEP + b"\n" + _TAIL,
    "two on a line and one over two lines": _STEP + _TAIL + b" " + _STEP + _TAIL + b"\n" + _STEP + b"\n" + _TAIL,
    "a blank line": b"",
    "a line of spaces": b"   ",
    "a corrupt line": _STEP,
    "not an object": b"[1, 2]",
    "logs nested": b'{"kind":"log","step":41,"logs":{"loss":{"a":' + b"[" * 2000 + b"]" * 2000 + b"}}}",
    "logs a list": b'{"kind":"log","step":41,"logs":[1.0]}',
    "a dt of 100,000 digits and an exponent of six": _STEP.replace(b'"dt":19.0', b'"dt":0.' + b"0" * 99998
                                                                  + b"19e100000") + _TAIL,
    "a log metric of 100,000 digits and an exponent of six": b'{"kind":"log","logs":{"loss":0.' + b"0" * 99998
                                                             + b'19e100000}}',
    "a dt of 10,000 digits and an exponent of six": _STEP.replace(b'"dt":19.0', b'"dt":0.' + b"0" * 9990
                                                                 + b"1e100000") + _TAIL,
    "a clock of 10,000 digits and an exponent of six": _STEP.replace(b'"t":1780001000.5', b'"t":1' + b"0" * 9990
                                                                    + b"e-100000") + _TAIL,
    "a duplicate key, the first one invalid": _STEP.replace(b'"dt":19.0', b'"dt":-1.0,"dt":19.0') + _TAIL,
}


def _fold(path: Path, typed: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[object, int, int, list[bool]]:
    """The fold of ``path`` (encoded to the last attribute), the reader's line counts, and which reads were decoded
    as records."""
    decoded: list[int] = []

    def decode(body: bytes) -> DecodedRead | None:
        got = decode_read(body) if typed else None
        decoded.append(got is not None)
        return got

    monkeypatch.setattr(ef, "ReadDecoder", lambda: decode)
    fold, reader = EventsFold(), EventReader(path)
    fold.fold(reader)
    reader.close()
    return encode(fold), reader.lines_read, reader.corrupt_lines, [bool(d) for d in decoded]


@pytest.mark.parametrize("case", [*DECODED, *REFUSED])
def test_a_read_decoded_as_records_folds_as_its_dicts_do_and_one_it_cannot_take_is_read_the_dict_way(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str):
    lines = _ordinary()
    lines[30:30] = [DECODED.get(case, REFUSED.get(case, b""))]
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    typed, lines_read, corrupt, decoded = _fold(path, True, monkeypatch)
    dicts, d_lines_read, d_corrupt, _ = _fold(path, False, monkeypatch)
    assert all(decoded) is (case in DECODED), "the line's read was read the other way than this case expects"
    assert (lines_read, corrupt) == (d_lines_read, d_corrupt)
    assert typed == dicts


def test_the_emitters_records_are_decoded_read_by_read_and_the_last_step_is_kept_as_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A file of the emitter's records, many reads long: each read decoded (the cost this module exists for), and
    the latest step record the fold keeps is the dict its line reads as, every key in the file's order."""
    import stepwatch.monitors.readers.jsonl as et

    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(ln + b"\n" for _ in range(30) for ln in _ordinary()[:-3]) + _step(width=512) + b"\n"
                     + b'{"kind":"log","step":41,"logs":{"loss":1.0}}\n')
    monkeypatch.setattr(et, "_CHUNK", 2048)
    reads = [type(batch) is DecodedRead for batch in EventReader(path).iter_new(decode_read)]
    assert len(reads) > 50 and all(reads)
    fold = EventsFold()
    fold.fold(EventReader(path))
    want = json.loads(_step(width=512))
    assert fold.last_step is not None and fold.last_step == want and list(fold.last_step) == list(want)


def test_a_file_whose_reads_keep_being_refused_is_tried_one_read_in_64_until_one_is_taken_the_cost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Reads the typed way cannot take (here each holds a rank 1 record) are tried 16 in a row, then one in 64; the
    first one taken again brings back a try each read. The fold is the dict way's all along."""
    import stepwatch.monitors.readers.jsonl as et

    mixed = b"".join(ln + b"\n" for s in range(1, 3001) for ln in (_step(step=s), _step(step=s, rank=1)))
    clean = b"".join(_step(step=s) + b"\n" for s in range(3001, 6001))
    path = tmp_path / "events.jsonl"
    path.write_bytes(mixed + clean)
    monkeypatch.setattr(et, "_CHUNK", 2048)
    tried: list[bool] = []
    monkeypatch.setattr(records, "decode_read", lambda body: tried.append(True) or decode_read(body))
    decoder, outcomes = ReadDecoder(), []
    for batch in EventReader(path).iter_new(decoder):
        outcomes.append(type(batch) is DecodedRead)
    first_taken = outcomes.index(True)
    assert first_taken > 16 and len(outcomes) - first_taken >= len(clean) // 2048 - 65 and all(outcomes[first_taken:])
    assert len(tried) - (len(outcomes) - first_taken) <= 16 + first_taken // 64 + 1
    typed, *counts = _fold(path, True, monkeypatch)[:3]
    dicts, *d_counts = _fold(path, False, monkeypatch)[:3]
    assert typed == dicts and counts == d_counts



_VALUES = [b"0", b"-0", b"1", b"-1", b"1.0", b"-0.0", b"1e400", b"NaN", b"Infinity", b"true", b"false", b"null", b'""',
           b'"x"', b"[]", b"{}", b"[1]", b'["a"]', b"18446744073709551616", b"9007199254740993", b"1e-400", b"5e-324",
           b"0.1234567890123456789012", b'"\\ud800"', b'"\\u0000"', b'"step"', b'"log"', b'"phase"', b"3.0", b"4e10"]
_KEYS = [b'"extra":1,', b'"width":[1],', b'"rank":1,', b'"kind":"log",', b'"d\\u0074":5.0,', b" ", b"\r", b'"timing":1,']


def _mutated(rng: random.Random, line: bytes) -> bytes:
    """``line`` with a value swapped, a field repeated or added, or a byte dropped or put in, once to three times."""
    b = bytearray(line)
    for _ in range(rng.choice((1, 1, 2, 3))):
        r = rng.random()
        if r < 0.5:  # a value (up to the next comma or closing bracket at its depth)
            i = rng.choice([k for k in range(len(b)) if b[k] == ord(":")]) + 1
            j, depth = i, 0
            while j < len(b) and not (depth == 0 and b[j] in b",]}"):
                depth += (b[j] in b"[{") - (b[j] in b"]}")
                j += 1
            b[i:j] = rng.choice(_VALUES)
        elif r < 0.6 and (k := b.find(b",", rng.randrange(len(b)))) > 0 and (e := b.find(b",", k + 1)) > 0:
            b[e:e] = b[k:e]  # a field twice
        elif r < 0.75:
            b[1:1] = rng.choice(_KEYS)
        elif r < 0.9:
            i = rng.randrange(len(b))
            b[i:i + rng.randrange(1, 4)] = b""
        else:
            b.insert(rng.randrange(len(b) + 1), rng.choice(b'{}[]",:019 \\ue-+.'))
    return bytes(b).replace(b"\n", b"")


def test_the_emitters_lines_mutated_2000_ways_fold_typed_as_their_dicts_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A seeded search for a line the typed reading takes and reads otherwise than the dict way: values swapped for
    odd ones (big and negative zeros, NaN, escapes, other kinds), fields repeated, added, bytes dropped and put in.
    Each line the typed way takes (about a third) is folded both ways."""
    rng = random.Random(7)
    ordinary, path, taken = _ordinary(), tmp_path / "events.jsonl", 0
    for _ in range(2000):
        data = ordinary[0] + b"\n" + _mutated(rng, rng.choice(ordinary)) + b"\n" + ordinary[-1] + b"\n"
        if decode_read(data) is None:
            continue
        taken += 1
        path.write_bytes(data)
        assert _fold(path, True, monkeypatch)[:3] == _fold(path, False, monkeypatch)[:3], data
    assert taken > 400
