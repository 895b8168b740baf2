"""The sample voice: a Base model starts with one usable voice, so the demo and a fresh deployment can
speak at once (an espeak-ng clip shipped in assets/)."""

from __future__ import annotations

import logging
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_VOICE = ("sample", ROOT / "assets" / "reference_en.wav",
                "Hello! This short clip is a sample voice for cloning in the demo.")
log = logging.getLogger("tts_engine.serving.sample_voice")


def voice_choices(engine, library) -> list[str]:
    if engine.config.model_type == "custom_voice":
        return list(engine.config.supported_speakers)
    if engine.config.model_type == "voice_design":
        return []
    return [v.name for v in library.list() if v.compatible]


def ensure_sample_voice(engine, library) -> None:
    """A Base model starts with one usable voice (an espeak-ng clip shipped in assets/)."""
    name, clip, transcript = SAMPLE_VOICE
    if engine.config.model_type != "base" or voice_choices(engine, library) or not clip.exists():
        return
    try:
        library.create(name, str(clip), transcript=transcript, engine=engine)
        log.info("created the sample voice %r from %s", name, clip.name)
    except Exception as exc:  # a sample is a convenience, never a reason not to start
        log.warning("could not create the sample voice: %s", exc)
