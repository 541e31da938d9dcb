"""The run's checkpoints, and which of them are complete: a resume starts from the newest complete one, never from
one being written when the run died.

Complete means (ARCHITECTURE.md "The restart policy"):

- the HF Trainer's ``checkpoint-N/``: its ``trainer_state.json`` parses and says ``global_step`` N, and its model
  weights are written (``model.safetensors``, ``pytorch_model.bin``, an adapter's, or a sharded index whose every
  shard is there) — the Trainer writes the state last, so a save cut short lacks it;
- a Lightning ``.ckpt``: a zip archive (torch's format) whose ``data.pkl`` is listed in its central directory,
  which is written last;
- a torch distributed checkpoint directory: its ``.metadata`` (written by the coordinator once every rank saved);
- ``[restart] checkpoints`` (a glob) with ``complete_marker``: a match holding that file.

Read-only; a symlink is never followed (a checkpoint is what lies in the run's own output directory), a
checkpoint another user owns or can write is never complete (a resume unpickles it as the owner), and a
directory that cannot be read is skipped, never an error. Whether a complete one may be handed to the job, its whole
path judged, is launcher/checkpointpath.py's.
"""

from __future__ import annotations

import json
import os
import re
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_HF_DIR = re.compile(r"^checkpoint-(\d+)$")
_STEP_IN_NAME = re.compile(r"(?:step[=_-]?)(\d+)|(\d+)(?!.*\d)")
HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors", "adapter_model.bin")
HF_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
#: At most this many entries of a directory are looked at (a huge output dir costs a bounded time).
MAX_ENTRIES = 10_000


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One checkpoint: where, its step, its kind (``hf``, ``lightning``, ``dcp``, ``glob``), and whether it is
    complete (``why`` not, when it is not)."""

    path: Path
    step: int
    kind: str
    complete: bool
    why: str = ""


def _is_dir(p: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(p).st_mode)
    except OSError:
        return False


def _is_file(p: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(p).st_mode)
    except OSError:
        return False


def _entries(d: Path) -> list[str]:
    try:
        with os.scandir(d) as it:
            return [e.name for _, e in zip(range(MAX_ENTRIES), it)]
    except OSError:
        return []


#: A checkpoint's JSON (trainer_state.json, a shard index) larger than this is not read: not a checkpoint's.
MAX_JSON_BYTES = 64 * 1024 * 1024


class NotRead(ValueError):
    """A file a checkpoint's judge refused to read."""


def _small_json(p: Path) -> Any:
    """``p``'s JSON, read only when it is a regular file of at most MAX_JSON_BYTES (a planted 50 GB file or a FIFO
    costs nothing); ValueError otherwise."""
    st = os.lstat(p)
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_JSON_BYTES:
        raise NotRead(f"{p.name} is not a regular file of at most {MAX_JSON_BYTES} bytes: not read")
    return json.loads(p.read_text(encoding="utf-8"))


def hf_checkpoint(d: Path, step: int) -> Checkpoint:
    """An HF Trainer ``checkpoint-N`` directory, judged."""
    state = d / "trainer_state.json"
    if not _is_file(state):
        return Checkpoint(d, step, "hf", False, "no trainer_state.json (written last: the save was cut short)")
    try:
        doc: Any = _small_json(state)
    except NotRead as e:
        return Checkpoint(d, step, "hf", False, str(e))
    except (OSError, ValueError) as e:
        return Checkpoint(d, step, "hf", False, f"trainer_state.json does not parse: {type(e).__name__}")
    if not isinstance(doc, dict) or doc.get("global_step") != step:
        return Checkpoint(d, step, "hf", False, f"trainer_state.json says global_step {doc.get('global_step') if isinstance(doc, dict) else '?'}")
    names = set(_entries(d))
    if any(w in names and _is_file(d / w) for w in HF_WEIGHTS):
        return Checkpoint(d, step, "hf", True)
    for index in HF_INDEXES:
        if index in names:
            try:
                shards = set(_small_json(d / index)["weight_map"].values())
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                return Checkpoint(d, step, "hf", False, f"{index} does not parse")
            missing = sorted(s for s in shards if not (isinstance(s, str) and _is_file(d / s)))
            return Checkpoint(d, step, "hf", not missing, f"shards missing: {', '.join(missing[:3])}" if missing else "")
    return Checkpoint(d, step, "hf", False, "no model weights file")


def lightning_checkpoint(f: Path, step: int) -> Checkpoint:
    """A Lightning ``.ckpt`` file, judged by its zip directory (written last)."""
    try:
        with zipfile.ZipFile(f) as z:
            ok = any(n.endswith("/data.pkl") or n == "data.pkl" for n in z.namelist())
    except (OSError, zipfile.BadZipFile, ValueError) as e:
        return Checkpoint(f, step, "lightning", False, f"not a complete torch archive: {type(e).__name__}")
    return Checkpoint(f, step, "lightning", ok, "" if ok else "no data.pkl in the archive")


def _step_of(name: str) -> int | None:
    m = _STEP_IN_NAME.search(name)
    return int(m.group(1) or m.group(2)) if m else None


def _foreign(c: Checkpoint) -> Checkpoint:
    """``c``, or ``c`` not complete when another user owns it or can write it: a resume loads it (a pickle) with the
    owner's rights, so a checkpoint a group member could have planted or changed is never chosen."""
    try:
        st = os.lstat(c.path)
    except OSError:
        return Checkpoint(c.path, c.step, c.kind, False, "cannot be examined")
    if st.st_uid != os.getuid():
        return Checkpoint(c.path, c.step, c.kind, False, f"owned by uid {st.st_uid}, not by the run's owner")
    if st.st_mode & 0o022:
        return Checkpoint(c.path, c.step, c.kind, False, "others can write it (mode %o)" % (st.st_mode & 0o777))
    return c


def find_checkpoints(output_dir: Path | None, pattern: str | None = None, cwd: Path | None = None,
                     marker: str | None = None) -> list[Checkpoint]:
    """Every checkpoint under ``output_dir`` (HF ``checkpoint-N``, Lightning ``*.ckpt``, distributed checkpoints) and
    matching ``pattern`` (a glob relative to ``cwd``; complete when it holds ``marker``), oldest step first."""
    found: dict[Path, Checkpoint] = {}
    if output_dir is not None and _is_dir(output_dir):
        for name in _entries(output_dir):
            p = output_dir / name
            if not _owned(p):  # another user's entry is never read (its size, its pickle): named, not judged
                m = _HF_DIR.match(name)
                step = int(m.group(1)) if m else _step_of(name)
                if step is not None:
                    found[p] = Checkpoint(p, step, "hf" if m else "foreign", False,
                                          f"owned by uid {_uid(p)}, not by the run's owner")
                continue
            if (m := _HF_DIR.match(name)) and _is_dir(p):
                found[p] = hf_checkpoint(p, int(m.group(1)))
            elif name.endswith(".ckpt") and _is_file(p) and (s := _step_of(name)) is not None:
                found[p] = lightning_checkpoint(p, s)
            elif _is_dir(p) and ".metadata" in _entries(p) and (s := _step_of(name)) is not None:
                found[p] = Checkpoint(p, s, "dcp", _is_file(p / ".metadata"))
    if pattern and cwd is not None:
        for p in sorted(cwd.glob(pattern))[:MAX_ENTRIES]:
            if p in found or p.is_symlink() or (s := _step_of(p.name)) is None:
                continue
            if _is_dir(p):
                done = bool(marker) and _is_file(p / str(marker))
                found[p] = Checkpoint(p, s, "glob", done, "" if done else f"no {marker} in it")
            elif _is_file(p):  # one file: complete when it is a whole torch archive (torch.save's zip format)
                judged = lightning_checkpoint(p, s)
                found[p] = Checkpoint(p, s, "glob", judged.complete, judged.why)
    return sorted((_foreign(c) if c.complete else c for c in found.values()), key=lambda c: (c.step, str(c.path)))


def _uid(p: Path) -> int | None:
    try:
        return os.lstat(p).st_uid
    except OSError:
        return None


def _owned(p: Path) -> bool:
    return _uid(p) == os.getuid()


def newest_complete(checkpoints: list[Checkpoint]) -> Checkpoint | None:
    """The complete checkpoint of the highest step, or None."""
    return max((c for c in checkpoints if c.complete), key=lambda c: c.step, default=None)


def output_dir_of(argv: list[str], cwd: Path) -> Path | None:
    """The trainer's output directory from its command line (``--output_dir X``, ``--output-dir=X``), or None."""
    for i, a in enumerate(argv):
        for flag in ("--output_dir", "--output-dir", "--default_root_dir", "--trainer.default_root_dir"):
            if a == flag and i + 1 < len(argv):
                return cwd / argv[i + 1]
            if a.startswith(flag + "="):
                return cwd / a.split("=", 1)[1]
    return None
