"""Leading-silence trim on synthetic audio: what is cut, what is kept, chunk boundaries don't matter."""

from __future__ import annotations

import numpy as np
import pytest

from tts_engine.stages.trim import LeadingSilenceTrimmer

SR = 24000


def _stream(audio: np.ndarray, sizes: list[int], **kw) -> tuple[np.ndarray, LeadingSilenceTrimmer]:
    trimmer = LeadingSilenceTrimmer(SR, **kw)
    out, start = [], 0
    for n in sizes:
        out.append(trimmer.push(audio[start:start + n]))
        start += n
    out.append(trimmer.push(audio[start:]))
    return np.concatenate(out), trimmer


def _tone(seconds: float, amplitude: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    return (amplitude * np.cos(2 * np.pi * 220 * t)).astype(np.float32)   # loud from its first sample


@pytest.mark.parametrize("sizes", [[], [1920], [1920, 3840], [100] * 30, [7, 1913, 3840, 7680]])
def test_digital_silence_is_cut_and_the_rest_is_exact(sizes):
    lead = np.zeros(1920, np.float32)                 # 80 ms of digital silence, as the released models do
    tone = _tone(1.0)
    tone[0] = 0.5                                     # the first loud sample
    out, trimmer = _stream(np.concatenate([lead, tone]), sizes)
    assert trimmer.trimmed == 1920 and np.array_equal(out, tone)


def test_at_most_200_ms_are_cut():
    audio = np.concatenate([np.zeros(SR, np.float32), _tone(0.5)])    # a whole second of silence
    out, trimmer = _stream(audio, [1920, 3840, 7680])
    assert trimmer.trimmed == int(0.2 * SR) and out.shape[0] == audio.shape[0] - int(0.2 * SR)
    assert np.array_equal(out, audio[int(0.2 * SR):])


def test_quiet_but_not_silent_audio_is_kept_and_later_silence_is_untouched():
    quiet = np.full(480, 10 ** (-55 / 20), np.float32)          # -55 dBFS: above the -60 dBFS threshold
    audio = np.concatenate([quiet, np.zeros(4800, np.float32), _tone(0.2)])
    out, trimmer = _stream(audio, [960, 960])
    assert trimmer.trimmed == 0 and np.array_equal(out, audio)
    below = np.full(480, 10 ** (-65 / 20), np.float32)         # -65 dBFS noise floor: trimmed
    out, trimmer = _stream(np.concatenate([below, _tone(0.1)]), [240])
    assert trimmer.trimmed == 480


def test_off_when_the_budget_is_zero():
    audio = np.concatenate([np.zeros(2000, np.float32), _tone(0.1)])
    out, trimmer = _stream(audio, [1000], max_s=0.0)
    assert trimmer.trimmed == 0 and np.array_equal(out, audio)


def test_a_stream_route_trims_its_first_chunks_and_counts_it():
    import torch

    from tts_engine.config import ChunkSchedule
    from tts_engine.processors.qwen3_tts import ChunkConnector, talker2code2wav_async_chunk
    from tts_engine.stages.route import Route

    delivered = []
    route = Route("r", talker2code2wav_async_chunk, ChunkConnector(ChunkSchedule()), pipeline=None,
                  deliver=delivered.append, on_done=lambda rid: None, stage1_device=torch.device("cpu"),
                  trimmer=LeadingSilenceTrimmer(SR))
    tone = _tone(0.16)
    route.on_output("r", 0, np.zeros(1920, np.float32), False, None)            # 80 ms of digital silence
    route.on_output("r", 1, np.concatenate([np.zeros(960, np.float32), tone[:2880]]), False, None)
    route.on_output("r", 2, tone[2880:], True, None)
    assert [c.audio.shape[0] for c in delivered] == [0, 2880, tone.shape[0] - 2880]
    assert np.array_equal(np.concatenate([c.audio for c in delivered]), tone)
    assert delivered[-1].metrics.trimmed_samples == 2880 and delivered[-1].total_generated == tone.shape[0]
    assert delivered[-1].metrics.first_chunk_s is not None   # set by the first chunk that carries audio
