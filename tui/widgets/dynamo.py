"""The dynamo panel: recompiles, graph breaks, recompile-limit hits (with their source), and the
attention backend requested vs resolved, with the library versions the training process saw."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Static

from stepwatch.monitors.snapshot.types import Count, Dynamo, Snapshot
from stepwatch.tui.format import NO_DYNAMO_WORDS, attention_words, no_dynamo_output, versions_words
from stepwatch.tui.widgets.base import Panel


def _n(v: Count) -> str:
    return "unknown" if v is None else str(v)  # not reported is not zero


class DynamoPanel(Panel):
    """Two lines of compile facts and one of provenance."""

    def compose(self) -> ComposeResult:
        yield Static("", id="dyn-counts")
        yield Static("", id="dyn-attn")

    def show(self, snap: Snapshot) -> None:
        d: Dynamo = snap["dynamo"]
        t = Text()
        if no_dynamo_output(d):
            t.append(NO_DYNAMO_WORDS, "dim")
        else:
            t.append(f"recompiles {_n(d['recompiles'])}  graph breaks {_n(d['graph_breaks'])}  "
                     f"unique graphs {_n(d['unique_graphs'])}  ")
            hits = d["recompile_limit_hits"]
            t.append(f"limit hits {_n(hits)}", "bold red" if hits else "")
            if source := d["source"]:
                t.append(f"  (from {source})", "dim")
        self._set("#dyn-counts", t)
        words, differs = attention_words(snap["attn_implementation"])
        t2 = Text(words, "bold yellow" if differs else "")
        t2.append(f"  {versions_words(snap['versions'])}", "dim")
        self._set("#dyn-attn", t2)
