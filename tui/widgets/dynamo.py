"""The dynamo panel: recompiles, graph breaks, recompile-limit hits (with their source), and the
attention backend requested vs resolved, with the library versions the training process saw."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Static

from stepwatch.monitors.snapshot.types import Snapshot
from stepwatch.tui.format import NO_DYNAMO_WORDS, attention_words, no_dynamo_output, versions_words
from stepwatch.tui.widgets.base import Panel


def _n(v: Any) -> str:
    return "unknown" if v is None else str(v)  # not reported is not zero


class DynamoPanel(Panel):
    """Two lines of compile facts and one of provenance."""

    def compose(self) -> ComposeResult:
        yield Static("", id="dyn-counts")
        yield Static("", id="dyn-attn")

    def show(self, snap: Snapshot) -> None:
        d = snap.get("dynamo") or {}
        t = Text()
        if no_dynamo_output(d):
            t.append(NO_DYNAMO_WORDS, "dim")
        else:
            t.append(f"recompiles {_n(d.get('recompiles'))}  graph breaks {_n(d.get('graph_breaks'))}  "
                     f"unique graphs {_n(d.get('unique_graphs'))}  ")
            hits = d.get("recompile_limit_hits")
            t.append(f"limit hits {_n(hits)}", "bold red" if hits else "")
            if source := d.get("source"):
                t.append(f"  (from {source})", "dim")
        self._set("#dyn-counts", t)
        a = snap.get("attn_implementation") or {}
        v = snap.get("versions") or {}
        words, differs = attention_words(a)
        t2 = Text(words, "bold yellow" if differs else "")
        t2.append(f"  {versions_words(v)}", "dim")
        self._set("#dyn-attn", t2)
