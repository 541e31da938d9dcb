"""The stacks of a stuck run's processes, read and grouped: py-spy's ``dump`` text of each process of the
tree (taken by the supervisor, :mod:`stepwatch.monitors.watch.stacks`) becomes one line that says where
each rank is and which one is the odd one out ("rank 1 in `<module>` (train.py:27); ranks 0 and 2 wait in
a collective: `all_reduce` …"), and the phase the stacks show (a ``torch.save``: saving; an evaluation
loop: evaluating).

Pure and hostile-input safe: the text is a run's process's stack (function and file names are the
program's own) and is only matched, cut short and returned as text, never run nor followed.
"""

from __future__ import annotations

import re
from typing import NamedTuple, TypedDict

from stepwatch.monitors.states import EVALUATING, SAVING, PhaseName

#: ``    all_reduce (torch/distributed/distributed_c10d.py:3252)``: py-spy's frame line
_FRAME = re.compile(r"^\s+(?P<fn>\S.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)\s*$")
#: ``Thread 23766 (idle): "MainThread"``
_THREAD = re.compile(r'^Thread (?P<tid>\d+) \((?P<state>[^)]*)\)(?:: "(?P<name>.*)")?')

#: torch.distributed's collectives (a rank inside one waits for the others)
COLLECTIVES = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all", "all_to_all_single",
    "barrier", "monitored_barrier", "broadcast", "broadcast_object_list", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "gather", "gather_object", "scatter", "scatter_object_list", "send", "recv", "wait"})
#: a frame of these names is an evaluation (HF Trainer, Lightning, nanoGPT's estimate_loss, timm's validate)
EVAL_FUNCTIONS = frozenset({"evaluate", "evaluation_loop", "prediction_loop", "prediction_step", "_evaluation_loop",
                            "validation_step", "_run_validation", "estimate_loss", "validate", "run_evaluation"})
#: a frame of these names is a save (torch.save, HF's _save_checkpoint / save_pretrained, Lightning's)
SAVE_FUNCTIONS = frozenset({"save", "_save", "_save_checkpoint", "save_model", "save_pretrained", "save_checkpoint",
                            "_save_to_state_dict", "save_file", "dump_checkpoint"})
#: files of libraries and of the interpreter: the frame named as "from" is the innermost one not here
_LIBRARY = re.compile(r"^(?:<frozen |torch/|transformers/|lightning/|pytorch_lightning/|accelerate/|tqdm/|numpy/|"
                      r"multiprocessing/|concurrent/|asyncio/|threading\.py|selectors\.py|socket\.py|queue\.py|"
                      r"subprocess\.py|runpy\.py|safetensors/|deepspeed/|datasets/|contextlib\.py|functools\.py)")
#: the most processes one line names, and the longest line
MOST_GROUPS = 6
SUMMARY_CHARS = 600


class Frame(NamedTuple):
    function: str
    file: str
    line: int | None


class ProcessStack(TypedDict):
    """One process's stack as the supervisor took it: py-spy's text, or why there is none."""

    pid: int
    rank: int | None
    name: str
    stack: str


class StackGroup(TypedDict):
    """Processes whose main threads stand in the same frames (function and file, innermost first)."""

    ranks: list[int]
    pids: list[int]
    where: str
    category: str | None  # collective, saving, evaluating, data, launcher, or None
    odd: bool


class TreeStacks(TypedDict):
    groups: list[StackGroup]
    summary: str
    phase: PhaseName | None
    #: the pid whose stack is attached to the alert (the odd one out, else the first with a stack)
    attached_pid: int | None


def main_frames(stack: str) -> list[Frame]:
    """The frames of the dump's ``MainThread`` (else of its first thread), innermost first."""
    blocks: list[tuple[str, list[Frame]]] = []
    for ln in stack.splitlines():
        if m := _THREAD.match(ln):
            blocks.append((m["name"] or "", []))
        elif blocks and (f := _FRAME.match(ln)):
            blocks[-1][1].append(Frame(f["fn"][:120], f["file"][:200], int(f["line"]) if f["line"] else None))
    main = next((frames for name, frames in blocks if name == "MainThread"), None)
    return main if main is not None else (blocks[0][1] if blocks else [])


def _short(f: Frame) -> str:
    where = f.file.rsplit("/", 1)[-1] + (f":{f.line}" if f.line is not None else "")
    return f"`{f.function}` ({where})"


def _last_name(fn: str) -> str:
    return fn.rsplit(".", 1)[-1]


def category_of(frames: list[Frame]) -> str | None:
    """What the frames show the process doing: ``collective``, ``saving``, ``evaluating``, ``data`` (waiting
    for or making a batch), ``launcher`` (torchrun's agent), else None."""
    names = [(_last_name(f.function), f.file) for f in frames]
    if any(n in COLLECTIVES and "torch/distributed/" in file and "elastic" not in file for n, file in names):
        return "collective"
    if any(n in SAVE_FUNCTIONS for n, _ in names):
        return "saving"
    if any(n in EVAL_FUNCTIONS for n, _ in names):
        return "evaluating"
    if any(file.startswith("torch/utils/data/") for _, file in names):
        return "data"
    if any(file.startswith("torch/distributed/elastic/") or file == "torch/distributed/run.py" for _, file in names):
        return "launcher"
    return None


def where_words(frames: list[Frame]) -> str:
    """``in `<module>` (train.py:27)``, or ``waiting in a collective: `all_reduce` (distributed_c10d.py:3252)
    from `<module>` (train.py:28)``: the innermost frame, the collective or save it is in, and the
    program's own frame it was called from."""
    if not frames:
        return "in no Python frame py-spy could read"
    cat = category_of(frames)
    own = next((g for g in frames if not _LIBRARY.match(g.file)), None)
    if cat == "collective":
        f = next(f for f in frames if _last_name(f.function) in COLLECTIVES and "torch/distributed/" in f.file)
        head = f"waiting in a collective: {_short(f)}"
    elif cat == "saving":
        f = next(f for f in frames if _last_name(f.function) in SAVE_FUNCTIONS)
        head = f"saving: {_short(f)}"
    elif cat == "data" and own is not None and frames.index(own) < max(
            i for i, g in enumerate(frames) if g.file.startswith("torch/utils/data/")):
        f = own  # a DataLoader worker in the dataset's own code
        head = f"making a batch: {_short(f)}"
    elif cat == "data":
        f = next(f for f in reversed(frames) if f.file.startswith("torch/utils/data/"))
        head = f"waiting for a batch: {_short(f)}"
    else:
        f = frames[0]
        head = f"in {_short(f)}"
    return head + (f" from {_short(own)}" if own is not None and own != f and cat != "launcher" else "")


def _who(ranks: list[int], pids: list[int], names: list[str], category: str | None) -> str:
    if ranks and len(ranks) == len(pids):
        return (f"rank {ranks[0]}" if len(ranks) == 1 else
                "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}")
    if category == "launcher":
        return f"the launcher (pid {pids[0]})"
    shown = ", ".join(f"{p} ({n})" for p, n in zip(pids[:4], names[:4])) + (" …" if len(pids) > 4 else "")
    return ("pid " if len(pids) == 1 else "pids ") + shown


def group_stacks(stacks: list[ProcessStack]) -> TreeStacks:
    """Group the processes by their main thread's frames and say, in one line, where each group is; the odd
    one out (a rank not in the collective its peers wait in, or the lone one of three or more) first."""
    by_sig: dict[tuple[tuple[str, str], ...], tuple[list[ProcessStack], list[Frame]]] = {}
    without: list[ProcessStack] = []
    for ps in stacks:
        frames = main_frames(ps["stack"])
        if not frames:
            without.append(ps)
            continue
        sig = tuple((f.function, f.file) for f in frames)
        by_sig.setdefault(sig, ([], frames))[0].append(ps)
    groups: list[StackGroup] = []
    for members, frames in by_sig.values():
        members.sort(key=lambda p: (p["rank"] is None, p["rank"] if p["rank"] is not None else 0, p["pid"]))
        groups.append({"ranks": [p["rank"] for p in members if p["rank"] is not None], "pids": [p["pid"] for p in members],
                       "where": where_words(frames), "category": category_of(frames), "odd": False})
    ranked = [g for g in groups if g["ranks"]]
    in_coll = [g for g in ranked if g["category"] == "collective"]
    if in_coll and len(in_coll) < len(ranked):  # the ranks outside the collective the others wait in
        for g in ranked:
            g["odd"] = g["category"] != "collective"
    elif len(ranked) >= 2:
        biggest = max(len(g["ranks"]) for g in ranked)
        if sum(len(g["ranks"]) == biggest for g in ranked) == 1 and biggest >= 2:
            for g in ranked:
                g["odd"] = len(g["ranks"]) < biggest
    groups.sort(key=lambda g: (not g["odd"], not g["ranks"], -len(g["pids"])))
    names = {p["pid"]: p["name"] for p in stacks}
    parts = [f"{_who(g['ranks'], g['pids'], [names[p] for p in g['pids']], g['category'])} {g['where']}"
             for g in groups[:MOST_GROUPS]]
    if len(groups) > MOST_GROUPS:
        parts.append(f"{len(groups) - MOST_GROUPS} more group(s)")
    if without:
        parts.append(f"no stack of {len(without)} process(es): {without[0]['stack'][:120]}")
    odd = next((g for g in groups if g["odd"]), None)
    phase = _phase(odd, groups)
    summary = (("the odd one out: " if odd else "") + "; ".join(parts)
               + (f" (the stacks show the run {phase})" if phase else ""))
    first = odd or (groups[0] if groups else None)
    return {"groups": groups, "summary": summary[:SUMMARY_CHARS], "phase": phase,
            "attached_pid": first["pids"][0] if first else None}


def _phase(odd: StackGroup | None, groups: list[StackGroup]) -> PhaseName | None:
    """saving or evaluating when the odd one out is (else when every process with a stack is), else None."""
    words: dict[str | None, PhaseName] = {"saving": SAVING, "evaluating": EVALUATING}
    if odd is not None:
        return words.get(odd["category"])
    cats = {g["category"] for g in groups if g["category"] != "launcher"}
    return words.get(cats.pop()) if len(cats) == 1 else None
