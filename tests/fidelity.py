"""Assertions shared by the fidelity tests: our engine against the official reference."""

from __future__ import annotations

import numpy as np

WAVE_TOLERANCE = 1e-3
MAX_NEW_TOKENS = 24


def assert_same_output(result, ref_codes: np.ndarray, ref_wav: np.ndarray) -> None:
    assert ref_codes.shape[0] >= 2, "reference produced almost nothing; the comparison would be vacuous"
    assert result.codes.shape == ref_codes.shape, f"frames {result.codes.shape} vs reference {ref_codes.shape}"
    mismatch = np.argwhere(result.codes != ref_codes)
    assert mismatch.size == 0, f"codes differ first at (frame, codebook) {tuple(mismatch[0])}"
    assert result.sample_rate == 24000
    assert result.audio.dtype == np.float32
    assert result.audio.shape == ref_wav.shape
    diff = float(np.abs(result.audio - ref_wav).max())
    assert diff <= WAVE_TOLERANCE, f"waveform max abs diff {diff}"
    assert float(np.abs(result.audio).max()) > 1e-3, "decoded audio is silent"
