"""Leading-silence trim of a stream: the released checkpoints often open an utterance with ~80 ms of
digital silence, which a listener hears as latency.

`LeadingSilenceTrimmer` drops samples below `threshold_dbfs` from the start of a stream, chunk by chunk,
at most `max_s` in all: the first sample at or above the threshold (or the sample after the budget)
is the first one delivered. Once it has passed that point it hands every later sample through
untouched, so a stream's audio after the cut is exactly the untrimmed stream's.
"""

from __future__ import annotations

import numpy as np

TRIM_THRESHOLD_DBFS = -60.0
TRIM_MAX_S = 0.2


class LeadingSilenceTrimmer:
    def __init__(self, sample_rate: int, threshold_dbfs: float = TRIM_THRESHOLD_DBFS, max_s: float = TRIM_MAX_S):
        self.threshold = 10 ** (threshold_dbfs / 20)
        self.budget = int(round(max_s * sample_rate))   # samples that may still be dropped
        self.done = self.budget <= 0
        self.trimmed = 0

    def push(self, audio: np.ndarray) -> np.ndarray:
        """This chunk's samples that are delivered (a view; empty while the stream is still silent)."""
        if self.done or audio.size == 0:
            return audio
        loud = np.flatnonzero(np.abs(audio) >= self.threshold)
        cut = min(int(loud[0]) if loud.size else audio.shape[0], self.budget)
        self.budget -= cut
        self.trimmed += cut
        self.done = bool(loud.size) or self.budget == 0
        return audio[cut:]
