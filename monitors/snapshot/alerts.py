"""Alerts: their ids and their wording, from a status snapshot and the evidence behind it.

An alert id is ``a<attempt>-<kind>-<key>`` (the key: a step, a function, a device), stable across
refreshes and attaches, so an acknowledgement (``acks.jsonl``) holds for as long as the alert does.
Kinds: ``recompile_limit``, ``recompile_storm``, ``fallback``, ``stall``, ``gpu``, ``watchdog``.
Each alert's ``at`` is when the files say it became true (the step's start plus the stall
threshold, the fallback's onset, the exit); when they cannot say, the first refresh that saw it.
"""

from __future__ import annotations

import time
from typing import Any, Iterable, MutableMapping

from stepwatch.monitors.detectors.storm import recompile_storm
from stepwatch.monitors.runfiles import utc_iso
from stepwatch.monitors.snapshot.model import run_ended


def end_words(snap: dict[str, Any]) -> str:
    """``exited with code 3 after 12.0 s`` / ``killed by SIGKILL after ...`` / ``ended, status unknown``."""
    ended = snap.get("ended") or {}
    dur = ended.get("duration_s")
    after = f" after {dur:.1f} s" if isinstance(dur, (int, float)) else ""
    if snap.get("signal"):
        return f"killed by {snap['signal']}{after}"
    if snap.get("returncode") is not None:
        return f"exited with code {snap['returncode']}{after}"
    if ended.get("error"):
        return f"could not start: {ended['error']}"
    return "ended, status unknown (supervisor gone, no exit.json)"


def alert(first_seen: MutableMapping[str, float], attempt: Any, kind: str, key: str, message: str,
          at: float | None) -> dict[str, Any]:
    """One alert dict ``{id, kind, at, message}``; ``at`` (unix s) or the first time it was seen."""
    aid = f"a{attempt}-{kind}-{key}"
    t = at if at is not None else first_seen.setdefault(aid, time.time())
    return {"id": aid, "kind": kind, "at": utc_iso(t), "message": message}


def alerts_for(snap: dict[str, Any], *, first_seen: MutableMapping[str, float],
               limit_hits: Iterable[tuple[Any, int | None, float]],
               recompile_sources: Iterable[Iterable[int]],
               fallback_onset_t: float | None, stall_at: float | None) -> list[dict[str, Any]]:
    """The snapshot's alerts, oldest kind first.

    ``limit_hits``: (RecompileLimit record of train.log, global_step near it, unix s seen);
    ``recompile_sources``: the recompile steps of each source (events.jsonl flags, train.log
    records), judged apart; ``fallback_onset_t`` / ``stall_at``: unix s each became true, or None.
    ``first_seen`` keeps the first-seen time of alerts the files give no time for.
    """
    att = snap["attempt"]
    out = []
    hits = list(limit_hits)
    for e, step, seen in hits:
        where = f" on rank {e.rank}" if e.rank is not None else ""
        out.append(alert(first_seen, att, "recompile_limit", f"{e.function}-{e.rank}",
                         f"dynamo hit {e.limit_name} ({e.limit}) for {e.function}{where}"
                         f"{f' near step {step}' if step is not None else ''}: that frame now runs EAGERLY", seen))
    if not hits and (snap["dynamo"].get("recompile_limit_hits") or 0) > 0:
        out.append(alert(first_seen, att, "recompile_limit", "events",
                         f"dynamo hit its recompile limit {snap['dynamo']['recompile_limit_hits']} time(s) "
                         "(seen by the emitter): a frame now runs eagerly", None))
    storm = recompile_storm([list(s) for s in recompile_sources], snap["warmup"],
                            snap["dynamo"].get("top_recompile_reason"))
    if storm:
        out.append(alert(first_seen, att, "recompile_storm", str(storm[0]), storm[1], None))
    fb = snap["fallback"]
    if fb.get("state") == "flagged":
        out.append(alert(first_seen, att, "fallback", str(fb.get("onset_step")),
                         f"step times went bimodal (eager fallback?): {fb.get('reason')}", fallback_onset_t))
    st = snap["stall"]
    if st.get("state") == "stalled":
        gs = snap["step"].get("global_step")
        out.append(alert(first_seen, att, "stall", str(gs),
                         f"alive but stuck: no optimizer step for {st['current_step_elapsed_s']:.0f} s after "
                         f"step {gs} (p99 {snap['step_seconds'].get('p99')} s)", stall_at))
    for g in snap.get("gpu") or []:
        if str(g.get("verdict") or "").startswith("SM-busy, tensor-idle"):
            out.append(alert(first_seen, att, "gpu", f"{g.get('index')}-tensor-idle",
                             f"GPU{g.get('index')}: {g['verdict']}", None))
    if run_ended(snap):
        ended = snap.get("ended") or {}
        bad = (snap["state"] == "unknown" or snap.get("signal") or snap.get("returncode") not in (0, None)
               or ended.get("error"))
        if ended.get("stop_requested"):
            bad = False  # the operator asked for it: an event (exit.json says how it ended), not an alert
        if bad:
            tb = snap["log"].get("traceback_last_line")
            last = f"traceback: {tb}" if tb else f"last log line: {snap['log'].get('last_line')!r}"
            who = f"process {snap['pid']}" if snap["pid"] is not None else "the command"
            out.append(alert(first_seen, att, "watchdog", "end", f"{who} {end_words(snap)}; {last}",
                             ended.get("ended_at_unix")))
    return out
