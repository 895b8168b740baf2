"""The voice cloner of a Base checkpoint: reference clip -> `VoicePrompt`.

Mirrors the official `create_voice_clone_prompt`: the clip is loaded mono at its native rate, the codec
encoder and the speaker encoder each resample it to 24 kHz (librosa soxr_hq), and only ICL prompts keep
the reference codes and transcript. It lives with the model (not with the product's voice library) so
the engine core needs nothing from `serving/`.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from tts_engine import audio as audio_utils
from tts_engine.request import RequestError, VoicePrompt

CODEC_RATE = 24000


class VoiceCloner:
    """Speaker encoder + codec encoder of a Base checkpoint: reference clip -> `VoicePrompt`."""

    def __init__(self, config, device: torch.device):
        from tts_engine.models.qwen3_tts.codec_encoder import ReferenceAudioEncoder
        from tts_engine.models.qwen3_tts.config import CheckpointError
        from tts_engine.models.qwen3_tts.speaker_encoder import SpeakerEncoder
        from tts_engine.models.qwen3_tts.weights import read_prefixed

        self.config = config
        self.speaker_encoder = SpeakerEncoder(config.speaker_encoder)
        try:
            self.speaker_encoder.load_official_state_dict(read_prefixed(config.path, "speaker_encoder."))
        except ValueError as exc:
            raise CheckpointError(f"{config.path / 'model.safetensors'}: speaker encoder: {exc}") from exc
        self.speaker_encoder.to(device).eval()
        self.encoder = ReferenceAudioEncoder.from_folder(config.path / "speech_tokenizer", device=device)
        self._lock = threading.Lock()   # the encoders are not re-entrant under concurrent callers

    def embed(self, wav24: np.ndarray) -> torch.Tensor:
        """x-vector [H] (CPU float32) of a mono 24 kHz clip."""
        with self._lock, torch.inference_mode():
            try:
                return self.speaker_encoder.embed(wav24).float().cpu()
            except ValueError as exc:
                raise RequestError(f"ref_audio: {exc}") from exc

    def encode(self, wav24: np.ndarray) -> torch.Tensor:
        """Reference codes [T, 16] (CPU int64) of a mono 24 kHz clip."""
        with self._lock, torch.inference_mode():
            try:
                return self.encoder.encode(wav24, CODEC_RATE).cpu()
            except ValueError as exc:
                raise RequestError(f"ref_audio: {exc}") from exc

    def create(self, ref_audio, ref_text: str | None, x_vector_only: bool) -> VoicePrompt:
        try:
            wav, sr = audio_utils.load_audio(ref_audio)
            wav24 = audio_utils.resample(wav, sr, CODEC_RATE)
        except audio_utils.AudioError as exc:
            raise RequestError(f"ref_audio: {exc}") from exc
        except TypeError as exc:
            raise RequestError(f"ref_audio: {exc}") from exc
        vector = self.embed(wav24)
        codes = None if x_vector_only else self.encode(wav24)
        return VoicePrompt(speaker_vector=vector, ref_codes=codes,
                           ref_text=None if x_vector_only else ref_text, x_vector_only=x_vector_only)
