"""The voice library: cloned voices kept on disk, shared by every route (and every replica).

`VoiceLibrary` stores cloned voices in a folder (the app's `voices/`), one sub-folder per voice::

    voices/<name>/meta.json           name, created, duration_s, transcript, mode, model it fits, ...
    voices/<name>/prompt.safetensors  speaker_vector [H] float32, ref_codes [T, 16] int64 (ICL only)
    voices/<name>/reference.wav       the (trimmed) reference clip at 24 kHz, 16-bit, for preview

A voice is written into a hidden temporary sibling (`voices/.tmp-<pid>-<uuid>`) and renamed into
place in one `os.rename`, so a reader never sees a half-written voice; deleting renames the folder
to `voices/.trash-<uuid>` before removing it. Leftovers of a crash are skipped by `list()` and
removed when a library is opened.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
import unicodedata
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from tts_engine import audio as audio_utils
from tts_engine.request import RequestError, VoicePrompt

log = logging.getLogger(__name__)

CODEC_RATE = 24000
SAMPLES_PER_FRAME = 1920      # 12.5 Hz codec frames at 24 kHz


class Cloner(Protocol):
    """What `VoiceLibrary.create` needs from a cloner (`models.qwen3_tts.cloner.VoiceCloner`, or a fake)."""

    def embed(self, wav24: np.ndarray) -> torch.Tensor: ...

    def encode(self, wav24: np.ndarray) -> torch.Tensor: ...


# ---------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------


class VoiceLibraryError(RequestError):
    """A voice-library request that cannot be served; `code` is machine-readable, `param` the input."""

    code = "invalid_voice_request"
    param: str | None = None

    def __init__(self, message: str, code: str | None = None, param: str | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code
        if param is not None:
            self.param = param


class InvalidVoiceNameError(VoiceLibraryError):
    code, param = "invalid_voice_name", "name"


class VoiceExistsError(VoiceLibraryError):
    """The name is taken (names are unique ignoring case). HTTP: 409 Conflict."""

    code, param = "voice_exists", "name"


class VoiceNotFoundError(VoiceLibraryError):
    code, param = "voice_not_found", "voice"


class UnknownVoiceError(VoiceLibraryError):
    """A request field names a voice that does not exist (a 400; `VoiceNotFoundError` is a URL's 404)."""

    code, param = "unknown_voice", "voice"


class IncompatibleVoiceError(VoiceLibraryError):
    """The voice was cloned with a different model (type, size or hidden size)."""

    code, param = "incompatible_voice", "voice"


class ReferenceAudioError(VoiceLibraryError):
    """Bad reference clip. Codes: invalid_audio, audio_silent, audio_too_short, file_too_large."""

    code, param = "invalid_audio", "file"


class CloningUnsupportedError(VoiceLibraryError):
    code, param = "cloning_unsupported", None


class VoiceDamagedError(VoiceLibraryError):
    """A stored voice cannot be read back (edited or damaged on disk): a server-side problem."""

    code, param = "voice_damaged", "voice"


# ---------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSignature:
    """Which model a voice prompt fits: prompts only transfer between identical talkers."""

    model_type: str      # base | custom_voice | voice_design
    model_size: str      # 0b6 | 1b7 ...
    hidden_size: int     # talker hidden size = speaker vector length

    @classmethod
    def of(cls, config) -> ModelSignature:
        """From a `Qwen3TTSConfig` (or a signature, returned as is)."""
        if isinstance(config, ModelSignature):
            return config
        return cls(config.model_type, config.model_size, int(config.talker.shape.hidden_size))

    def describe(self) -> str:
        return f"{self.model_type} {self.model_size or '?'} (hidden size {self.hidden_size})"


@dataclass
class VoiceInfo:
    """A library voice as listed (metadata only; `VoiceLibrary.get` loads the prompt)."""

    name: str
    created: str                  # ISO 8601, UTC
    duration_s: float             # of the stored (trimmed) reference clip
    transcript: str | None
    mode: str                     # icl | x_vector
    model_type: str
    model_size: str
    hidden_size: int
    compatible: bool = True       # fits the library's model
    ref_frames: int = 0           # ICL reference codes length
    trimmed: bool = False         # the uploaded clip was longer than the limit and was cut
    notice: str | None = None     # set by `create` only: what the caller should know (trim, mode)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


ProgressCallback = Callable[[str, float], None]
"""`progress(stage, fraction)`: stage in decoding | speaker_embedding | reference_codes | saving | done;
fraction of the whole job in [0, 1]. An exception raised by the callback cancels the creation."""

META_FILE, PROMPT_FILE, PREVIEW_FILE = "meta.json", "prompt.safetensors", "reference.wav"
FORMAT_VERSION = 1
MAX_NAME_CHARS = 64
_MAX_NAME_BYTES = 200                 # file-system limit is 255 bytes per path component
_TMP_PREFIX, _TRASH_PREFIX = ".tmp-", ".trash-"
_STALE_AFTER_S = 3600.0              # temp folders older than this are stale whoever made them
_NAME_EXTRA_CHARS = " -_.'()"
_WINDOWS_RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))}
RESERVED_NAMES = frozenset(_WINDOWS_RESERVED | {"default", "voices"})
_IN_FLIGHT: set[str] = set()          # temp folders this process is writing right now
_IN_FLIGHT_LOCK = threading.Lock()


def validate_voice_name(name: Any) -> str:
    """Return the normalized (NFC, stripped) name or raise `InvalidVoiceNameError` saying why."""
    if not isinstance(name, str):
        raise InvalidVoiceNameError(f"voice name must be a string, got {type(name).__name__}")
    name = unicodedata.normalize("NFC", name).strip()
    if not name:
        raise InvalidVoiceNameError("voice name is empty")
    if len(name) > MAX_NAME_CHARS or len(name.encode("utf-8")) > _MAX_NAME_BYTES:
        raise InvalidVoiceNameError(f"voice name is too long ({len(name)} characters; at most {MAX_NAME_CHARS})")
    if "/" in name or "\\" in name or os.sep in name or (os.altsep and os.altsep in name):
        raise InvalidVoiceNameError(f"voice name {name!r} must not contain path separators (/ or \\)")
    if ".." in name:
        raise InvalidVoiceNameError(f"voice name {name!r} must not contain '..'")
    if name.startswith("."):
        raise InvalidVoiceNameError(f"voice name {name!r} must not start with a dot")
    bad = sorted({c for c in name if not (c.isalnum() or c in _NAME_EXTRA_CHARS)})
    if bad:
        shown = ", ".join(repr(c) for c in bad[:5])
        raise InvalidVoiceNameError(f"voice name {name!r} contains unsupported characters ({shown}); use letters, "
                                    f"digits, spaces and {_NAME_EXTRA_CHARS.strip()!s}")
    if name.endswith("."):
        raise InvalidVoiceNameError(f"voice name {name!r} must not end with a dot")
    if name.lower() in RESERVED_NAMES or name.split(".")[0].strip().lower() in _WINDOWS_RESERVED:
        raise InvalidVoiceNameError(f"voice name {name!r} is reserved; choose another name")
    return name


# ---------------------------------------------------------------------------------------------------
# The library
# ---------------------------------------------------------------------------------------------------


class VoiceLibrary:
    """Cloned voices on disk, usable by every request of a model they fit (thread-safe).

    `root` is the library folder itself (the app passes `<repo>/voices`); `engine_config` is the
    serving model's `Qwen3TTSConfig` (or a `ModelSignature`): voices cloned for another model are
    listed with `compatible=False` and `get` refuses them. `engine` (optional) is the default
    `TTSEngine` (or cloner) `create` uses.
    """

    def __init__(self, root: str | os.PathLike, engine_config, engine=None, *,
                 min_clip_s: float = 1.0, max_clip_s: float = 30.0, max_file_bytes: int = 20 * 1024 * 1024,
                 max_transcript_chars: int = 2000):
        self.root = Path(root)
        self.signature = ModelSignature.of(engine_config)
        self.engine = engine
        self.min_clip_s, self.max_clip_s = float(min_clip_s), float(max_clip_s)
        self.max_file_bytes = int(max_file_bytes)
        self.max_transcript_chars = int(max_transcript_chars)
        self._lock = threading.RLock()
        self._cache: dict[str, tuple[tuple | None, VoicePrompt]] = {}   # folder -> (meta.json stamp, prompt)
        self.root.mkdir(parents=True, exist_ok=True)
        self.clean_stale()

    # ---- reading -----------------------------------------------------------------------------------
    def list(self) -> list[VoiceInfo]:
        """Every readable voice, sorted by name (case-insensitive); damaged folders are logged and skipped."""
        with self._lock:
            voices = []
            for folder in self._folders():
                try:
                    voices.append(self._read_info(folder))
                except VoiceDamagedError as exc:
                    log.warning("skipping voice folder %s: %s", folder, exc)
            return sorted(voices, key=lambda v: (v.name.casefold(), v.name))

    def info(self, name: str) -> VoiceInfo:
        with self._lock:
            return self._read_info(self._folder(name))

    def get(self, name: str) -> VoicePrompt:
        """The voice prompt of `name` (cached), for `SpeechRequest(voice=...)`."""
        with self._lock:
            folder = self._folder(name)
            stamp = _stamp(folder)
            cached = self._cache.get(folder.name)
            if cached is not None and cached[0] == stamp:
                return cached[1]
            info = self._read_info(folder)
            if not info.compatible:
                raise IncompatibleVoiceError(
                    f"voice {info.name!r} was cloned with a {self._signature_of(info).describe()} model and cannot be "
                    f"used with this {self.signature.describe()} model; clone it again from its reference clip")
            prompt = self._read_prompt(folder, info)
            # keyed on meta.json's identity: a voice deleted and created again under the same name by another
            # process (another replica on the shared folder) is a new file and is read again
            self._cache[folder.name] = (stamp, prompt)
            return prompt

    def preview_path(self, name: str) -> Path:
        """The stored 24 kHz reference clip (wav) of `name`."""
        with self._lock:
            path = self._folder(name) / PREVIEW_FILE
            if not path.is_file():
                raise VoiceDamagedError(f"voice {name!r} has no reference clip on disk")
            return path

    def __contains__(self, name: str) -> bool:
        try:
            self._folder(name)
        except VoiceNotFoundError:
            return False
        return True

    # ---- writing -----------------------------------------------------------------------------------
    def create(self, name: str, audio_source, transcript: str | None = None, x_vector_only: bool = False,
               engine=None, progress: ProgressCallback | None = None) -> VoiceInfo:
        """Clone a voice from `audio_source` (path, file bytes or (array, sr)) and save it as `name`.

        ICL (speaker vector + reference codes + transcript) when a transcript is given; without one,
        or with `x_vector_only`, only the speaker vector is kept (the returned `notice` says so).
        A clip longer than the limit is cut (notice). Raises `VoiceLibraryError` subclasses
        (`InvalidVoiceNameError`, `VoiceExistsError`, `ReferenceAudioError`, ...).
        """
        name = validate_voice_name(name)
        report = progress or (lambda stage, fraction: None)
        notices: list[str] = []
        transcript = transcript.strip() if isinstance(transcript, str) else None
        transcript = transcript or None
        if transcript is not None and len(transcript) > self.max_transcript_chars:
            raise VoiceLibraryError(f"transcript is too long ({len(transcript)} characters; at most "
                                    f"{self.max_transcript_chars})", code="transcript_too_long", param="transcript")
        if not x_vector_only and transcript is None:
            x_vector_only = True
            notices.append("No transcript was given, so the voice keeps only the speaker embedding (x-vector "
                           "mode); add the clip's transcript for closer cloning (ICL mode).")
        if x_vector_only:
            transcript_kept = None
        else:
            transcript_kept = transcript
        cloner = self._cloner(engine)
        with self._lock:
            self._check_free(name)      # fail fast; checked again when committing

        report("decoding", 0.0)
        wav, source_sr = self._decode(audio_source)
        original_s = audio_utils.duration_s(wav, source_sr)
        try:
            wav, trim_notice = audio_utils.check_reference_clip(wav, source_sr, self.min_clip_s, self.max_clip_s)
            wav24 = audio_utils.resample(wav, source_sr, CODEC_RATE)
        except audio_utils.AudioError as exc:
            raise ReferenceAudioError(f"reference audio: {exc}") from exc
        if trim_notice:
            notices.insert(0, trim_notice)

        report("speaker_embedding", 0.2)
        vector = _as_tensor(cloner.embed(wav24), torch.float32).reshape(-1)
        if vector.shape[0] != self.signature.hidden_size:
            raise CloningUnsupportedError(
                f"the cloner produced a {vector.shape[0]}-dim speaker vector, but this library's model "
                f"({self.signature.describe()}) needs {self.signature.hidden_size}")
        codes = None
        if not x_vector_only:
            report("reference_codes", 0.5)
            codes = _as_tensor(cloner.encode(wav24), torch.int64)
            if codes.ndim != 2 or codes.shape[1] != 16 or codes.shape[0] == 0:
                raise CloningUnsupportedError(f"the cloner produced reference codes of shape {tuple(codes.shape)}, "
                                              "expected [frames, 16]")

        report("saving", 0.8)
        info = VoiceInfo(
            name=name, created=datetime.now(UTC).isoformat(timespec="seconds"),
            duration_s=round(len(wav24) / CODEC_RATE, 3), transcript=transcript_kept,
            mode="x_vector" if x_vector_only else "icl", model_type=self.signature.model_type,
            model_size=self.signature.model_size, hidden_size=self.signature.hidden_size,
            ref_frames=0 if codes is None else int(codes.shape[0]), trimmed=bool(trim_notice))
        meta = {**info.to_dict(), "format_version": FORMAT_VERSION, "sample_rate": CODEC_RATE,
                "original_duration_s": round(original_s, 3), "source_sample_rate": int(source_sr)}
        for key in ("compatible", "notice"):
            meta.pop(key)
        self._save(name, meta, vector, codes, wav24)
        report("done", 1.0)
        info.notice = " ".join(notices) or None
        return info

    def delete(self, name: str) -> VoiceInfo | None:
        """Remove `name` (atomically: it disappears in one rename, then its files are removed)."""
        with self._lock:
            folder = self._folder(name)
            try:
                info = self._read_info(folder)
            except VoiceDamagedError:
                info = None
            trash = self.root / f"{_TRASH_PREFIX}{uuid.uuid4().hex}"
            os.rename(folder, trash)
            _fsync_dir(self.root)
            self._cache.pop(folder.name, None)
        shutil.rmtree(trash, ignore_errors=True)
        return info

    def clean_stale(self) -> list[Path]:
        """Remove temp and trash folders a crashed writer left behind; return what was removed."""
        removed = []
        with self._lock:
            for entry in self.root.iterdir():
                if not entry.is_dir() or not (entry.name.startswith(_TMP_PREFIX) or entry.name.startswith(_TRASH_PREFIX)):
                    continue
                if entry.name.startswith(_TMP_PREFIX) and not _is_stale_tmp(entry):
                    continue
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
                log.info("removed stale voice-library folder %s", entry)
        return removed

    # ---- internals ---------------------------------------------------------------------------------
    def _cloner(self, engine) -> Cloner:
        target = engine if engine is not None else self.engine
        if target is None:
            raise CloningUnsupportedError("no engine given to clone the voice with")
        cloner = getattr(target, "cloner", target)
        if cloner is None or not (hasattr(cloner, "embed") and hasattr(cloner, "encode")):
            kind = getattr(getattr(target, "config", None), "model_type", None)
            if kind is None:
                raise CloningUnsupportedError(f"{type(target).__name__} cannot clone voices (no embed/encode)")
            raise CloningUnsupportedError(f"voice cloning needs a Base checkpoint; the loaded model is {kind}")
        return cloner

    def _decode(self, source) -> tuple[np.ndarray, int]:
        """Size check (before decoding), then decode; every failure becomes a `ReferenceAudioError`."""
        limit_mb = self.max_file_bytes / (1024 * 1024)
        size = None
        if isinstance(source, (bytes, bytearray, memoryview)):
            size = len(source)
        elif isinstance(source, (str, os.PathLike)):
            try:
                size = os.stat(source).st_size
            except OSError as exc:
                raise ReferenceAudioError(f"reference audio file cannot be read: {exc.strerror or exc}") from exc
        elif isinstance(source, tuple):
            size = None
        else:
            raise ReferenceAudioError(f"unsupported reference audio type {type(source).__name__}")
        if size is not None and size > self.max_file_bytes:
            raise ReferenceAudioError(f"reference audio file is too large ({size / (1024 * 1024):.1f} MB; at most "
                                      f"{limit_mb:g} MB)", code="file_too_large")
        try:
            wav, sr = audio_utils.load_audio(source)
        except (audio_utils.AudioError, TypeError) as exc:
            detail = _OBJECT_REPR.sub("the upload", str(exc))
            raise ReferenceAudioError(f"reference audio: {detail}") from exc
        if audio_utils.is_silent(wav):
            raise ReferenceAudioError(f"reference audio is silent (peak {audio_utils.peak_dbfs(wav):.1f} dBFS)",
                                      code="audio_silent")
        length = audio_utils.duration_s(wav, sr)
        if length < self.min_clip_s:
            raise ReferenceAudioError(f"reference audio is too short: {length:.2f} s (at least {self.min_clip_s:g} s)",
                                      code="audio_too_short")
        return wav, sr

    def _save(self, name: str, meta: dict, vector: torch.Tensor, codes: torch.Tensor | None,
              wav24: np.ndarray) -> None:
        from safetensors.torch import save as save_tensors

        tmp = self.root / f"{_TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex}"
        with _IN_FLIGHT_LOCK:
            _IN_FLIGHT.add(str(tmp))
        try:
            tmp.mkdir()
            tensors = {"speaker_vector": vector.contiguous()}
            if codes is not None:
                tensors["ref_codes"] = codes.contiguous()
            _write_file(tmp / PROMPT_FILE, save_tensors(tensors, metadata={"format_version": str(FORMAT_VERSION)}))
            _write_file(tmp / PREVIEW_FILE, audio_utils.encode_audio(wav24, CODEC_RATE, "wav"))
            # meta.json last: a folder with meta.json is a complete voice, even without the rename guarantee.
            _write_file(tmp / META_FILE, json.dumps(meta, indent=1, ensure_ascii=False).encode("utf-8"))
            _fsync_dir(tmp)
            with self._lock:
                self._check_free(name)
                os.rename(tmp, self.root / name)
                _fsync_dir(self.root)
                self._cache.pop(name, None)
        finally:
            with _IN_FLIGHT_LOCK:
                _IN_FLIGHT.discard(str(tmp))
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def _check_free(self, name: str) -> None:
        """Names are unique ignoring case (case-insensitive file systems could not hold both)."""
        for entry in self.root.iterdir():
            if entry.name.startswith(".") or entry.name.casefold() != name.casefold():
                continue
            if entry.is_dir():
                raise VoiceExistsError(f"a voice named {entry.name!r} already exists; delete it first or choose "
                                       "another name")
            raise VoiceExistsError(f"the name {entry.name!r} is taken by a file in the voice library folder")

    def _folders(self) -> list[Path]:
        try:
            entries = list(self.root.iterdir())
        except FileNotFoundError:
            self.root.mkdir(parents=True, exist_ok=True)
            return []
        return [e for e in entries if e.is_dir() and not e.name.startswith(".")]

    def _folder(self, name: str) -> Path:
        """The folder of `name`: exact match first, then ignoring case. Only existing entries are
        returned, so no name (`..`, `a/b`) can point outside the library."""
        if not isinstance(name, str) or not name.strip():
            raise VoiceNotFoundError("voice name is empty")
        wanted = unicodedata.normalize("NFC", name).strip()
        folders = self._folders()
        for folder in folders:
            if folder.name == wanted:
                return folder
        for folder in folders:
            if folder.name.casefold() == wanted.casefold():
                return folder
        raise VoiceNotFoundError(f"no voice named {name!r} in the library")

    def _read_info(self, folder: Path) -> VoiceInfo:
        try:
            meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
            if not isinstance(meta, dict):
                raise TypeError("meta.json is not an object")
            info = VoiceInfo(
                name=folder.name, created=str(meta.get("created", "")),
                duration_s=float(meta.get("duration_s", 0.0)), transcript=meta.get("transcript"),
                mode=str(meta["mode"]), model_type=str(meta["model_type"]), model_size=str(meta.get("model_size", "")),
                hidden_size=int(meta["hidden_size"]), ref_frames=int(meta.get("ref_frames", 0)),
                trimmed=bool(meta.get("trimmed", False)))
        except FileNotFoundError as exc:
            raise VoiceDamagedError(f"voice folder {folder.name!r} has no {META_FILE}") from exc
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise VoiceDamagedError(f"voice {folder.name!r} has unreadable metadata: {exc}") from exc
        if info.mode not in ("icl", "x_vector"):
            raise VoiceDamagedError(f"voice {folder.name!r} has unknown mode {info.mode!r}")
        info.compatible = self._signature_of(info) == self.signature
        return info

    @staticmethod
    def _signature_of(info: VoiceInfo) -> ModelSignature:
        return ModelSignature(info.model_type, info.model_size, info.hidden_size)

    def _read_prompt(self, folder: Path, info: VoiceInfo) -> VoicePrompt:
        from safetensors.torch import load as load_tensors

        try:
            tensors = load_tensors((folder / PROMPT_FILE).read_bytes())
        except Exception as exc:
            raise VoiceDamagedError(f"voice {info.name!r}: cannot read {PROMPT_FILE}: {exc}") from exc
        vector = tensors.get("speaker_vector")
        if vector is None or vector.dtype != torch.float32 or tuple(vector.shape) != (info.hidden_size,):
            raise VoiceDamagedError(f"voice {info.name!r}: speaker_vector missing or not float32 "
                                    f"[{info.hidden_size}]")
        if info.mode == "x_vector":
            return VoicePrompt(speaker_vector=vector, x_vector_only=True)
        codes = tensors.get("ref_codes")
        if codes is None or codes.dtype != torch.int64 or codes.ndim != 2 or codes.shape[1] != 16 or not len(codes):
            raise VoiceDamagedError(f"voice {info.name!r}: ref_codes missing or not int64 [frames, 16]")
        if not info.transcript:
            raise VoiceDamagedError(f"voice {info.name!r}: an ICL voice needs its transcript")
        return VoicePrompt(speaker_vector=vector, ref_codes=codes, ref_text=info.transcript, x_vector_only=False)


# ---------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------


def _as_tensor(value, dtype: torch.dtype) -> torch.Tensor:
    tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
    return tensor.detach().to("cpu", dtype)


def _stamp(folder: Path) -> tuple | None:
    """Identity of a voice's meta.json (inode, mtime, size): changes when the voice is written again."""
    try:
        st = (folder / META_FILE).stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    """Make a rename/creation in `path` durable (best effort: not every platform can open folders)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_OBJECT_REPR = re.compile(r"<_io\.\w+ object at 0x[0-9a-fA-F]+>")
_TMP_RE = re.compile(rf"^{re.escape(_TMP_PREFIX)}(\d+)-")


def _is_stale_tmp(folder: Path) -> bool:
    """A temp folder is stale unless its writer (the pid in its name) is still running it."""
    with _IN_FLIGHT_LOCK:
        if str(folder) in _IN_FLIGHT:
            return False
    try:
        if time.time() - folder.stat().st_mtime > _STALE_AFTER_S:
            return True
    except OSError:
        return True
    match = _TMP_RE.match(folder.name)
    if match is None:
        return True
    pid = int(match.group(1))
    if pid == os.getpid():
        return True         # ours, and not in flight: left by an aborted write in this process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False        # exists, owned by someone else
    return False




#: OpenAI's built-in voice names: they mean a voice here only through the alias table
#: (`ServingSettings.voice_aliases`, e.g. ``TTS_VOICE_ALIASES="alloy=sample,nova=alice"``).
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse",
                 "marin", "cedar")


def voice_request_fields(config, library: VoiceLibrary, voice: str | None, instructions: str | None,
                         aliases: dict[str, str] | None = None) -> tuple[dict[str, Any], str | None]:
    """`SpeechRequest` fields for a voice name, and the name actually used.

    CustomVoice speaks its preset speakers (instructions allowed), VoiceDesign a described voice
    (instructions required, `voice` ignored), Base a library voice. One function for the HTTP API, the
    UI and the realtime routes, so every caller accepts and refuses the same things. `aliases` maps
    other names (OpenAI's `alloy`, `nova`, ...; case-insensitive) to voices; a real voice of the same
    name wins over an alias.
    """
    name = voice.strip() if isinstance(voice, str) and voice.strip() else None
    instructions = instructions.strip() if instructions and instructions.strip() else None
    if name is not None and aliases:
        known = name.lower() in config.talker.speakers if config.model_type == "custom_voice" else name in library
        target = {k.lower(): v for k, v in aliases.items()}.get(name.lower())
        if target and not known:
            name = target
    try:
        return _voice_fields(config, library, name, instructions)
    except UnknownVoiceError as exc:
        if name is not None and name.lower() in OPENAI_VOICES:
            raise UnknownVoiceError(f"{exc}. {name!r} is an OpenAI voice name: map it to one of ours in the voice "
                                    "alias table (TTS_VOICE_ALIASES, e.g. 'alloy=sample')") from None
        raise


def _voice_fields(config, library: VoiceLibrary, name: str | None,
                  instructions: str | None) -> tuple[dict[str, Any], str | None]:
    if config.model_type == "custom_voice":
        speakers = config.supported_speakers
        if name is None:
            raise VoiceLibraryError(f"voice is required: one of the preset speakers {', '.join(speakers)}",
                                    code="voice_required", param="voice")
        if name.lower() in config.talker.speakers:
            return {"speaker": name.lower(), "instruct": instructions}, name.lower()
        if name in library:
            raise VoiceLibraryError(f"voice {name!r} is a cloned voice; this CustomVoice model speaks only its "
                                    f"preset speakers: {', '.join(speakers)}", code="incompatible_voice",
                                    param="voice")
        raise UnknownVoiceError(f"unknown voice {name!r}; available: {', '.join(speakers)}")
    if config.model_type == "voice_design":
        if instructions is None:
            raise VoiceLibraryError("instructions are required for a VoiceDesign model: describe the voice "
                                    "(e.g. 'a calm, deep male voice')", code="instructions_required",
                                    param="instructions")
        return {"instruct": instructions}, None
    if name is None:
        raise VoiceLibraryError("voice is required: a Base model speaks in cloned voices; pass the name of a "
                                "library voice (create one with POST /v1/audio/voices)", code="voice_required",
                                param="voice")
    try:
        return {"voice": library.get(name)}, name
    except VoiceNotFoundError:
        usable = ", ".join(v.name for v in library.list() if v.compatible)
        usable = usable or "none yet (create one with POST /v1/audio/voices)"
        raise UnknownVoiceError(f"unknown voice {name!r}; available: {usable}") from None


__all__ = [
    "MAX_NAME_CHARS",
    "OPENAI_VOICES",
    "RESERVED_NAMES",
    "CloningUnsupportedError",
    "IncompatibleVoiceError",
    "InvalidVoiceNameError",
    "ModelSignature",
    "ReferenceAudioError",
    "VoiceDamagedError",
    "VoiceExistsError",
    "VoiceInfo",
    "VoiceLibrary",
    "VoiceLibraryError",
    "VoiceNotFoundError",
    "UnknownVoiceError",
    "voice_request_fields",
    "validate_voice_name",
]
