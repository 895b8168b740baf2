"""VoiceLibrary on disk, without an engine: a fake cloner stands in for the speaker/codec encoders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from tts_engine.serving import voice_library as voices
from tts_engine.serving.voice_library import (
    CloningUnsupportedError,
    IncompatibleVoiceError,
    InvalidVoiceNameError,
    ModelSignature,
    ReferenceAudioError,
    VoiceDamagedError,
    VoiceExistsError,
    VoiceLibrary,
    VoiceNotFoundError,
    validate_voice_name,
)

ROOT = Path(__file__).resolve().parents[1]
HIDDEN = 16
SIGNATURE = ModelSignature("base", "0b6", HIDDEN)


class FakeCloner:
    """Deterministic stand-in: the speaker vector encodes the clip's length, codes one row per frame."""

    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.calls = []

    def embed(self, wav24):
        self.calls.append(("embed", len(wav24)))
        time.sleep(self.delay)
        return torch.full((HIDDEN,), float(len(wav24)), dtype=torch.float32)

    def encode(self, wav24):
        self.calls.append(("encode", len(wav24)))
        frames = -(-len(wav24) // 1920)
        return torch.arange(frames * 16, dtype=torch.int64).reshape(frames, 16)


def tone(seconds: float, sr: int = 16000, amp: float = 0.3) -> tuple[np.ndarray, int]:
    t = np.arange(round(seconds * sr)) / sr
    return (amp * np.sin(2 * np.pi * 200 * t)).astype(np.float32), sr


@pytest.fixture
def library(tmp_path) -> VoiceLibrary:
    return VoiceLibrary(tmp_path / "voices", SIGNATURE, engine=FakeCloner())


def hidden_entries(lib: VoiceLibrary) -> list[str]:
    return sorted(p.name for p in lib.root.iterdir() if p.name.startswith("."))


# ---------------------------------------------------------------------------------------------------
# Round trip
# ---------------------------------------------------------------------------------------------------


def test_create_list_get_delete_round_trip(library, reference_clip):
    stages = []
    info = library.create("Alice", str(reference_clip), "  The quick brown fox.  ",
                          progress=lambda stage, fraction: stages.append((stage, fraction)))
    assert [s for s, _ in stages] == ["decoding", "speaker_embedding", "reference_codes", "saving", "done"]
    assert [f for _, f in stages] == sorted(f for _, f in stages) and stages[-1][1] == 1.0
    clip_s = sf.info(str(reference_clip)).duration
    assert info.name == "Alice" and info.mode == "icl" and info.transcript == "The quick brown fox."
    assert abs(info.duration_s - clip_s) < 1e-3 and info.notice is None and info.compatible
    assert (info.model_type, info.model_size, info.hidden_size) == ("base", "0b6", HIDDEN)

    folder = library.root / "Alice"
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "prompt.safetensors", "reference.wav"]
    meta = json.loads((folder / "meta.json").read_text())
    assert {"name", "created", "duration_s", "transcript", "mode", "model_type", "model_size",
            "hidden_size"} <= set(meta)
    assert meta["created"].endswith("+00:00") and meta["source_sample_rate"] == 22050
    preview, sr = sf.read(str(library.preview_path("alice")))
    assert sr == 24000 and abs(len(preview) / sr - info.duration_s) < 1e-3

    assert [v.name for v in library.list()] == ["Alice"]
    prompt = library.get("ALICE")
    frames = -(-len(preview) // 1920)
    assert prompt.speaker_vector.dtype == torch.float32 and prompt.speaker_vector.shape == (HIDDEN,)
    assert float(prompt.speaker_vector[0]) == len(preview), "the vector must come from the stored 24 kHz clip"
    assert prompt.ref_codes.dtype == torch.int64 and prompt.ref_codes.shape == (frames, 16)
    assert prompt.ref_text == "The quick brown fox." and not prompt.x_vector_only
    assert library.get("alice") is prompt, "prompts are cached"

    # A fresh library (another process, a restart) reads the same voice back.
    again = VoiceLibrary(library.root, SIGNATURE).get("Alice")
    assert torch.equal(again.speaker_vector, prompt.speaker_vector) and torch.equal(again.ref_codes, prompt.ref_codes)

    assert library.delete("alice").name == "Alice"
    assert library.list() == [] and "Alice" not in library and hidden_entries(library) == []
    with pytest.raises(VoiceNotFoundError):
        library.get("Alice")
    with pytest.raises(VoiceNotFoundError):
        library.delete("Alice")


def test_x_vector_voices_skip_reference_codes(library):
    cloner = FakeCloner()
    stages = []
    info = library.create("Xv", tone(2.0), "words", x_vector_only=True, engine=cloner,
                          progress=lambda s, f: stages.append(s))
    assert info.mode == "x_vector" and info.transcript is None and info.ref_frames == 0
    assert "reference_codes" not in stages and [c for c, _ in cloner.calls] == ["embed"]
    prompt = library.get("xv")
    assert prompt.x_vector_only and prompt.ref_codes is None and prompt.ref_text is None


def test_missing_transcript_falls_back_to_x_vector_with_a_notice(library):
    info = library.create("NoText", tone(2.0), "   ")
    assert info.mode == "x_vector" and "transcript" in info.notice


def test_engine_without_cloner_is_refused(tmp_path):
    class CustomVoiceEngine:
        cloner = None
        config = type("C", (), {"model_type": "custom_voice"})()

    lib = VoiceLibrary(tmp_path / "v", SIGNATURE)
    with pytest.raises(CloningUnsupportedError, match="Base"):
        lib.create("x", tone(2.0), engine=CustomVoiceEngine())
    with pytest.raises(CloningUnsupportedError):
        lib.create("x", tone(2.0))
    assert lib.list() == [] and hidden_entries(lib) == []


# ---------------------------------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["alice", "Bob Smith", "voice_2", "María-José", "小明", "O'Neil (calm)", "a.b",
                                  "x" * 64])
def test_valid_names(name):
    assert validate_voice_name(f"  {name} ") == name


@pytest.mark.parametrize("name, reason", [
    ("", "empty"), ("   ", "empty"), ("x" * 65, "too long"), ("a/b", "separator"), ("a\\b", "separator"),
    ("..", ".."), ("a..b", ".."), ("../../etc", "separator"), (".hidden", "dot"), ("name.", "dot"),
    ("con", "reserved"), ("CON", "reserved"), ("nul.txt", "reserved"), ("com1", "reserved"), ("LPT9", "reserved"),
    ("aux", "reserved"), ("prn", "reserved"), ("default", "reserved"), ("Voices", "reserved"),
    ("what?", "unsupported"), ("a\x00b", "unsupported"), ("tab\tname", "unsupported"), ("😀", "unsupported"),
])
def test_invalid_names_are_rejected_with_a_reason(library, name, reason):
    with pytest.raises(InvalidVoiceNameError, match=reason) as err:
        library.create(name, tone(2.0))
    assert err.value.code == "invalid_voice_name" and err.value.param == "name"
    assert library.list() == [] and hidden_entries(library) == []
    assert not (library.root.parent / "etc").exists()


def test_names_are_unique_ignoring_case(library):
    library.create("Alice", tone(2.0))
    for name in ("Alice", "alice", " ALICE "):
        with pytest.raises(VoiceExistsError) as err:
            library.create(name, tone(2.0))
        assert err.value.code == "voice_exists"
    assert [v.name for v in library.list()] == ["Alice"]


def test_lookups_cannot_escape_the_library(library, tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "meta.json").write_text("{}")
    for name in ("../outside", "..", "/", "", ".", "../voices/../outside"):
        with pytest.raises(VoiceNotFoundError):
            library.delete(name)
    assert (tmp_path / "outside" / "meta.json").exists()


# ---------------------------------------------------------------------------------------------------
# Reference clip validation
# ---------------------------------------------------------------------------------------------------


def test_bad_reference_audio(library, tmp_path):
    text = tmp_path / "notes.wav"
    text.write_text("these are not audio samples " * 20)
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF\x24\x08\x00\x00WAVEfmt " + bytes(range(256)) * 8)
    cases = [
        (str(text), "invalid_audio"), (str(corrupt), "invalid_audio"), (b"", "invalid_audio"),
        (str(tmp_path / "missing.wav"), "invalid_audio"), (b"\x00\x01garbage" * 100, "invalid_audio"),
        ((np.zeros(48000, np.float32), 24000), "audio_silent"),
        ((np.full(48000, 1e-5, np.float32), 24000), "audio_silent"),
        (tone(0.9), "audio_too_short"), ((np.array([0.1, np.nan] * 24000, np.float32), 24000), "invalid_audio"),
    ]
    for source, code in cases:
        with pytest.raises(ReferenceAudioError) as err:
            library.create("Bad", source, "words")
        assert err.value.code == code, (source if not isinstance(source, bytes) else source[:20], err.value)
        assert err.value.param == "file" and str(err.value)
    assert library.list() == [] and hidden_entries(library) == []


def test_file_size_is_checked_before_decoding(library, tmp_path, monkeypatch):
    big = tmp_path / "big.wav"
    with open(big, "wb") as handle:
        handle.truncate(20 * 1024 * 1024 + 1)    # sparse: no 20 MB written to disk

    def must_not_decode(source):
        raise AssertionError("a file over the limit must be refused before decoding")

    monkeypatch.setattr(voices.audio_utils, "load_audio", must_not_decode)
    for source in (str(big), big, bytes(20 * 1024 * 1024 + 1)):
        with pytest.raises(ReferenceAudioError, match="too large") as err:
            library.create("Big", source)
        assert err.value.code == "file_too_large"


def test_long_clip_is_trimmed_with_a_notice(library):
    info = library.create("Long", tone(42.0, sr=8000), x_vector_only=True)
    assert info.trimmed and info.duration_s == 30.0
    assert "42.0 s" in info.notice and "30 s" in info.notice
    _, sr = sf.read(str(library.preview_path("Long")))
    assert sf.info(str(library.preview_path("Long"))).duration == pytest.approx(30.0, abs=1e-3) and sr == 24000
    assert library.list()[0].trimmed


# ---------------------------------------------------------------------------------------------------
# Compatibility and damaged folders
# ---------------------------------------------------------------------------------------------------


def test_voices_of_another_model_are_listed_but_refused(library):
    library.create("Small", tone(2.0), "words")
    big = VoiceLibrary(library.root, ModelSignature("base", "1b7", 32))
    listed = big.list()
    assert [(v.name, v.compatible) for v in listed] == [("Small", False)]
    with pytest.raises(IncompatibleVoiceError, match="0b6") as err:
        big.get("Small")
    assert err.value.code == "incompatible_voice"
    other_type = VoiceLibrary(library.root, ModelSignature("custom_voice", "0b6", HIDDEN))
    assert not other_type.list()[0].compatible
    big.delete("Small")
    assert library.list() == []


def test_damaged_folders_are_skipped_not_fatal(library):
    library.create("Good", tone(2.0), "words")
    (library.root / "NoMeta").mkdir()
    (library.root / "Garbage").mkdir()
    (library.root / "Garbage" / "meta.json").write_text("{not json")
    (library.root / "stray.txt").write_text("a file, not a voice")
    assert [v.name for v in library.list()] == ["Good"]
    with pytest.raises(VoiceDamagedError):
        library.get("Garbage")
    # A voice whose tensors were damaged is reported, not crashed on.
    (library.root / "Good" / "prompt.safetensors").write_bytes(b"\x00" * 10)
    library._cache.clear()
    with pytest.raises(VoiceDamagedError, match="prompt.safetensors"):
        library.get("Good")
    library.delete("Garbage")
    assert not (library.root / "Garbage").exists()
    with pytest.raises(VoiceExistsError, match="file"):
        library.create("STRAY.TXT", tone(2.0))


# ---------------------------------------------------------------------------------------------------
# Atomicity: crashes and failures while saving or deleting
# ---------------------------------------------------------------------------------------------------

KILL_SCRIPT = textwrap.dedent("""
    import os, sys
    import numpy as np, torch
    from tts_engine.serving import voice_library as voices

    root, kill_after = sys.argv[1], int(sys.argv[2])

    class Fake:
        def embed(self, wav):
            return torch.ones(16)
        def encode(self, wav):
            return torch.zeros((-(-len(wav) // 1920), 16), dtype=torch.int64)

    written = []
    real_write = voices._write_file

    def write_then_maybe_die(path, data):
        if len(written) == kill_after:
            real_write(path, data[: len(data) // 2])     # die in the middle of writing this file
            os._exit(17)
        real_write(path, data)
        written.append(path)

    real_rename = os.rename

    def die_before_rename(src, dst):
        if kill_after == 3:
            os._exit(17)
        real_rename(src, dst)

    voices._write_file = write_then_maybe_die
    voices.os.rename = die_before_rename
    lib = voices.VoiceLibrary(root, voices.ModelSignature("base", "0b6", 16), engine=Fake())
    t = np.arange(32000) / 16000
    lib.create("Victim", ((0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), 16000), "some words")
    sys.exit(0)
""")


@pytest.mark.parametrize("kill_after", [0, 2, 3], ids=["in-first-file", "in-meta-file", "before-rename"])
def test_killed_while_saving_leaves_no_partial_voice(tmp_path, kill_after):
    root = tmp_path / "voices"
    library = VoiceLibrary(root, SIGNATURE, engine=FakeCloner())
    library.create("Keeper", tone(2.0), "words")
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(root), str(kill_after)], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 17, proc.stderr[-2000:]
    assert not (root / "Victim").exists(), "a half-written voice is in the library"

    # The library that was open during the crash does not list the half-written voice.
    assert [v.name for v in library.list()] == ["Keeper"]
    with pytest.raises(VoiceNotFoundError):
        library.get("Victim")
    leftovers = [p for p in root.iterdir() if p.name.startswith(".tmp-")]
    assert len(leftovers) == 1, "the crash should leave its temp folder behind"
    assert len(list(leftovers[0].iterdir())) == min(kill_after + 1, 3)

    # A restart cleans the leftovers; the name is free and nothing else was touched.
    restarted = VoiceLibrary(root, SIGNATURE, engine=FakeCloner())
    assert hidden_entries(restarted) == []
    assert [v.name for v in restarted.list()] == ["Keeper"]
    assert restarted.get("Keeper").ref_codes is not None
    restarted.create("Victim", tone(2.0), "words")
    assert [v.name for v in restarted.list()] == ["Keeper", "Victim"]


def test_failed_rename_leaves_nothing_behind(library, monkeypatch):
    def failing_rename(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(voices.os, "rename", failing_rename)
    with pytest.raises(OSError, match="No space"):
        library.create("Unlucky", tone(2.0), "words")
    monkeypatch.undo()
    assert library.list() == [] and hidden_entries(library) == []
    library.create("Unlucky", tone(2.0), "words")
    assert [v.name for v in library.list()] == ["Unlucky"]


def test_failing_progress_callback_cancels_cleanly(library):
    def cancel(stage, fraction):
        if stage == "saving":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        library.create("Cancelled", tone(2.0), progress=cancel)
    assert library.list() == [] and hidden_entries(library) == []


def test_crash_while_deleting_is_completed_on_restart(library, monkeypatch):
    library.create("Doomed", tone(2.0), "words")
    library.create("Kept", tone(2.0), "words")

    def crash(path, ignore_errors=False):
        raise SystemExit("killed between rename and removal")

    monkeypatch.setattr(voices.shutil, "rmtree", crash)
    with pytest.raises(SystemExit):
        library.delete("Doomed")
    monkeypatch.undo()
    assert [v.name for v in library.list()] == ["Kept"], "a voice being deleted disappears at once"
    assert len([n for n in hidden_entries(library) if n.startswith(".trash-")]) == 1
    restarted = VoiceLibrary(library.root, SIGNATURE)
    assert hidden_entries(restarted) == [] and [v.name for v in restarted.list()] == ["Kept"]


def test_live_writers_temp_folders_are_left_alone(library):
    live = library.root / f".tmp-{os.getppid()}-abc"     # our parent is alive: its write may be in progress
    dead = library.root / ".tmp-999999999-abc"
    unnamed = library.root / ".tmp-whatever"
    for folder in (live, dead, unnamed):
        folder.mkdir()
    reopened = VoiceLibrary(library.root, SIGNATURE)     # opening cleans what is stale
    assert hidden_entries(reopened) == [live.name]
    assert reopened.list() == []
    old = time.time() - 2 * 3600
    os.utime(live, (old, old))
    VoiceLibrary(library.root, SIGNATURE)
    assert not live.exists(), "an hour-old temp folder is stale whoever wrote it"


def test_concurrent_creates_of_one_name_keep_exactly_one(library):
    cloner = FakeCloner(delay=0.05)
    results, errors = [], []

    def create(i):
        try:
            results.append(library.create("Same", tone(1.5 + 0.1 * i), "words", engine=cloner))
        except VoiceExistsError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(6)]
    others = [threading.Thread(target=library.create, args=(f"Other {i}", tone(2.0), "w"),
                               kwargs={"engine": cloner}) for i in range(3)]
    for t in threads + others:
        t.start()
    for t in threads + others:
        t.join(timeout=60)
    assert len(results) == 1 and len(errors) == 5
    names = [v.name for v in library.list()]
    assert names == ["Other 0", "Other 1", "Other 2", "Same"] and hidden_entries(library) == []
    assert library.info("Same").duration_s == results[0].duration_s
