"""The snapshot's ``dynamo`` object: recompiles, graph breaks, unique graphs and recompile-limit hits,
from the emitter's ``dynamo`` / ``run_end`` events and from train.log's dynamo records.

Sources: ``torch._dynamo.utils.counters`` as the emitter snapshots it (``counters``; it has no
recompile key) and what the emitter saw directly (``recompiles``, ``recompile_limit_hits``); the
log's ``TORCH_LOGS=recompiles`` / ``graph_breaks`` records and the recompile-limit warning dynamo
prints even without TORCH_LOGS (:mod:`stepwatch.monitors.parsers.dynamolog`). Per count, the source
that saw the most wins, and ``source`` names which ones spoke.
"""

from __future__ import annotations

from typing import Any, Literal

from stepwatch.monitors.snapshot.model import count, obj
from stepwatch.monitors.snapshot.types import Dynamo, DynamoCounts

_COUNTS: tuple[Literal["recompiles", "recompile_limit_hits", "graph_breaks", "unique_graphs"], ...] = (
    "recompiles", "recompile_limit_hits", "graph_breaks", "unique_graphs")


def dynamo_status(dynamo_ev: dict[str, Any] | None, run_end: dict[str, Any] | None, log_counts: dict[str, Any],
                  template: Dynamo) -> Dynamo:
    """The ``dynamo`` object (``template``: the null snapshot's, every key present)."""
    ev_part: DynamoCounts | None = None
    if dynamo_ev is not None:
        c = obj(dynamo_ev.get("counters"))
        gb = c.get("graph_break")
        ev_part = {
            "recompiles": count(dynamo_ev.get("recompiles")),
            "recompile_limit_hits": count(dynamo_ev.get("recompile_limit_hits")),
            "unique_graphs": count(obj(c.get("stats")).get("unique_graphs")),
            "graph_breaks": sum(v for v in map(count, gb.values()) if v is not None) if type(gb) is dict else 0,
        }
    if run_end and type(run_end.get("dynamo")) is dict:
        ev_part = ev_part or {"unique_graphs": None, "graph_breaks": None}
        for k in ("recompiles", "recompile_limit_hits"):
            if count(run_end["dynamo"].get(k)) is not None:
                ev_part[k] = run_end["dynamo"][k]
    log_seen = bool(log_counts["recompiles"] or log_counts["recompile_limit_hits"] or log_counts["graph_breaks"])
    log_part: DynamoCounts = {"recompiles": log_counts["recompiles"],
                              "recompile_limit_hits": log_counts["recompile_limit_hits"],
                              "graph_breaks": log_counts["graph_breaks"], "unique_graphs": None}
    d = template.copy()
    d["by_source"] = {"events": ev_part, "log": log_part}
    d["top_recompile_reason"] = log_counts["top_recompile_reason"]
    sources = []
    for key in _COUNTS:
        vals = [(src, v) for src, part in (("events", ev_part), ("log", log_part))
                if part is not None and (v := part.get(key)) is not None and (src == "events" or log_seen)]
        if vals:
            src, v = max(vals, key=lambda sv: sv[1])  # the source that saw the most wins
            d[key] = v
            sources.append(src)
    d["source"] = "+".join(sorted(set(sources))) or None
    return d
