"""Real-time voice app: one process, one port (FastAPI + Gradio 5 UI + fastrtc WebRTC + HTTP APIs).

    python app.py                    # Qwen/Qwen3-TTS-12Hz-0.6B-Base from the Hub (progress shown)
    python app.py --model PATH_OR_ID --config configs/qwen3_tts.yaml --host 0.0.0.0 --port 7860
    python app.py --demo             # tiny random model built locally: offline, the sound is not speech

Wiring only: args -> engine -> voice library -> serving routes (tts_engine/serving) -> fastrtc stream
-> Gradio UI tabs -> uvicorn. Routes: `/` UI, `/docs` OpenAPI, `/v1/audio/speech`, `/v1/audio/voices`,
`/webrtc/offer` (fastrtc) + `/v1/realtime/*` for voice agents, `/healthz`.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tts_engine.serving.sample_voice import ensure_sample_voice, voice_choices
from tts_engine.serving.server import engine_batch
from tts_engine.serving.settings import DEFAULT_MODEL, ServingSettings, preroll_seconds
from tts_engine.serving.webrtc import build_agent_api

ROOT = Path(__file__).resolve().parent
SAMPLE_RATE = 24000
log = logging.getLogger("app")


@dataclass
class UiOptions:
    demo: bool = False             # label the UI: random weights, the sound is not speech
    rtc: tuple[Any, Any] = ({"iceServers": []}, {"iceServers": []})   # (browser, server) WebRTC configs
    rtc_warning: str | None = None
    downloads: Path | None = None  # where the last utterance of each UI session is offered as WAV


# The value fastrtc's WebRTC component treats as "no stream": its frontend then shows a still placeholder
# instead of the wave visualiser. Any other value (a connection id) mounts the visualiser, whose analyser
# animation fastrtc 0.0.34 never cancels (its `stream_state == "closed"` branch cancels only the idle loop),
# so the only way to stop the wave after an utterance is to put this value back.
WEBRTC_IDLE = "__webrtc_value__"
# Hides Gradio toasts without text. Ending a fastrtc stream (CloseStream) always raises a "warning" toast
# with the CloseStream message in the browser; we end normal and stopped utterances with an empty message
# (the status line says what happened), and keep real messages (synthesis failures) visible.
HIDE_EMPTY_TOASTS = ".toast-body:has(.toast-text:empty) { display: none !important; }"
TO_IDLE = f"(ended, current) => ended && ended === current ? {WEBRTC_IDLE!r} : current"
# In the browser, the moment Stop is clicked: end the received audio tracks of the Speech component, so nothing
# more plays while the Stop request travels to the server (which then stops the stream and the engine). Before,
# what the browser still had buffered and what arrived during that round trip played on: 0.23-0.33 s of audio
# after Stop on the CI machine, of which the jitter buffer held 34-153 ms. A new utterance gets a new connection
# and new tracks (fastrtc sets the element's stream and plays it on each connection's first track).
SILENCE_NOW = ("() => document.querySelectorAll('#speech-out audio').forEach(a => "
               "a.srcObject && a.srcObject.getAudioTracks().forEach(t => t.stop()))")


# ---- configuration ------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    on_spaces = os.environ.get("SYSTEM") == "spaces"
    defaults = ServingSettings()
    parser = argparse.ArgumentParser(description="Qwen3-TTS real-time voice app")
    parser.add_argument("--model", default=os.environ.get("TTS_MODEL"),
                        help=f"Hugging Face Hub id or local checkpoint folder (default: the stage config's "
                             f"`model`, else {DEFAULT_MODEL})")
    parser.add_argument("--config", help="stage config YAML (configs/)")
    parser.add_argument("--host", default="0.0.0.0" if on_spaces else "127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", 7860)))
    parser.add_argument("--voices", default=str(ROOT / "voices"), help="voice library folder")
    parser.add_argument("--max-input-chars", type=int, default=defaults.max_input_chars)
    parser.add_argument("--max-sessions", type=int, default=defaults.max_sessions,
                        help="WebRTC sessions at once; default: the engine's batch (max_num_seqs, at least 8)")
    parser.add_argument("--session-connect-timeout-s", type=float, default=defaults.session_connect_timeout_s,
                        help="close a WebRTC session whose peer has not connected this long after its offer")
    parser.add_argument("--preroll-ms", type=int, default=None,
                        help="audio to buffer before playback starts; default 0 on GPU, 800 on CPU, where "
                             "frames come too slowly for the growing chunk schedule to stay ahead of playback")
    parser.add_argument("--drain-s", type=float, default=defaults.drain_s,
                        help="on SIGTERM, how long running streams may take to finish before the app exits")
    parser.add_argument("--demo", action="store_true",
                        help="build and serve a tiny random model (offline; the sound is not speech)")
    parser.add_argument("--demo-type", default="base", choices=["base", "custom_voice", "voice_design"])
    return parser.parse_args(argv)


# ---- the UI: one function per tab ----------------------------------------------------------------
def speak_tab(engine, library, settings: ServingSettings, options: UiOptions, session):
    """Text -> speech over a WebRTC audio track, Stop, live metrics, the last utterance as WAV."""
    import gradio as gr
    from fastrtc import AdditionalOutputs, CloseStream, WebRTC, get_current_context
    from fastrtc.tracks import ServerToClientAudio

    from tts_engine.audio import encode_audio
    from tts_engine.request import RequestAborted, RequestError, SpeechRequest
    from tts_engine.serving.realtime import TAIL_SILENCE, PlaybackClock, Preroll
    from tts_engine.serving.voice_library import voice_request_fields

    config, kind = engine.config, engine.config.model_type
    active: dict[str, Utterance] = {}    # UI session -> the utterance it is generating or playing (for Stop)
    shown: dict[str, tuple[str, str | None, bool]] = {}   # webrtc_id -> (status, WAV path, ended): see publish
    shown_lock = threading.Lock()
    downloads = options.downloads or Path(tempfile.mkdtemp(prefix="tts_utterances_"))

    def request_for(text, voice, language, instructions, temperature, top_k, top_p, penalty, seed, max_s):
        text = text or ""
        if not text.strip():
            raise RequestError("text is empty: type something to speak")
        if len(text) > settings.max_input_chars:
            raise RequestError(f"text is {len(text)} characters; the limit is {settings.max_input_chars}")
        fields = voice_request_fields(config, library, voice, instructions or None)[0]
        return SpeechRequest(text=text, language=language, temperature=temperature, top_k=int(top_k),
                             top_p=top_p, repetition_penalty=penalty, max_new_tokens=int(max_s * 12.5),
                             trim_leading_silence=True,
                             seed=int(seed) if seed not in (None, "") and int(seed) >= 0 else None, **fields)

    def check(*args):
        """Runs on the Speak click; the stream starts only if this succeeds (`trigger=checked.success`
        below), so bad input gets exactly one visible message: this error."""
        try:
            request_for(*args[:-1])
        except RequestError as exc:
            raise gr.Error(str(exc))
        return "Starting…"

    def publish(webrtc_id: str, status: str, path: str | None = None, ended: bool = False) -> None:
        """What the page should show for a connection. The browser is told to fetch it by an (empty)
        AdditionalOutputs on an audio chunk; `show_status` reads the *latest* entry, so a late or repeated
        fetch can never put an older status over a newer one (e.g. "playing…" over "Stopped.")."""
        with shown_lock:
            shown[webrtc_id] = (status, path, ended)
            while len(shown) > 64:
                shown.pop(next(iter(shown)))

    def speak(*args):
        """The WebRTC generator (fastrtc runs it in a worker thread, one per connection)."""
        ui_session = args[-1]
        try:
            request = request_for(*args[:-1])
        except RequestError as exc:   # only if the inputs changed after `check`
            yield CloseStream(str(exc))
            return
        start = time.perf_counter()
        first, pieces = None, []
        me = Utterance(uuid.uuid4().hex, get_current_context().webrtc_id)
        active[ui_session] = me
        held = Preroll(settings.preroll_s)
        playing_since, playback = None, PlaybackClock()   # when the first audio was handed to fastrtc
        try:
            for chunk in engine.stream(request, request_id=me.request_id):
                if first is None:
                    first = time.perf_counter() - start
                pieces.append(chunk.audio)
                for piece in held.push(chunk.audio, chunk.is_finished):
                    playback.hand_over(piece.shape[0])
                    if playing_since is None:   # live: time to first audio as soon as playback starts
                        playing_since = time.perf_counter()
                        publish(me.webrtc_id, f"**Time to first audio:** {1000 * (playing_since - start):.0f} ms"
                                              " · playing…")
                        yield (SAMPLE_RATE, piece.reshape(1, -1)), AdditionalOutputs()
                    else:
                        yield SAMPLE_RATE, piece.reshape(1, -1)
                if chunk.is_finished:
                    audio = np.concatenate(pieces)
                    path = downloads / f"utterance-{ui_session[:8]}.wav"
                    path.write_bytes(encode_audio(audio, SAMPLE_RATE, "wav"))
                    m = chunk.metrics
                    seconds = audio.shape[0] / SAMPLE_RATE
                    rtf = (m.finished_s / seconds) if seconds else 0.0
                    ttfa = 1000 * (first if settings.preroll_s == 0 else m.first_chunk_s + settings.preroll_s)
                    info = (f"**Finished.** **Time to first audio:** {ttfa:.0f} ms (server, first chunk "
                            f"{1000 * first:.0f} ms"
                            f"{f' + {settings.preroll_s * 1000:.0f} ms pre-roll' if settings.preroll_s else ''}) · "
                            f"**RTF:** {rtf:.2f} · {seconds:.2f} s of audio, {m.frames} frames")
            # fastrtc queues every frame at once and sends them at real-time pace, so generation ends long
            # before the listener hears the end. The utterance stays Stop-able, and its final status and the
            # end of the stream wait, until the queued audio has played (or Stop wakes us). Slower than real
            # time (a loaded CPU), playback waited for audio in between: the clock counts those gaps too.
            me.stopped.wait(playback.remaining())
            if me.stopped.is_set():
                return
            publish(me.webrtc_id, info, str(path), ended=True)
            yield (SAMPLE_RATE, TAIL_SILENCE.reshape(1, -1)), AdditionalOutputs()
            yield CloseStream("")   # browser: closes the connection (empty message: no toast, see HIDE_EMPTY_TOASTS)
        except RequestAborted:      # Stop: it has silenced the track and set the status already
            return
        except Exception as exc:    # a failure: say so in the status and in a toast, end the stream
            if not me.stopped.is_set():
                publish(me.webrtc_id, f"**Synthesis failed:** {exc}", ended=True)
                yield (SAMPLE_RATE, TAIL_SILENCE.reshape(1, -1)), AdditionalOutputs()
                yield CloseStream(f"synthesis failed: {exc}")
        finally:
            if active.get(ui_session) is me:
                active.pop(ui_session, None)

    def silence(webrtc_id: str) -> bool:
        """End a UI connection's audio *now*. The generator hands fastrtc the audio far ahead of playback
        (unbounded queue, paced by `recv()` at real time), so aborting the request alone leaves seconds of
        queued frames playing. Runs on the event loop (the track's queue is an asyncio.Queue)."""
        silenced = False
        for track in audio_out.connections.get(webrtc_id, []):
            if isinstance(track, ServerToClientAudio) and track.readyState == "live":
                track.thread_quit.set()               # the player task pulls nothing more from the generator
                track.clear_queue()                   # drop the frames waiting to be played
                track.queue.put_nowait(CloseStream(""))   # recv(): tell the browser (end_stream), stop the track
                silenced = True
        return silenced

    async def stop(ui_session, webrtc_id):
        """`webrtc_id` is the browser's connection: it exists before the generator starts (Stop right
        after Speak), when `active` does not know the utterance yet."""
        me = active.pop(ui_session, None)
        if me is not None:
            me.stopped.set()              # wakes the generator if it waits for playback to end
            engine.abort(me.request_id)   # both engine stages (a no-op once generation has finished)
        target = me.webrtc_id if me is not None else webrtc_id
        if not silence(target) and me is None:
            return "Nothing is playing.", gr.update()
        publish(target, "**Stopped.**", ended=True)
        return "**Stopped.**", target

    async def show_status(webrtc_id):
        """On the browser's "fetch_output": the connection's latest status (see `publish`). Not a generator
        and not queued, unlike fastrtc's `on_additional_outputs` (an async generator): queued, the finished
        generator's last output is re-sent when it ends, over anything shown since ("Stopped."); without
        the queue (as this app had it), every fetch starts a new generator over POST /run/predict, Gradio
        keys streamed outputs by id(generator), CPython reuses the id of the previous (dropped) one, and the
        update goes out as an incremental diff ([["replace", ...]]) that a queue-less client applies as a
        plain value: the Markdown throws (`i.trim is not a function`), the File shows one "Uploading…" row
        per edit, and the page stops updating (Speak no longer plays)."""
        with shown_lock:
            entry = shown.get(webrtc_id)
        if entry is None:
            return gr.update(), gr.update(), gr.update()
        status, path, ended = entry
        return status, path or gr.update(), webrtc_id if ended else gr.update()

    choices = voice_choices(engine, library)
    with gr.Row():
        with gr.Column(scale=3):
            text = gr.Textbox(label="Text", lines=4, max_lines=12,
                              value="Hello! This is the real-time voice engine speaking.")
            with gr.Row():
                voice = gr.Dropdown(choices, value=choices[0] if choices else None, label="Voice",
                                    visible=kind != "voice_design", allow_custom_value=False)
                language = gr.Dropdown(config.supported_languages, value="auto", label="Language")
            instructions = gr.Textbox(
                label="Voice description" if kind == "voice_design" else "Instructions",
                visible=config.supports_instruct, lines=2,
                value="A warm, calm voice." if kind == "voice_design" else "")
            with gr.Accordion("Advanced sampling", open=False):
                with gr.Row():
                    temperature = gr.Slider(0.1, 1.5, value=config.generation.temperature, label="Temperature")
                    top_k = gr.Slider(1, 200, value=config.generation.top_k, step=1, label="Top-k")
                    top_p = gr.Slider(0.05, 1.0, value=config.generation.top_p, label="Top-p")
                with gr.Row():
                    penalty = gr.Slider(1.0, 1.5, value=config.generation.repetition_penalty,
                                        label="Repetition penalty")
                    seed = gr.Number(value=-1, precision=0, label="Seed (-1: random)")
                    max_s = gr.Slider(2, 120, value=20 if options.demo else 60, step=1, label="Max length (s)")
            with gr.Row():
                speak_btn = gr.Button("Speak", variant="primary")
                stop_btn = gr.Button("Stop", variant="stop")
        with gr.Column(scale=2):
            audio_out = WebRTC(WEBRTC_IDLE, label="Speech (WebRTC)", mode="receive", modality="audio",
                               rtc_configuration=options.rtc[0], server_rtc_configuration=options.rtc[1],
                               elem_id="speech-out")
            metrics = gr.Markdown("Press **Speak**: audio starts with the first chunk.")
            download = gr.File(label="Last utterance (WAV)")
            ended = gr.Textbox(visible=False)   # the connection whose utterance ended last (-> TO_IDLE)
    inputs = [text, voice, language, instructions, temperature, top_k, top_p, penalty, seed, max_s, session]
    checked = speak_btn.click(check, inputs, metrics, queue=False, show_progress="hidden")
    audio_out.stream(speak, inputs=inputs, outputs=[audio_out], trigger=checked.success,
                     time_limit=settings.session_time_limit_s,
                     concurrency_limit=settings.session_limit(engine_batch(engine)))
    audio_out.state_change(show_status, inputs=[audio_out], outputs=[metrics, download, ended], queue=False,
                           trigger_mode="always_last", show_progress="hidden")
    stop_btn.click(None, None, None, js=SILENCE_NOW, queue=False)       # the browser first, at once
    stop_btn.click(stop, [session, audio_out], [metrics, ended], queue=False)
    # In the browser only: when an utterance has ended, put the WebRTC component back to idle (removes its
    # wave, see WEBRTC_IDLE), unless it has moved on to a newer connection meanwhile. Never from Python:
    # a gr.update() for the WebRTC component makes Gradio build a per-session copy of it
    # (`block.__class__(**constructor_args)` in postprocess_data) without the stream's event handler, and
    # the session's next offer fails ("'NoneType' object has no attribute '_clear_queue'").
    ended.change(None, [ended, audio_out], audio_out, js=TO_IDLE)
    return voice


@dataclass
class Utterance:
    """What Stop needs of a UI utterance: its engine request and its WebRTC connection."""
    request_id: str
    webrtc_id: str
    stopped: threading.Event = field(default_factory=threading.Event)


def voices_table(library) -> list[list[str]]:
    rows = [[v.name, v.mode, f"{v.duration_s:.1f}", v.transcript or "", v.created[:19],
             f"{v.model_type} {v.model_size}" + ("" if v.compatible else " (other model)")]
            for v in library.list()]
    return rows or [["(no voices yet)", "", "", "", "", ""]]


def clone_tab(engine, library):
    """Reference clip (+ transcript) -> a library voice. Returns the inputs and the status box."""
    import gradio as gr

    gr.Markdown("Upload or record 3-20 s of clean speech (wav, mp3, flac, ogg, m4a; up to 30 s, 20 MB). "
                "With its transcript the clone is closer (ICL); without, only the speaker vector is used.")
    with gr.Row():
        with gr.Column():
            clip = gr.Audio(label="Reference clip", sources=["upload", "microphone"], type="filepath")
            transcript = gr.Textbox(label="Transcript of the clip (optional)", lines=2)
            x_vector_only = gr.Checkbox(label="Speaker vector only (ignore the transcript)")
            voice_name = gr.Textbox(label="Voice name", placeholder="e.g. alice")
            create_btn = gr.Button("Create voice", variant="primary")
        with gr.Column():
            clone_status = gr.Markdown()
    return create_btn, [clip, transcript, x_vector_only, voice_name], clone_status


def voices_tab(library):
    """The library as a table, a reference-clip preview and Delete."""
    import gradio as gr

    table = gr.Dataframe(voices_table(library), headers=["name", "mode", "seconds", "transcript", "created",
                                                         "model"], interactive=False, label="Voice library")
    with gr.Row():
        names = [v.name for v in library.list()]
        pick = gr.Dropdown(names, value=names[0] if names else None, label="Voice")
        delete_btn = gr.Button("Delete", variant="stop")
    preview_audio = gr.Audio(label="Reference clip", type="filepath", interactive=False)
    voices_status = gr.Markdown()
    pick.change(lambda name: str(library.preview_path(name)) if name else None, pick, preview_audio)
    return table, pick, delete_btn, voices_status


API_HELP = """
**OpenAI-compatible speech:** `POST /v1/audio/speech` with `{"input": "Hello", "voice": "sample",
"response_format": "wav"}` (wav, pcm, flac, mp3, opus, aac, ulaw, alaw; `sample_rate` 8000-48000 for pcm;
`"stream": true` for chunked audio, `"stream_format": "sse"` for base64 deltas; leading silence is trimmed
unless `"trim_leading_silence": false`). **Voices:** `GET/POST/DELETE /v1/audio/voices`.
Full reference: [/docs](/docs); Prometheus metrics at [/metrics](/metrics).

**Streaming text over a WebSocket:** `/v1/audio/speech/stream`: send `start`, then `text` pieces as your LLM
writes them, `flush` / `end` / `cancel`; receive `audio` events as speech is made, then `done` (see README).

**Voice agents over WebRTC:** open a connection with fastrtc's `POST /webrtc/offer` (`{sdp, type, webrtc_id}`,
send a silent audio track and a data channel), then `POST /v1/realtime/say {"webrtc_id", "text", "voice",
"language", "final"}`: with `final: false` text is appended as your LLM streams it and speech starts as soon
as the first clause is complete; `final: true` flushes the rest. `POST /v1/realtime/interrupt {"webrtc_id"}`
stops the audio at once. No audio frames are sent between utterances.
"""


def build_ui(engine, library, settings: ServingSettings, options: UiOptions):
    import gradio as gr

    from tts_engine.request import RequestError

    config, kind = engine.config, engine.config.model_type

    def create_voice(clip, transcript, x_vector_only, name, progress=gr.Progress()):
        if kind != "base":
            raise gr.Error("voice cloning needs a Base checkpoint")
        if not clip:
            raise gr.Error("upload or record a reference clip first")

        def report(stage: str, fraction: float) -> None:
            progress(fraction, desc=stage.replace("_", " "))

        try:
            info = library.create(name or "", clip, transcript=transcript or None,
                                  x_vector_only=bool(x_vector_only), engine=engine, progress=report)
        except RequestError as exc:
            # the clip is Gradio's server-side copy (/tmp/gradio/<hash>/name.wav): show only its file name
            raise gr.Error(re.sub(re.escape(str(Path(clip).parent)) + r"[/\\]", "", str(exc)))
        notice = f" {info.notice}" if getattr(info, "notice", None) else ""
        choices = voice_choices(engine, library)
        return (f"Saved voice **{info.name}** ({info.mode}, {info.duration_s:.1f} s).{notice}",
                gr.update(choices=choices, value=info.name), voices_table(library),
                gr.update(choices=[v.name for v in library.list()], value=info.name))

    def delete_voice(name):
        if not name:
            raise gr.Error("pick a voice to delete")
        try:
            library.delete(name)
        except RequestError as exc:
            raise gr.Error(str(exc))
        names = [v.name for v in library.list()]
        choices = voice_choices(engine, library)
        return (f"Deleted **{name}**.", voices_table(library),
                gr.update(choices=names, value=names[0] if names else None),
                gr.update(choices=choices, value=choices[0] if choices else None))

    def refresh_voices(current_voice, current_pick):
        """The voice lists as they are now (clones and deletes may come through the HTTP API)."""
        choices, names = voice_choices(engine, library), [v.name for v in library.list()]
        return (gr.update(choices=choices, value=current_voice if current_voice in choices else
                          (choices[0] if choices else None)),
                voices_table(library),
                gr.update(choices=names, value=current_pick if current_pick in names else (names[0] if names else None)))

    with gr.Blocks(title="Qwen3-TTS real-time voice", theme=gr.themes.Soft(), css=HIDE_EMPTY_TOASTS) as ui:
        session = gr.State()
        ui.load(lambda: uuid.uuid4().hex, outputs=session)
        gr.Markdown(f"## Qwen3-TTS real-time voice · {kind.replace('_', ' ')} {config.model_size}")
        if options.demo:
            gr.Markdown("> **Demo model: random weights.** Everything runs for real, but the sound is not "
                        "speech. Start with `--model Qwen/Qwen3-TTS-12Hz-0.6B-Base` for real voices.")
        if options.rtc_warning:
            gr.Markdown(f"> **WebRTC:** {options.rtc_warning}")
        with gr.Tabs():
            with gr.Tab("Speak") as speak_tab_:
                voice = speak_tab(engine, library, settings, options, session)
            with gr.Tab("Clone a voice", visible=kind == "base"):
                create_btn, clone_inputs, clone_status = clone_tab(engine, library)
            with gr.Tab("Voices", visible=kind == "base") as voices_tab_:
                table, pick, delete_btn, voices_status = voices_tab(library)
            with gr.Tab("API"):
                gr.Markdown(API_HELP)
        delete_btn.click(delete_voice, pick, [voices_status, table, pick, voice])
        create_btn.click(create_voice, clone_inputs, [clone_status, voice, table, pick])
        # The component values above are snapshots taken when the UI was built: read the library on every
        # page load, and again when the Speak or Voices tab is opened.
        for trigger in (ui.load, speak_tab_.select, voices_tab_.select):
            trigger(refresh_voices, [voice, pick], [voice, table, pick], queue=False, show_progress="hidden")
    return ui


# ---- the app --------------------------------------------------------------------------------------
def build_app(engine, library, settings: ServingSettings, lifecycle=None, options: UiOptions | None = None):
    """The single-process app: the agent API (`build_agent_api`) with the Gradio UI mounted at `/`."""
    import gradio as gr

    from tts_engine.serving.errors import OneShapeMiddleware

    app, rtc_warning = build_agent_api(engine, library, settings, lifecycle)
    options = dataclasses.replace(options or UiOptions(), rtc=app.state.rtc, rtc_warning=rtc_warning)
    ui = build_ui(engine, library, settings, options)
    ui.queue(default_concurrency_limit=settings.concurrency_limit(engine_batch(engine)))
    app = gr.mount_gradio_app(app, ui, path="/")
    app.add_middleware(OneShapeMiddleware)   # the UI's own 404s for unknown paths, in the one error shape
    return app


def reserve_port(host: str, port: int) -> socket.socket:
    """The app's listening address, bound before the engine loads (it listens once the app is built).

    Why first: loading the engine takes a minute, and a port taken meanwhile, by another program or by the engine
    itself (vLLM binds a free port of its own while it starts, which can be the one a caller just picked as
    free), made the app exit only after that minute. Bound first, a taken port is a clear error at once and
    nothing can take it during the load; connections are refused until the app listens, as before."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SystemExit(f"cannot listen on {host}:{port}: {exc.strerror or exc} (choose another --port)") from None
    return sock


def serve(app, engine, lifecycle, sock: socket.socket, drain_s: float) -> None:
    """uvicorn on `sock` (see `reserve_port`), warm-up in the background (`/readyz` turns 200 when done), graceful
    stop on SIGTERM/SIGINT: new work gets 503 at once, running streams get up to `drain_s` to finish, then the
    server exits and the caller closes the engine (a second signal exits at once)."""
    import threading

    import uvicorn

    from tts_engine.serving.lifecycle import DRAINING, READY, STARTING, STOPPED

    class GracefulServer(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            if lifecycle.state in (DRAINING, STOPPED):
                self.force_exit = self.should_exit = True
                return
            log.info("signal %s: draining (at most %.0f s for %d running requests)", sig, drain_s,
                     engine.active_request_count)

            def drain() -> None:
                left = lifecycle.drain(lambda: engine.active_request_count, drain_s)
                if left:
                    log.warning("stopping with %d requests still running (drain deadline %.0f s)", left, drain_s)
                self.should_exit = True
            threading.Thread(target=drain, name="drain", daemon=True).start()
            # not recorded in _captured_signals: uvicorn would re-raise it after shutdown and kill the
            # process before engine.close() and the clean-up of temporary folders ran

    def warm() -> None:
        try:
            seconds = engine.warmup()
            log.info("ready (warm-up %.1f s)", seconds)
            if lifecycle.state == STARTING:
                lifecycle.set(READY)
        except Exception:  # noqa: BLE001 -- /healthz and /readyz tell; the server stays up to say so
            log.exception("warm-up failed")

    host, port = sock.getsockname()[:2]
    server = GracefulServer(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                           timeout_graceful_shutdown=5))
    threading.Thread(target=warm, name="warm-up", daemon=True).start()
    log.info("serving on http://%s:%d (UI at /, API docs at /docs; /readyz once warm)", host, port)
    server.run(sockets=[sock])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with reserve_port(args.host, args.port) as sock:
        run(args, sock)


def run(args: argparse.Namespace, sock: socket.socket) -> None:
    """Load the engine and the voice library, build the app and serve it on `sock` until a signal stops it."""
    from tts_engine import TTSEngine
    from tts_engine.serving.lifecycle import Lifecycle
    from tts_engine.serving.voice_library import VoiceLibrary

    model, config = args.model, args.config
    if args.demo:
        from tts_engine.tools.demo_checkpoint import build_demo_checkpoint
        size = "1b7" if args.demo_type == "voice_design" else "0b6"
        # one folder per kind, rebuilt in place (byte-identical, under a second): starts never pile up copies
        model = build_demo_checkpoint(Path(tempfile.gettempdir()) / "tts_demo" / f"{args.demo_type}-{size}",
                                      args.demo_type, size)
        log.info("demo model (random weights) at %s", model)
        # Random weights rarely emit EOS: the tiny config caps utterances at 256 frames (20 s).
        config = config or ROOT / "configs" / "qwen3_tts_tiny_cpu.yaml"
    if model is None:   # the stage config's `model`, else the default checkpoint
        from tts_engine.config import load_stage_config
        model = (load_stage_config(config).model if config else None) or DEFAULT_MODEL
    engine = TTSEngine.from_pretrained(model, stage_config=config)
    try:
        with tempfile.TemporaryDirectory(prefix="tts_utterances_") as downloads:
            library = VoiceLibrary(Path(args.voices), engine.config)
            ensure_sample_voice(engine, library)
            settings = ServingSettings(max_input_chars=args.max_input_chars, max_sessions=args.max_sessions,
                                       session_connect_timeout_s=args.session_connect_timeout_s,
                                       preroll_s=preroll_seconds(args.preroll_ms, engine.device.type == "cuda"),
                                       drain_s=args.drain_s)
            lifecycle = Lifecycle()
            app = build_app(engine, library, settings, lifecycle, UiOptions(demo=args.demo, downloads=Path(downloads)))
            serve(app, engine, lifecycle, sock, settings.drain_s)
    finally:
        engine.close()
        log.info("stopped")


if __name__ == "__main__":
    main()
