"""Talker prompt: the prefill embeddings and the per-step trailing text for one request.

The talker reads two tracks summed position by position: a text track (projected text embeddings
`T(ids)`) and a codec track (`C(ids)`, codec embeddings, plus the speaker vector). The layout below is
the official one for every mode (CustomVoice speaker + dialect + instruct, VoiceDesign instruct, Base
x-vector and ICL, `non_streaming_mode` on and off); the fidelity tests pin it to `qwen_tts` 0.1.1.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from tts_engine.cuda_streams import high_priority_stream
from tts_engine.models.qwen3_tts.config import Qwen3TTSConfig
from tts_engine.models.qwen3_tts.sampling import to_device
from tts_engine.models.qwen3_tts.weights import load_into, read_prefixed


class TextEmbedder(nn.Module):
    """`T(ids)`: the talker's text embedding followed by its 2-layer projection to talker width."""

    def __init__(self, vocab: int, text_hidden: int, intermediate: int, hidden: int):
        super().__init__()
        self.text_embedding = nn.Embedding(vocab, text_hidden)
        self.linear_fc1 = nn.Linear(text_hidden, intermediate, bias=True)
        self.linear_fc2 = nn.Linear(intermediate, hidden, bias=True)

    @staticmethod
    def from_checkpoint(config: Qwen3TTSConfig, device: torch.device, dtype: torch.dtype) -> "TextEmbedder":
        state = read_prefixed(config.path, "talker.text_projection.")
        embedding = read_prefixed(config.path, "talker.model.text_embedding.")
        if "weight" in embedding:
            state["text_embedding.weight"] = embedding["weight"]
        talker = config.talker
        fc1 = state.get("linear_fc1.weight")
        intermediate = fc1.shape[0] if fc1 is not None else talker.text_hidden_size
        module = TextEmbedder(talker.text_vocab_size, talker.text_hidden_size, intermediate, talker.shape.hidden_size)
        load_into(module, state, f"{config.path / 'model.safetensors'} (talker text embedding/projection)")
        return module.to(device=device, dtype=dtype).eval()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(nn.functional.silu(self.linear_fc1(self.text_embedding(ids))))


@dataclass
class TalkerPrompt:
    prefill: torch.Tensor    # [L, H] prompt embeddings
    trailing: torch.Tensor   # [T, H] text added to decode steps 0..T-1; tts_pad afterwards
    tts_pad: torch.Tensor    # [H]
    # CUDA: recorded on the builder's stream after the build's last GPU work (`trailing`'s kernels, the prefill's
    # copy to the host); the steps' stream waits for it before reading `trailing`
    ready: "torch.cuda.Event | None" = None
    # True while rows of `prefill` (pinned host memory) are still being copied from the GPU: they are there once
    # `ready` has completed. Stage 0 hands the prefill to vLLM only then (`prefill_arrived`), so no thread waits.
    prefill_pending: bool = False

    def prefill_arrived(self) -> bool:
        return not self.prefill_pending or self.ready.query()

    def wait_for_prefill(self) -> None:
        """Block until the prefill's rows are on the host (a no-op for a prefill built there)."""
        if self.prefill_pending:
            self.ready.synchronize()


class HostRows:
    """A bounded, thread-safe LRU of prompt pieces kept on the host (what vLLM takes a prefill from), so a
    prompt made of known pieces is put together on the host with no GPU work and no wait for the GPU.

    Safe for fidelity because every piece is computed the way an uncached build computes it (the same ids
    through the same kernels at the same row count), so the bits are the same whoever computed them first."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._rows: OrderedDict[tuple, torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: tuple, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        with self._lock:
            rows = self._rows.get(key)
            if rows is not None:
                self._rows.move_to_end(key)
                self.hits += 1
                return rows
            self.misses += 1
        rows = compute().cpu()           # on CUDA: waits for this piece's kernels, once per key
        with self._lock:
            self._rows[key] = rows
            while len(self._rows) > self.capacity:
                self._rows.popitem(last=False)
        return rows

    def __len__(self) -> int:
        return len(self._rows)

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()


@dataclass
class PromptInputs:
    """Everything mode-specific, already validated by the engine."""

    text: str
    language: str = "auto"             # lower-case; "auto" selects the no-language prefix
    speaker: str | None = None         # CustomVoice preset
    instruct: str | None = None
    speaker_vector: torch.Tensor | None = None   # Base: x-vector [H]
    ref_codes: torch.Tensor | None = None        # Base ICL: [T, 16]
    ref_text: str | None = None
    non_streaming_mode: bool = False


def assistant_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def reference_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n"


def instruct_text(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n"


def _voice_vector(p: PromptInputs) -> torch.Tensor | None:
    """The speaker vector the prompt carries: none for a preset speaker, who wins, as in the reference."""
    return None if p.speaker else p.speaker_vector


def _fingerprint(vector: torch.Tensor | None) -> tuple | None:
    """A speaker vector's dtype, shape and bytes, the key of its prompt pieces (() for no vector); None for a vector
    on a device, whose bytes would cost a wait for the GPU (the cloner and the voice library keep them on the host)."""
    if vector is None:
        return ()
    if vector.device.type != "cpu":
        return None
    raw = vector.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return str(vector.dtype), tuple(vector.shape), raw


class PromptBuilder:
    def __init__(self, config: Qwen3TTSConfig, tokenizer: Callable[[str], list[int]], text: TextEmbedder,
                 codec_embed: Callable[[torch.Tensor], torch.Tensor],
                 frame_embed: Callable[[torch.Tensor], torch.Tensor],
                 tokenize_many: Callable[[list[str]], list[list[int]]] | None = None):
        """codec_embed(ids [n]) -> [n, H] is C(); frame_embed(codes [T,16]) -> [T, H] sums all codebooks;
        tokenize_many(texts) -> the ids of each, as `tokenizer` gives them, in one call (default: one call a text)."""
        self.config = config
        self.tokenize = tokenizer
        self.tokenize_many = tokenize_many or (lambda texts: [tokenizer(text) for text in texts])
        self.text = text
        self.codec_embed = codec_embed
        self.frame_embed = frame_embed
        self.device = next(text.parameters()).device
        # On CUDA the prompt is built on a stream of its own (see `build`); None builds on the caller's stream.
        # (high priority: its few kernels go ahead of queued steps, and the pool of high-priority streams is
        # not the one the stages' and graph captures' streams come from)
        self.stream = high_priority_stream(self.device)
        self._constants: dict[tuple, torch.Tensor | tuple[torch.Tensor, torch.Tensor]] = {}
        self.cache_constants = True
        # Host copies of a streaming prompt's two pieces: its lead (everything before the first text token: the
        # instruct, the chat prefix, the codec track of a language and a preset speaker or speaker vector) and the
        # first text token's row. With both known, `build` returns without a wait for the GPU (the burst of 64
        # prompts: ~1.3 ms of host work each and a read-back). Rows are 2 x hidden bytes (4 KB at 1.7B): 8,192
        # first tokens take 32 MB; a lead is ~10 rows (and an instruct's).
        self.leads = HostRows(64)
        self.first_rows = HostRows(8192)
        self.cache_prefills = True
        # False (the default): a prefill with rows made on the GPU comes back to the host by an asynchronous copy
        # that Stage 0 waits for (`TalkerPrompt.prefill_pending`); True: `build` waits for it, as it did before the
        # twelfth pass (bench variant `prompt-wait-readback`)
        self.wait_for_prefill = False

    def _once(self, kind: str, ids) -> torch.Tensor:
        """`T(ids)` or `C(ids)` of the few id lists every prompt repeats (special tokens, the chat prefix,
        language, speaker), computed once: the same kernels on the same ids give the same values, and a
        prompt then costs a few embedding calls instead of a dozen (each an upload and ~5 kernels)."""
        key = (kind, tuple(ids) if isinstance(ids, (list, tuple)) else (ids,))
        embedded = self._constants.get(key) if self.cache_constants else None
        if embedded is None:
            if len(self._constants) >= 256:      # a bound, should some key vary after all
                self._constants.clear()
            embedded = self.text(self._ids(list(key[1]))) if kind == "T" else self.codec_embed(self._ids(list(key[1])))
            if self.cache_constants:
                self._constants[key] = embedded
        return embedded

    def _ids(self, ids: list[int]) -> torch.Tensor:
        # staged through pinned memory: `torch.tensor(..., device=cuda)` copies from pageable memory, which
        # waits for all work queued on the builder's stream, every other prompt's included (the burst profile
        # on the H200 found two such waits per prompt; the prefill's read-back stays the one wait a build needs)
        return to_device(ids, torch.long, self.device)

    def language_id(self, language: str, speaker: str | None) -> int | None:
        talker = self.config.talker
        lang_id = None if language == "auto" else talker.languages[language]
        dialect = talker.speaker_dialect.get(speaker) if speaker else None
        if dialect is not None and language in ("chinese", "auto"):
            lang_id = talker.languages[dialect]
        return lang_id

    def build(self, p: PromptInputs) -> TalkerPrompt:
        """The prompt of one request (`build_many` of one)."""
        prompt = self.build_many([p])[0]
        if isinstance(prompt, Exception):
            raise prompt
        return prompt

    def build_many(self, inputs: list[PromptInputs]) -> list["TalkerPrompt | Exception"]:
        """The prompts of requests submitted together, in order (an exception in place of a prompt that failed);
        on CUDA their prefills go to the host, where vLLM takes them from, with no wait.

        Why many at once: a burst's prompts are host work on the interpreter that both stages step on (64 builds of
        ~0.5-1 ms each, on the H200's host, before the first prefill; BENCHMARKS.md, fourteenth and fifteenth
        passes). Together they share one tokenizer call, one upload of their token ids, one pinned host buffer and
        one event. Each prompt's text is still projected alone, at its own row count, so its bits are the ones it
        gets when built alone: a matrix product's rows can differ in their last bits with the row count (CPU and GPU
        kernels pick their blocking by shape), and a request must not hear who else was submitted with it.

        Why a stream of its own: the builder uploads token ids and copies the prefill to the host for vLLM (which
        takes prompt embeddings from the host), and each of those copies waits for everything queued before
        it on its stream. On the default stream that is the talker's step and the code predictor of every
        running request, so a new request's prompt waited behind the steps in flight before it reached Stage 0
        (time outside the stages, p95 on the H200: 8.8 -> 3.5 ms at 1 req/s, 274 -> 139 ms at 64 streams;
        BENCHMARKS.md). On its own stream it waits only for its own few small kernels. Stage 0 marks the tensors
        its steps read (`trailing`, `tts_pad`) as used on its stream (`TalkerStage`), so the caching allocator
        does not hand their memory to another prompt while a step may still read them.

        Why no wait: rows made on the GPU (a whole text in the prefill, an uncached prompt) reach the host by an
        asynchronous copy into pinned memory. The calling thread returns at once, and the prompt carries an event
        (`ready`, recorded after that copy and the trailing text's kernels): Stage 0 admits the request once it has
        completed, and its steps wait for it on the GPU. So no submitting thread waits for a GPU busy with both
        stages. No speed difference measured (BENCHMARKS.md, twelfth pass): a burst's builds wait for their turns
        on the interpreter, not for the GPU.
        """
        on_stream = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        results: list[TalkerPrompt | Exception | None] = [None] * len(inputs)
        with on_stream, torch.inference_mode():
            ids = self._tokenized([assistant_text(p.text) for p in inputs])
            pieces: dict[int, tuple] = {}   # index -> its speaker vector's fingerprint (the pieces' cache key)
            for i, (p, text_ids) in enumerate(zip(inputs, ids)):
                voice = _fingerprint(_voice_vector(p)) if self.cache_prefills and p.ref_codes is None else None
                if isinstance(text_ids, Exception):
                    results[i] = text_ids
                elif voice is not None:
                    pieces[i] = voice       # put together from host pieces, with the others of the batch
                else:
                    results[i] = self._built_alone(p, text_ids)
            if pieces:
                try:
                    built = self._from_pieces([inputs[i] for i in pieces], [ids[i] for i in pieces],
                                              list(pieces.values()))
                except Exception:           # one bad request must not fail the others: each alone, its own error
                    built = [self._from_pieces_alone(inputs[i], ids[i], voice) for i, voice in pieces.items()]
                for i, prompt in zip(pieces, built):
                    results[i] = prompt
        if self.wait_for_prefill:
            for prompt in results:
                if isinstance(prompt, TalkerPrompt):
                    prompt.wait_for_prefill()
        return results

    def _tokenized(self, texts: list[str]) -> list["list[int] | Exception"]:
        try:
            return list(self.tokenize_many(texts))
        except Exception:                   # find the text that failed; the others go on
            results: list[list[int] | Exception] = []
            for text in texts:
                try:
                    results.append(self.tokenize(text))
                except Exception as exc:
                    results.append(exc)
            return results

    def _built_alone(self, p: PromptInputs, ids: list[int]) -> "TalkerPrompt | Exception":
        """A prompt that is not made of host pieces (a voice's reference codes, the pieces' caches off), built on its
        own: its prefill copied to the host, its event recorded."""
        try:
            prompt = self._build(p, ids)
            if prompt.prefill.is_cuda:
                prompt.prefill, prompt.prefill_pending = self._on_host([prompt.prefill])
            if prompt.prefill_pending or prompt.trailing.is_cuda:
                prompt.ready = torch.cuda.Event()
                prompt.ready.record()
            return prompt
        except Exception as exc:
            return exc

    def _from_pieces_alone(self, p: PromptInputs, ids: list[int], voice: tuple) -> "TalkerPrompt | Exception":
        try:
            return self._from_pieces([p], [ids], [voice])[0]
        except Exception as exc:
            return exc

    def _from_pieces(self, inputs: list[PromptInputs], ids: list[list[int]],
                     voices: list[tuple]) -> list[TalkerPrompt]:
        """Prompts of a preset speaker, a speaker vector (a cloned voice without its reference codes) or none: what
        does not depend on the text comes from the host caches (built the uncached way on a miss), and the text is
        projected on the GPU, one prompt at a time, from token ids uploaded together.

        The text a step at a time (streaming): the prefill is the lead and the first token's row (cached by the
        token alone: the codec BOS row is the same for every language and speaker), both on the host, and only the
        trailing text is GPU work. The whole text in the prefill: its rows over the codec pad are the one part
        built on the GPU, copied into one pinned buffer that holds every such prefill of the batch. `voices`: each
        prompt's `_fingerprint` of its speaker vector, taken once by the caller."""
        cfg, tok = self.config, self.config.tokens
        tts_bos, tts_eos, tts_pad = self._once("T", [tok.tts_bos, tok.tts_eos, tok.tts_pad]).unbind(0)
        spans, flat, leads, codec_bos = [], [], [], []
        for p, text_ids, voice in zip(inputs, ids, voices):
            lang = self.language_id(p.language, p.speaker)
            vector = _voice_vector(p)
            leads.append(self.leads.get(
                (p.instruct, lang, p.speaker, voice, tuple(text_ids[:3])),
                lambda: torch.cat(self._lead(p, text_ids, lang, vector, tts_pad, tts_bos)[0])))
            codec_bos.append(lambda lang=lang, speaker=p.speaker:
                             self._codec_track(lang, speaker, None, tts_pad, tts_bos)[1])
            projected = text_ids[3:-5] if p.non_streaming_mode else text_ids[4:-5]
            spans.append((len(flat), len(flat) + len(projected)))
            flat += projected
        uploaded = self._ids(flat)          # one upload; each prompt projects its own slice
        whole = [i for i, p in enumerate(inputs) if p.non_streaming_mode]
        host, at, pending = None, 0, False
        if whole:
            # after the text: tts_eos over the codec pad, then tts_pad over the codec BOS row (the same two rows in
            # every such prompt: an add of the same rows gives the same bits as adding them inside the text's rows)
            pad = self._once("C", [cfg.talker.codec.pad])
            end = self.leads.get(("eos, tail",), lambda: torch.cat([tts_eos[None] + pad,
                                                                     self._tail(tts_pad, codec_bos[whole[0]]())]))
            rows = sum(leads[i].shape[0] + spans[i][1] - spans[i][0] + end.shape[0] for i in whole)
            host = torch.empty((rows, end.shape[1]), dtype=end.dtype, pin_memory=self.device.type == "cuda")
        prompts = []
        for i, (p, text_ids) in enumerate(zip(inputs, ids)):
            text = self.text(uploaded[spans[i][0]:spans[i][1]])
            if not p.non_streaming_mode:
                first = self.first_rows.get((text_ids[3],), lambda: self._first_row(text_ids, codec_bos[i]()))
                prompts.append(TalkerPrompt(prefill=torch.cat([leads[i], first]),
                                            trailing=torch.cat([text, tts_eos[None]]), tts_pad=tts_pad))
                continue
            text = text + pad
            n_lead, n_text = leads[i].shape[0], text.shape[0]
            prefill = host[at:at + n_lead + n_text + end.shape[0]]
            at += prefill.shape[0]
            prefill[:n_lead].copy_(leads[i])
            prefill[n_lead:n_lead + n_text].copy_(text, non_blocking=text.is_cuda)
            prefill[n_lead + n_text:].copy_(end)
            pending = pending or text.is_cuda
            prompts.append(TalkerPrompt(prefill=prefill, trailing=tts_pad[None], tts_pad=tts_pad,
                                        prefill_pending=text.is_cuda))
        if pending or any(prompt.trailing.is_cuda for prompt in prompts):
            ready = torch.cuda.Event()       # after every copy and trailing text of the batch
            ready.record()
            for prompt in prompts:
                prompt.ready = ready
        return prompts

    @staticmethod
    def _on_host(parts: list[torch.Tensor]) -> tuple[torch.Tensor, bool]:
        """The rows of `parts` one after another in host memory, and whether some are still on their way: parts on
        the host are copied now, parts on the GPU by an asynchronous copy into pinned memory on the current stream
        (only a copy: the same bits as a read-back). Pinned blocks come from PyTorch's caching host allocator,
        which keeps a block from reuse until the copies into it are done."""
        if not any(part.is_cuda for part in parts):
            return torch.cat(parts), False
        rows = sum(part.shape[0] for part in parts)
        host = torch.empty((rows, parts[0].shape[1]), dtype=parts[0].dtype, pin_memory=True)
        at = 0
        for part in parts:
            host[at:at + part.shape[0]].copy_(part, non_blocking=part.is_cuda)
            at += part.shape[0]
        return host, True

    def _build(self, p: PromptInputs, ids: list[int]) -> TalkerPrompt:
        """The prompt built from its ids with nothing cached but the constants (any mode; the reference layout)."""
        cfg, codec = self.config, self.config.talker.codec
        T, C = self.text, lambda ids: self.codec_embed(self._ids(ids))
        tok = cfg.tokens
        tts_bos, tts_eos, tts_pad = self._once("T", [tok.tts_bos, tok.tts_eos, tok.tts_pad]).unbind(0)
        lang = self.language_id(p.language, p.speaker)
        vector = _voice_vector(p)
        parts, codec_bos = self._lead(p, ids, lang, vector, tts_pad, tts_bos)

        body = ids[3:-5]
        if p.ref_codes is not None:
            ref_ids = self.tokenize(reference_text(p.ref_text or ""))[3:-2]
            text_embed = torch.cat([T(self._ids(ref_ids + body)), tts_eos[None]])
            codec_embed = torch.cat([codec_bos, self.frame_embed(p.ref_codes.to(self.device))])
            n_text, n_codec = text_embed.shape[0], codec_embed.shape[0]
            if p.non_streaming_mode:
                parts.append(text_embed + C([codec.pad] * n_text))
                parts.append(codec_embed + tts_pad)
                trailing = tts_pad[None]
            elif n_text > n_codec:
                parts.append(text_embed[:n_codec] + codec_embed)
                trailing = text_embed[n_codec:]
            else:
                pad = tts_pad.expand(n_codec - n_text, -1)
                parts.append(torch.cat([text_embed, pad]) + codec_embed)
                trailing = tts_pad[None]
        elif p.non_streaming_mode:
            parts += [self._text_rows(ids, tts_eos), self._tail(tts_pad, codec_bos)]
            trailing = tts_pad[None]
        else:
            parts.append(self._first_row(ids, codec_bos))
            trailing = self._trailing(ids, tts_eos)
        return TalkerPrompt(prefill=torch.cat(parts), trailing=trailing, tts_pad=tts_pad)

    def _lead(self, p: PromptInputs, ids: list[int], lang: int | None, vector: torch.Tensor | None,
              tts_pad: torch.Tensor, tts_bos: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The prompt's rows before its text (instruct, chat prefix, codec track over tts_pad ... tts_bos) and the
        codec BOS row the first text token rides on."""
        parts: list[torch.Tensor] = []
        if p.instruct:
            parts.append(self.text(self._ids(self.tokenize(instruct_text(p.instruct)))))
        parts.append(self._once("T", ids[:3]))
        head, codec_bos = self._codec_track(lang, p.speaker, vector, tts_pad, tts_bos)
        parts.append(head)
        return parts, codec_bos

    def _first_row(self, ids: list[int], codec_bos: torch.Tensor) -> torch.Tensor:
        """A streaming prompt's last prefill row: its first text token over the codec BOS row."""
        return self.text(self._ids(ids[3:4])) + codec_bos

    def _trailing(self, ids: list[int], tts_eos: torch.Tensor) -> torch.Tensor:
        """A streaming prompt's text after its first token, fed one row a decode step, then tts_eos."""
        return torch.cat([self.text(self._ids(ids[4:-5])), tts_eos[None]])

    def _text_rows(self, ids: list[int], tts_eos: torch.Tensor) -> torch.Tensor:
        """A non-streaming prompt's whole text and tts_eos over the codec pad (one embedding repeated: a view of it
        adds the same values as embedding every pad id)."""
        body = ids[3:-5]
        pad = self._once("C", [self.config.talker.codec.pad]).expand(len(body) + 1, -1)
        return torch.cat([self.text(self._ids(body)), tts_eos[None]]) + pad

    @staticmethod
    def _tail(tts_pad: torch.Tensor, codec_bos: torch.Tensor) -> torch.Tensor:
        """A non-streaming prompt's last prefill row: tts_pad over the codec BOS row."""
        return tts_pad[None] + codec_bos

    def _codec_track(self, lang: int | None, speaker: str | None, vector: torch.Tensor | None,
                     tts_pad: torch.Tensor, tts_bos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt's head after the chat prefix (think / language / speaker / pad over tts_pad ... tts_bos)
        and the codec BOS row the first text token rides on. The same for every request of one language and
        preset speaker, so it is kept with the constants: eight small ops a prompt fewer."""
        key = ("codec track", lang, speaker)
        track = self._constants.get(key) if self.cache_constants and vector is None else None
        if track is None:
            track = self._make_codec_track(lang, speaker, vector, tts_pad, tts_bos)
            if self.cache_constants and vector is None:
                self._constants[key] = track
        return track

    def _make_codec_track(self, lang: int | None, speaker: str | None, vector: torch.Tensor | None,
                          tts_pad: torch.Tensor, tts_bos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cfg, codec = self.config, self.config.talker.codec
        prefix = [codec.nothink, codec.think_bos, codec.think_eos] if lang is None else \
            [codec.think, codec.think_bos, lang, codec.think_eos]
        codec_track = [self._once("C", prefix)]
        if speaker:
            codec_track.append(self._once("C", cfg.talker.speakers[speaker]).reshape(1, -1))
        elif vector is not None:
            codec_track.append(vector.to(self.device, tts_pad.dtype).reshape(1, -1))
        codec_track.append(self._once("C", [codec.pad, codec.bos]))
        codec_in = torch.cat(codec_track)
        text_track = torch.cat([tts_pad.expand(codec_in.shape[0] - 2, -1), tts_bos[None]])
        return text_track + codec_in[:-1], codec_in[-1:]
