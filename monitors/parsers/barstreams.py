"""Several processes drawing the same bar into one log: told apart, never merged into one counter.

A script whose bar is not gated by rank, launched with two processes, writes two unprefixed
``train: 47%|…| 140/300`` bars into one train.log. Read as one counter they gave 336 steps for 300 and a p50
27% low. Here each update of the training bar goes to the *stream* whose counter is nearest at or below it
(a counter only moves forward within its stream); an update below every stream starts a new one. A stream
*interleaves* when it advances after a newer one began: two processes. A stream that never advances again
once a newer one began was a bar that ended or was abandoned (a second ``train()``, a restart), not a
second process.

The headline (the run's step, its step times) follows one stream, by this rule: the first stream, to its
end; a new stream at once when it begins after the headline's bar reached its total (a second ``train()``),
or after ``HANDOVER_UPDATES`` updates of the training bar in which the unfinished headline's stream did not
move (a restart that never comes back). A stream that ran beside the headline never takes over: its steps
would be counted twice. Once a bar carries the tracker's own rank prefix (``[rank0]:``, rank prefixes
that appear mid-run after unprefixed bars), its stream is the headline, for good. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Training-bar updates without a move of the headline's stream before the newest stream takes over.
HANDOVER_UPDATES = 5
#: Streams kept at most (a log can print anything): beyond, an update goes to the nearest stream below.
MAX_STREAMS = 16


@dataclass(slots=True)
class _Stream:
    counter: int
    created: int  # the update number it began at
    moved: int  # the update number it last moved at
    interleaved: bool = False


class BarStreams:
    """Routes each training-bar update to its stream; :meth:`is_headline` says whether it moves the run's step."""

    def __init__(self) -> None:
        self.streams: list[_Stream] = []
        self.headline = 0
        self.anchored = False  # the headline is the stream of the tracker's own rank prefix
        self._updates = 0

    @property
    def interleaved(self) -> int:
        """How many streams interleave in this log (0 while one bar is drawn at a time)."""
        return sum(1 for s in self.streams if s.interleaved)

    def is_headline(self, counter: int, headline_finished: bool, own_rank: bool = False) -> bool:
        """Route one update (``counter`` as the bar prints it); True when it is the headline stream's, whose
        counter the run's step follows (after a hand-over too, as a counter that went back). ``own_rank``:
        the update carries the tracker's own rank prefix (``[rank0]:``): its stream is the headline from now
        on, whatever the unprefixed bars before it were (rank 0 speaks for the run)."""
        self._updates += 1
        k = self._updates
        below = [i for i, s in enumerate(self.streams) if s.counter <= counter]
        if below:
            i = min(below, key=lambda j: counter - self.streams[j].counter)
        elif self.streams and len(self.streams) >= MAX_STREAMS:
            i = min(range(len(self.streams)), key=lambda j: abs(counter - self.streams[j].counter))
        else:
            self.streams.append(_Stream(counter, k, k))
            i = len(self.streams) - 1
            if i == 0 or headline_finished:
                self.headline = i
                return True
        s = self.streams[i]
        advanced = counter > s.counter
        s.counter, s.moved = counter, k
        newer = [t for t in self.streams if t.created > s.created] if advanced else []
        if newer:  # it advanced after a newer stream began: two bars drawn at once
            s.interleaved = True
            for t in newer:
                t.interleaved = True
        if i == self.headline:
            self.anchored = self.anchored or own_rank
            return True
        if own_rank:  # rank 0's own prefix names its bar: the headline from now on
            self.headline, self.anchored = i, True
            return True
        head = self.streams[self.headline]
        if not headline_finished and not self.anchored and k - head.moved > HANDOVER_UPDATES and s.created > head.created:
            self.headline = i  # the headline's bar stopped: a restart, not a second process
            return True
        return False
