"""Real-time voice app entry point: builds the engine and serves the UI.

`python app.py` loads Qwen/Qwen3-TTS-12Hz-0.6B-Base from the Hub (progress shown);
`python app.py --model PATH_OR_ID`; `python app.py --demo` builds a tiny random model locally so
everything runs offline (random weights: the sound is not speech).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

DEFAULT_MODEL = "Qwen/Qwen3-TTS-12Hz-0.6B-Base"
log = logging.getLogger("app")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Qwen3-TTS real-time voice app")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="Hugging Face Hub id or local checkpoint folder")
    parser.add_argument("--config", help="stage config YAML (configs/)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--demo", action="store_true",
                        help="build and serve a tiny random model (offline; the sound is not speech)")
    parser.add_argument("--demo-type", default="base", choices=["base", "custom_voice", "voice_design"])
    return parser.parse_args(argv)


def build_ui(engine, demo: bool):
    """A minimal synthesis page (the streaming WebRTC UI replaces it in the app issue)."""
    import gradio as gr
    import numpy as np

    from tts_engine import RequestError, SpeechRequest

    config = engine.config
    kind = config.model_type

    def speak(text, language, speaker, instruct, ref_audio, ref_text, x_vector_only):
        try:
            request = SpeechRequest(
                text=text or "", language=language, speaker=speaker if kind == "custom_voice" else None,
                instruct=instruct or None, ref_audio=ref_audio if kind == "base" else None,
                ref_text=ref_text or None, x_vector_only=bool(x_vector_only))
            result = engine.synthesize(request)
        except RequestError as exc:
            raise gr.Error(str(exc))
        seconds = len(result.audio) / result.sample_rate
        return (result.sample_rate, np.asarray(result.audio)), f"{seconds:.2f} s, {result.codes.shape[0]} frames"

    with gr.Blocks(title="Qwen3-TTS voice") as ui:
        gr.Markdown(f"## Qwen3-TTS ({kind}, {config.model_size})" +
                    ("\n**Demo model: random weights, the sound is not speech.**" if demo else ""))
        text = gr.Textbox(label="Text", lines=3, value="Hello! This is a test of the voice engine.")
        language = gr.Dropdown(config.supported_languages, value="auto", label="Language")
        speaker = gr.Dropdown(config.supported_speakers or [""], value=(config.supported_speakers or [""])[0],
                              label="Speaker", visible=kind == "custom_voice")
        instruct = gr.Textbox(label="Instructions / voice description", visible=config.supports_instruct)
        ref_audio = gr.Audio(label="Reference clip (voice to clone)", type="filepath", visible=kind == "base")
        ref_text = gr.Textbox(label="Reference transcript", visible=kind == "base")
        x_vector_only = gr.Checkbox(label="Speaker vector only (no transcript)", visible=kind == "base")
        button = gr.Button("Speak", variant="primary")
        out = gr.Audio(label="Speech", type="numpy")
        info = gr.Markdown()
        button.click(speak, [text, language, speaker, instruct, ref_audio, ref_text, x_vector_only], [out, info],
                     api_name="speak")
    return ui


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from tts_engine import TTSEngine

    model = args.model
    if args.demo:
        from tts_engine.demo_checkpoint import build_demo_checkpoint
        size = "1b7" if args.demo_type == "voice_design" else "0b6"
        model = build_demo_checkpoint(Path(tempfile.mkdtemp(prefix="tts_demo_")) / args.demo_type,
                                      args.demo_type, size)
        log.info("demo model (random weights) at %s", model)
    config = args.config
    if config is None and args.demo:
        # Random weights rarely emit EOS: the tiny config caps utterances at 256 frames (20 s).
        config = Path(__file__).resolve().parent / "configs" / "qwen3_tts_tiny_cpu.yaml"
    engine = TTSEngine.from_pretrained(model, stage_config=config)
    try:
        build_ui(engine, args.demo).queue().launch(server_name=args.host, server_port=args.port)
    finally:
        engine.close()


if __name__ == "__main__":
    main()
