"""Command line: `python -m tts_engine synth --model PATH_OR_ID --text "..." --out out.wav`."""

from __future__ import annotations

import argparse
import logging
import sys
import time


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tts_engine", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    synth = sub.add_parser("synth", help="synthesize one utterance to a 24 kHz WAV file")
    synth.add_argument("--model", required=True, help="local checkpoint folder or Hugging Face Hub id")
    synth.add_argument("--text", required=True)
    voice = synth.add_mutually_exclusive_group()
    voice.add_argument("--speaker", help="CustomVoice preset speaker")
    voice.add_argument("--ref-audio", help="Base: reference clip to clone")
    synth.add_argument("--ref-text", help="transcript of --ref-audio (ICL cloning)")
    synth.add_argument("--x-vector-only", action="store_true", help="clone from the speaker vector only")
    synth.add_argument("--instruct", help="style instruction (CustomVoice 1.7B) or voice description (VoiceDesign)")
    synth.add_argument("--language", default="auto")
    synth.add_argument("--config", help="stage config YAML")
    synth.add_argument("--seed", type=int)
    synth.add_argument("--greedy", action="store_true", help="greedy decoding (talker and sub-talker)")
    synth.add_argument("--max-new-tokens", type=int)
    synth.add_argument("--out", required=True, help="output WAV path")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from tts_engine import CheckpointError, RequestError, SpeechRequest, TTSEngine
    from tts_engine.audio import encode_audio

    try:
        engine = TTSEngine.from_pretrained(args.model, stage_config=args.config)
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        request = SpeechRequest(
            text=args.text, language=args.language, speaker=args.speaker, instruct=args.instruct,
            ref_audio=args.ref_audio, ref_text=args.ref_text, x_vector_only=args.x_vector_only,
            seed=args.seed, max_new_tokens=args.max_new_tokens,
            do_sample=False if args.greedy else None, subtalker_do_sample=False if args.greedy else None)
        start = time.perf_counter()
        result = engine.synthesize(request)
        elapsed = time.perf_counter() - start
    except RequestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        engine.close()
    with open(args.out, "wb") as handle:
        handle.write(encode_audio(result.audio, result.sample_rate, "wav"))
    seconds = len(result.audio) / result.sample_rate
    print(f"wrote {args.out}: {seconds:.2f} s of audio, {result.codes.shape[0]} frames, "
          f"synthesized in {elapsed:.2f} s (RTF {elapsed / max(seconds, 1e-9):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
