"""`python -m tts_engine synth` writes a 24 kHz WAV from a local checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import soundfile as sf

ROOT = Path(__file__).resolve().parents[1]


def test_cli_synth_writes_wav(checkpoints, tmp_path, reference_clip):
    out = tmp_path / "out.wav"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "tts_engine", "synth", "--model", str(checkpoints["base"]), "--text", "Hello there.",
         "--ref-audio", str(reference_clip), "--x-vector-only", "--language", "english", "--greedy",
         "--max-new-tokens", "12", "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    wav, sr = sf.read(out)
    assert sr == 24000 and wav.ndim == 1 and len(wav) > 0 and len(wav) % 1920 == 0
    assert "wrote" in proc.stdout


def test_cli_reports_bad_model(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tts_engine", "synth", "--model", str(tmp_path), "--text", "x",
                           "--out", str(tmp_path / "o.wav")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == 2 and "config.json: file not found" in proc.stderr
