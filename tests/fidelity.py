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


def engine_fixture(kind: str, **options):
    """A module-scoped engine on the session's tiny `kind` checkpoint (engines take ~40 s to start)."""
    import pytest

    from tts_engine import TTSEngine

    @pytest.fixture(scope="module")
    def engine(checkpoints):
        eng = TTSEngine.from_pretrained(checkpoints[kind], **options)
        yield eng
        eng.close()

    return engine


def check_against_reference(engine, folder, method: str, non_streaming: bool, **kwargs) -> None:
    """Greedy, float32: our engine must give the reference's codes and (within 1e-3) its waveform."""
    from tests.reference import run_reference
    from tts_engine import SpeechRequest

    ref_codes, ref_wav = run_reference(str(folder), method, non_streaming_mode=non_streaming,
                                       max_new_tokens=MAX_NEW_TOKENS, **kwargs)
    result = engine.synthesize(SpeechRequest(**kwargs, non_streaming_mode=non_streaming, do_sample=False,
                                             subtalker_do_sample=False, max_new_tokens=MAX_NEW_TOKENS))
    assert_same_output(result, ref_codes, ref_wav)
