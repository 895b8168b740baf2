"""The GPU fast paths compute the same function as the plain code (checked on CPU).

* the code predictor's fused step (q/k/v and gate/up as one matrix each, attention over the whole
  16-slot cache with a position mask; what `torch.compile` turns into the CUDA-graph path) gives the
  same codes and embeddings as the eager loop for the same sampling noise;
* the decoder's graph path (states concatenated into static buffers padded to a batch bucket, outputs
  cloned once) equals one decode of the whole sequence, run here with the graph replay emulated.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tts_engine.models.qwen3_tts.code_predictor import CodePredictor
from tts_engine.models.qwen3_tts.codec_decoder import Code2WavConfig, Code2WavDecoder, _DecoderGraphs
from tts_engine.models.qwen3_tts.config import _read_talker, _Reader
from tts_engine.models.qwen3_tts.sampling import BatchSampling, RowSampling, draw_noise
from tts_engine.tools.demo_checkpoint import _decoder_config, demo_config


def fused_predictor_inputs(size: str):
    """A random predictor of `size` (projections not fused yet), the inputs of a 3-row call (two sampled rows, one
    greedy; noise drawn) and the fused loop's positions."""
    talker = _read_talker(_Reader(demo_config("custom_voice", size)["talker_config"], Path("talker_config")))
    torch.manual_seed(0)
    predictor = CodePredictor(talker).eval().requires_grad_(False)
    batch, h = 3, talker.shape.hidden_size
    hidden, c0 = torch.randn(batch, h), torch.randn(batch, h)
    rows = [RowSampling(True, 0.9, 50, 1.0), RowSampling(True, 0.7, 5, 1.0), RowSampling(False)]
    params = BatchSampling.stack(rows, torch.device("cpu"))
    noise = draw_noise((batch, 15, talker.codebook_size), params.generators, torch.device("cpu"))
    positions = [torch.arange(2)] + [torch.tensor([s + 1]) for s in range(1, 15)]
    return predictor, (hidden, c0, params, noise), positions


@pytest.mark.parametrize("size", ["0b6", "1b7"])
def test_fused_predictor_step_matches_eager(size):
    predictor, (hidden, c0, params, noise), positions = fused_predictor_inputs(size)
    with torch.inference_mode():
        codes, embed = predictor.predict_eager(hidden, c0, params, noise)
        predictor._fuse_projections()
        again, _ = predictor.predict_eager(hidden, c0, params, noise)      # the Linears are now views
        fused_codes, fused_embed = predictor.predict_fused(predictor._fused_step, hidden, c0, params, noise,
                                                           positions)
    assert torch.equal(again, codes)
    assert torch.equal(fused_codes, codes)
    assert torch.allclose(fused_embed, embed, atol=1e-5)


def _tiny_decoder() -> Code2WavDecoder:
    """The tiny decoder with random codebooks (a new decoder's are zeros: every code would sound alike)."""
    decoder = Code2WavDecoder(Code2WavConfig.from_dict(_decoder_config()))
    with torch.no_grad():
        for name, p in decoder.named_parameters():
            if name.endswith("embedding_sum"):
                p.normal_()
    decoder.quantizer.refresh_codebooks()
    return decoder.eval()


def test_decoder_graph_buffers_match_full_decode():
    torch.manual_seed(0)
    decoder = _tiny_decoder()
    codes = torch.randint(0, 2048, (3, 14, 16), generator=torch.Generator().manual_seed(1))
    whole = decoder.decode_full(codes)
    decoder._graphs = EagerDecoderGraphs(decoder, [(b, n) for b in (1, 2, 4) for n in (1, 2, 4)])
    states = [decoder.new_stream_state() for _ in range(3)]
    pieces, start = [], 0
    for n in (1, 2, 4, 7):              # 3 streams padded to 4; 7 frames is not a graph size (eager)
        pieces.append(decoder.decode_step(states, codes[:, start:start + n]))
        start += n
    assert float((torch.cat(pieces, dim=1) - whole).abs().max()) <= 1e-5
    single = decoder.new_stream_state()
    out = [decoder.decode_step(single, codes[1, :2]), decoder.decode_step(single, codes[1, 2:14])]
    assert float((torch.cat(out) - whole[1]).abs().max()) <= 1e-5


def test_decoder_graphs_read_and_write_a_state_table():
    """The graph path for streams in a DecoderStateTable (`run_rows`: rows gathered into the static inputs, the
    static next state written back) decodes what the graph path on per-stream states does, bit for bit, padded
    batches and the eager fallback included, and a table row is untouched by a call that fails."""
    from tts_engine.models.qwen3_tts.codec_decoder import DecoderStateTable
    torch.manual_seed(0)
    decoder = _tiny_decoder()
    codes = torch.randint(0, 2048, (3, 14, 16), generator=torch.Generator().manual_seed(2))
    decoder._graphs = EagerDecoderGraphs(decoder, [(b, n) for b in (1, 2, 4) for n in (1, 2, 4)])
    table, own = DecoderStateTable(decoder, capacity=4), [decoder.new_stream_state() for _ in range(3)]
    slots = [table.open() for _ in range(3)]
    order, start = [2, 0, 1], 0
    for n in (1, 2, 4, 7):              # 3 streams padded to 4; 7 frames is not a graph size (eager)
        batch = codes[order, start:start + n]
        rows = decoder.decode_rows(table, torch.tensor([slots[i] for i in order]), batch)
        assert torch.equal(rows, decoder.decode_step([own[i] for i in order], batch))
        assert float(rows.abs().max()) > 0       # real samples, not a silent decoder's
        start += n
    before = [b.clone() for b in table.buffers]
    replay = decoder._graphs._graphs[(1, 1)][0]
    decoder._graphs._graphs[(1, 1)] = (lambda: 1 / 0,) + decoder._graphs._graphs[(1, 1)][1:]
    with pytest.raises(ZeroDivisionError):
        decoder.decode_rows(table, torch.tensor([slots[0]]), codes[:1, :1])
    decoder._graphs._graphs[(1, 1)] = (replay,) + decoder._graphs._graphs[(1, 1)][1:]
    assert all(torch.equal(a, b) for a, b in zip(before, table.buffers))
    with pytest.raises(ValueError, match="not in use"):
        table.close(3)                  # never opened: a second stream on a row would corrupt both


class EagerDecoderGraphs(_DecoderGraphs):
    """The graph cache's buffer logic (padding, static inputs, state copies) with eager runs instead of
    captured graphs, so it is tested on CPU."""

    def _new_pool(self):
        return None

    def _record(self, codes, state):
        decoder = self.decoder
        wav, next_state = decoder._run(codes, state)

        def replay():
            w, nxt = decoder._run(codes, state)
            wav.copy_(w)
            for dst, src in zip(next_state.buffers, nxt.buffers):
                dst.copy_(src)
            next_state.positions.copy_(nxt.positions)
        return replay, wav, next_state
