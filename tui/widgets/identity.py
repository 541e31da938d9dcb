"""The identity panel: commit and dirty flag sampled at launch, attempt, log file name; and where the run's hours went
(the ledger)."""

from __future__ import annotations

from textual.widgets import Static

from stepwatch.monitors.snapshot.types import Identity, Log, Snapshot, Survivor
from stepwatch.tui.format import ledger_words, tree_words
from stepwatch.tui.safe import safe_text


class IdentityPanel(Static):
    """Two lines (the identity; the ledger); toggled with ``i``."""

    def show(self, snap: Snapshot) -> None:
        log: Log = snap["log"]
        ident: Identity = snap["identity"] or {}  # total=False: a run.json written by other hands may lack any key
        commit = (ident.get("harness_commit") or "none")[:12]
        desc = ident.get("describe") or ""
        desc = f" ({desc})" if desc and not commit.startswith(desc.removesuffix("-dirty")) else ""  # a tag, not the sha again
        text = (f"commit {commit}{desc} {tree_words(ident)}  branch {ident.get('branch') or '-'}"
                f"  attempt {snap['attempt'] or '-'}  log {log['file'] or 'train.log'}")
        surv: list[Survivor] = snap["survivors"]
        if surv:
            text = (f"{len(surv)} process(es) of the ended run survive (GPU memory?): "
                    + ", ".join(str(p["pid"]) for p in surv[:6]) + " -- stepwatch stop --survivors RUN;  " + text)
        lw = ledger_words(snap["ledger"])  # where the run's hours went, on a line of its own
        if (text, lw) != getattr(self, "_last", None):
            self._last = (text, lw)
            shown = safe_text(text)  # each line made one line: a branch name read from run.json never starts another
            if lw:
                shown.append("\n")
                shown.append_text(safe_text(lw))
            self.update(shown)
