"""The code predictor ("sub-talker"): codebooks 1..15 of a frame from the talker state and codebook 0.

The official code runs a fresh HF `generate` per frame per request. Here one call serves every request
of a talker step at once: a 2-token prefill [h_t, E0(c0)] followed by 14 single-token steps against a
small static KV cache. It also returns the frame's summed codec embedding, which is the talker's next
input (plus the text term), so the frame never leaves the device between the two.
"""

from __future__ import annotations

import torch
from torch import nn

from tts_engine.models.qwen3_tts.config import TalkerConfig
from tts_engine.models.qwen3_tts.layers import DecoderLayer, RMSNorm, rope_tables
from tts_engine.models.qwen3_tts.sampling import BatchSampling, sample


class _PredictorModel(nn.Module):
    def __init__(self, talker: TalkerConfig):
        super().__init__()
        shape = talker.code_predictor
        self.layers = nn.ModuleList(DecoderLayer(shape) for _ in range(shape.num_layers))
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        # Embeddings of codebooks 1..15 live at *talker* width: they are summed into talker inputs.
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(talker.codebook_size, talker.shape.hidden_size) for _ in range(talker.num_code_groups - 1))


class CodePredictor(nn.Module):
    """Parameter names mirror `talker.code_predictor.*` of the official checkpoint."""

    def __init__(self, talker: TalkerConfig):
        super().__init__()
        self.talker_config = talker
        shape = talker.code_predictor
        self.shape = shape
        self.model = _PredictorModel(talker)
        self.lm_head = nn.ModuleList(
            nn.Linear(shape.hidden_size, talker.codebook_size, bias=False) for _ in range(talker.num_code_groups - 1))
        if shape.hidden_size != talker.shape.hidden_size:
            self.small_to_mtp_projection: nn.Module = nn.Linear(talker.shape.hidden_size, shape.hidden_size, bias=True)
        else:
            self.small_to_mtp_projection = nn.Identity()
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None

    def _rope_tables(self, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self._rope is None or self._rope[0].device != device or self._rope[0].dtype != dtype:
            cos, sin = rope_tables(self.shape, self.talker_config.num_code_groups, device)
            self._rope = (cos.to(dtype), sin.to(dtype))
        return self._rope

    def embed_codes(self, codes: torch.Tensor, codebook0_embedding: nn.Module | torch.Tensor) -> torch.Tensor:
        """Sum of the 16 codebook embeddings of frames codes [..., 16] -> [..., H_talker]."""
        table0 = codebook0_embedding if isinstance(codebook0_embedding, torch.Tensor) else codebook0_embedding.weight
        parts = [nn.functional.embedding(codes[..., 0], table0)]
        parts += [emb(codes[..., q + 1]) for q, emb in enumerate(self.model.codec_embedding)]
        # One stacked reduction, in the official order, so float rounding matches the reference.
        return torch.stack(parts, dim=-2).sum(-2)

    @torch.inference_mode()
    def predict(self, hidden: torch.Tensor, c0_embed: torch.Tensor,
                params: BatchSampling) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [B, H] (talker's post-norm state that produced c0), c0_embed [B, H] = E0(c0).

        Returns (codes [B, 15] for codebooks 1..15, the frame's summed embedding E0(c0)+...+E15(c15)
        [B, H_talker], reduced in one stacked sum as the official code does).
        """
        batch = hidden.shape[0]
        steps = self.talker_config.num_code_groups - 1
        dtype, device = hidden.dtype, hidden.device
        cos, sin = self._rope_tables(device, dtype)
        cache = torch.empty(len(self.model.layers), 2, batch, self.shape.num_kv_heads, steps + 1,
                            self.shape.head_dim, device=device, dtype=dtype)
        x = self.small_to_mtp_projection(torch.stack((hidden, c0_embed), dim=1))
        codes = torch.empty(batch, steps, dtype=torch.long, device=device)
        embeds = [c0_embed]
        start = 0
        for step in range(steps):
            n = x.shape[1]
            for layer, layer_cache in zip(self.model.layers, cache):
                x = layer(x, cos[start:start + n], sin[start:start + n], layer_cache, start)
            logits = self.lm_head[step](self.model.norm(x[:, -1]))
            code = sample(logits, params)
            codes[:, step] = code
            code_embed = self.model.codec_embedding[step](code)
            embeds.append(code_embed)
            start += n
            x = self.small_to_mtp_projection(code_embed).unsqueeze(1)
        return codes, torch.stack(embeds, dim=1).sum(1)
