"""Which tqdm bar is the training bar, told by its description's words (a plain loop's ``train``, a
Trainer's none, Lightning's ``Epoch 3``) and never an evaluation's, a tokenizer's or a checkpoint's.

:class:`~stepwatch.monitors.parsers.hf_progress.ProgressTracker` with ``desc=TRAINING_BARS`` locks on
the first bar of a training or neutral description and hands over by the rule of its
``_desc_is_training``. Standard library only.
"""

from __future__ import annotations

import re

#: ``ProgressTracker(desc=TRAINING_BARS)``: the training bar is told by its description's role
#: (:func:`bar_role`), whatever the words: ``train``, ``Training``, ``epoch``, none at all.
TRAINING_BARS = "*"
#: Descriptions of bars that are never the training bar: preprocessing, checkpoints, evaluation.
_OTHER_DESC = re.compile(r"\b(?:map|filter|token|shard|checkpoint|load|writ|sav|download|upload|fetch|convert|"
                         r"eval|valid|test|predict|sanity|generat|infer|preprocess|prepar|cach|export)", re.I)
#: Descriptions that name training itself.
_TRAIN_DESC = re.compile(r"train|epoch|step|iter|\bfit|optimi", re.I)
ROLE_TRAIN, ROLE_NEUTRAL, ROLE_OTHER = 2, 1, 0


def bar_role(desc: str) -> int:
    """How a bar's description speaks of it: ROLE_TRAIN (``train``, ``Epoch 3``, ``steps``), ROLE_OTHER
    (``Map``, ``Writing model shards``, ``Validation``, ``eval``), else ROLE_NEUTRAL (none, or other words).
    An evaluation word wins over a training one (``Validation DataLoader 0``, ``eval step``)."""
    if _OTHER_DESC.search(desc):
        return ROLE_OTHER
    return ROLE_TRAIN if _TRAIN_DESC.search(desc) else ROLE_NEUTRAL
