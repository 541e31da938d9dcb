"""A global step from a counter that restarts every epoch, and the run's total when it can be known.

Lightning's bars (``Epoch 3:  34%|…| 44/128``, Rich's ``Epoch 3/9 ━━ 44/128``), timm's ``Train: 12 [  16/22``,
a plain loop's ``tqdm(desc=f"Epoch {e}")`` and a user pattern's ``epoch`` group all print a counter
within the epoch and that epoch's length. The global step is the lengths of the epochs before plus the
counter: each epoch's own length as printed (the last one is often shorter: ``max_steps``, a partial
batch), the current length for an epoch never seen (a log read from its tail).

The total is known only where something says how many epochs there are (Rich's ``Epoch 3/9``, a desc's
``Epoch 3/10``, a pattern's ``epochs``, the run config's ``[log] epochs``), or for Lightning with
``max_steps`` alone (the bar's total is min(batches, steps left): the last epoch's, when it is shorter than the
one before; never the first epoch's, which is as likely its batches as the run's steps: a run of 100 steps in
epochs of 40 read ``40/40`` as its end). Otherwise it is unknown, never a per-epoch figure. An epoch counted from 1 (the first epoch seen is 1) is numbered from 1.
Standard library only.
"""

from __future__ import annotations

#: Epoch lengths kept at most (a log may print any epoch number); later epochs use the current length.
MAX_EPOCHS = 100_000


class EpochScope:
    """Feed each epoch-scoped reading (:meth:`global_step`); :meth:`total` is the run's step total."""

    def __init__(self) -> None:
        self.lengths: dict[int, int] = {}  # epoch index (from 0) -> its printed length
        self.base: int | None = None  # the number the first epoch is printed as: 0, or 1
        self._cache: tuple[int, int, int] | None = None  # (epoch index, default length, offset)
        self._last_index = -1

    def index(self, epoch: int) -> int:
        """The epoch's index from 0, as this log numbers its epochs."""
        if self.base is None:
            self.base = 1 if epoch == 1 else 0
        elif epoch < self.base:  # an epoch 0 after all: the log was read from its tail
            self.base, self.lengths, self._cache = 0, {}, None
        return epoch - self.base

    def global_step(self, epoch: int, counter: int, length: int) -> int:
        """The global step of ``counter`` of ``length`` in ``epoch`` (as printed)."""
        i = self.index(epoch)
        if self.lengths.get(i) != length and (i in self.lengths or len(self.lengths) < MAX_EPOCHS):
            self.lengths[i] = length
            if self._cache is not None and i < self._cache[0]:
                self._cache = None
        self._last_index = max(self._last_index, i)
        return self.offset(i, length) + counter

    def offset(self, i: int, length: int) -> int:
        """Steps in the epochs before index ``i`` (``length`` for one never seen)."""
        c = self._cache
        if c is not None and c[0] == i and c[1] == length:
            return c[2]
        off = sum(self.lengths.get(j, length) for j in range(i)) if i < MAX_EPOCHS else i * length
        self._cache = (i, length, off)
        return off

    def total(self, epochs: int | None, epoch: int, length: int, steps_left: bool = False) -> int | None:
        """The run's total steps: ``epochs`` epochs (the current ``length`` for those not seen yet);
        with ``steps_left`` (Lightning, max_steps only) the rule of the module docstring; else None."""
        i = self.index(epoch)
        if steps_left:  # epoch 0's total is its batches or max_steps, whichever is fewer: the bar cannot say which
            before = self.lengths.get(i - 1)
            return self.offset(i, length) + length if before is not None and length < before else None
        if not epochs or epochs <= i:
            return None
        return self.offset(i, length) + length * (epochs - i)
