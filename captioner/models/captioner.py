"""Encoder + decoder as one captioner module (Xu et al. 2015, §3): images or grids in, token ids out.

A pure module: it knows neither the ``Config`` nor the ``Vocab``; it takes the special token ids
it needs, and ``captioner/api.py`` builds it from a config (``build_model``) and turns its token ids
into words. The split mirrors timm's ``forward_features`` / head: ``encoder.cache_features`` is the
frozen, cacheable part (the whole backbone, or its bottom below fine-tuned blocks); ``prepare_rows`` (the
fine-tuned top blocks, if any, then ``prepare_grid``: projection + self-attention) and the decoder are what
training updates. Images and cached rows take the same path (``encode``, ``grid_from``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from captioner.models.attention import check_decoding_mode, resolve_mode
from captioner.models.decoders import CaptionDecoder, DecoderOutput
from captioner.models.encoder import Encoder


class GridPositionEmbedding(nn.Module):
    """Adds a learned vector per grid location: a_i + p_i for i in 1..L.

    Not in Xu et al. 2015. The context z_t is a weighted average of annotation vectors, which
    carry little absolute position; captions that name spatial relations ("to the left of")
    need it. Initialised at zero, so training starts from the paper's model.

    Args:
        locations: L = H * W.
        dim: D, the size of an annotation vector.
    """

    def __init__(self, locations: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, locations, dim))

    def forward(self, grid: torch.Tensor) -> torch.Tensor:
        if grid.size(1) != self.weight.size(1):
            raise ValueError(f"grid has {grid.size(1)} locations, the position embedding {self.weight.size(1)}")
        return grid + self.weight  # (B, L, D)


class Captioner(nn.Module):
    """An image captioner: grid = encode(images); decoder attends over the grid word by word.

    Args:
        encoder: backbone producing the annotation grid (B, L, D) and its (H, W).
        decoder: any decoder that meets the contract (models/decoders/contract.py): the LSTM of the paper
            with soft or hard attention, or the Transformer.
        start_id, end_id, pad_id, unk_id: the special token ids decoding needs (<start> begins a
            caption, <end> ends it, <pad> and <start> are never chosen, <unk> only when allowed).
        refine: optional self-attention over the grid (identity when it has no layers).
        attention_kind: "soft", "hard", "key_value" or "multi_head" (recorded in outputs).
        attention_mode: default decoding mode for hard attention (expectation | argmax | sample).
        max_length: default for the most words a decoded caption may have.
        length_penalty: default beam-search ranking exponent (score / length ** length_penalty).
        block_trigrams: default for banning words that would repeat a trigram of their caption (search.py).
    """

    def __init__(
        self,
        encoder: Encoder,
        decoder: CaptionDecoder,
        *,
        start_id: int,
        end_id: int,
        pad_id: int,
        unk_id: int,
        refine: nn.Module | None = None,
        attention_kind: str = "soft",
        attention_mode: str = "expectation",
        max_length: int = 20,
        length_penalty: float = 1.0,
        block_trigrams: bool = False,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.refine = refine if refine is not None else nn.Identity()
        self.start_id, self.end_id, self.pad_id, self.unk_id = start_id, end_id, pad_id, unk_id
        self.attention_kind = attention_kind
        self.attention_mode = attention_mode
        self.max_length = max_length
        self.length_penalty = length_penalty
        self.block_trigrams = block_trigrams

    @property
    def transform(self):
        """The image preprocessing that matches the encoder's weights (PIL RGB -> (3, S, S))."""
        return self.encoder.transform

    @property
    def grid_hw(self) -> tuple[int, int]:
        return tuple(self.encoder.grid_hw)

    @property
    def device(self) -> torch.device:
        return next(self.decoder.parameters()).device

    def prepare_grid(self, grid: torch.Tensor) -> torch.Tensor:
        """Backbone grid (B, L, D_backbone) -> decoder input grid (B, L, D): projection + self-attention."""
        return self.refine(self.encoder.project(grid))

    def prepare_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """What the feature cache stores (B, l, C) -> decoder input grid (B, L, D): the encoder's trainable top
        blocks (``encoder.finish``; none when it is frozen), then ``prepare_grid``."""
        return self.prepare_grid(self.encoder.finish(rows))

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, S, S) -> prepared grid (B, L, D), through the very path cached rows take in training."""
        return self.prepare_rows(self.encoder.cache_features(images))

    def grid_from(self, inputs: torch.Tensor, images: bool) -> torch.Tensor:
        """A batch's inputs -> prepared grid (B, L, D): images (B, 3, S, S) through the whole encoder, cached
        rows (B, l, C) through ``prepare_rows`` only."""
        return self.encode(inputs) if images else self.prepare_rows(inputs)

    def forward(
        self,
        grid: torch.Tensor,
        captions: torch.Tensor,
        lengths: torch.Tensor,
        attention_mode: str = "soft",
        expectation_mask: torch.Tensor | None = None,
        dropout_rows: torch.Tensor | None = None,
    ) -> DecoderOutput:
        """Teacher-forced decoding over a prepared grid (B, L, D); see CaptionDecoder.forward."""
        return self.decoder(grid, captions, lengths, attention_mode=attention_mode, expectation_mask=expectation_mask,
                            dropout_rows=dropout_rows)

    def decode_mode(self, attention_mode: str | None) -> str:
        """The attention mode decoding uses, resolved once per decode: soft models decode softly unless asked to
        read one cell per word ("argmax"/"sample"), which they do when their attention can (else an error).
        Training-only reads ("gumbel") are refused."""
        mode = attention_mode or self.attention_mode
        check_decoding_mode(mode)
        return resolve_mode(mode, self.decoder.stochastic, self.decoder.one_cell)

    @torch.no_grad()
    def generate(
        self,
        grid: torch.Tensor,
        beam_size: int = 1,
        max_length: int | None = None,
        attention_mode: str | None = None,
        n_best: int = 1,
        length_penalty: float | None = None,
        min_length: int = 0,
        forbid_unk: bool = False,
        block_trigrams: bool | None = None,
    ) -> list[list[Any]]:
        """Decode a prepared grid (B, L, D) into n_best Hypotheses per image (token ids, no words).

        ``max_length`` / ``length_penalty`` / ``block_trigrams`` default to the model's (its constructor's).
        ``forbid_unk`` never lets the search choose <unk> (for captions a person reads); ``block_trigrams``
        never lets a caption repeat a trigram (search.py).
        In hard attention's "sample"/"argmax" modes each Hypothesis also has ``locations``.
        """
        from captioner.search import beam_search, greedy_search

        max_length = self.max_length if max_length is None else max_length
        length_penalty = self.length_penalty if length_penalty is None else length_penalty
        block_trigrams = self.block_trigrams if block_trigrams is None else block_trigrams
        mode = self.decode_mode(attention_mode)
        state = self.decoder.init_state(grid)
        def step_fn(tokens, state):
            # alpha and, in hard attention's "sample"/"argmax" modes, the cell read (else None) per word:
            # the search keeps both with the beams (Hypothesis.alphas / .locations)
            log_probs, alpha, location, state = self.decoder.step_with_location(tokens, state, attention_mode=mode,
                                                                                dense=False)
            return log_probs, (alpha, location), state

        # <pad> and <start> are never words; forbidding them keeps word i aligned with alpha i.
        common = dict(batch_size=grid.size(0), start_id=self.start_id, end_id=self.end_id,
                      max_length=max_length, forbid_ids=(self.pad_id, self.start_id)
                      + ((self.unk_id,) if forbid_unk else ()), block_trigrams=block_trigrams)
        if beam_size == 1 and n_best == 1:
            hyps = greedy_search(step_fn, state, min_length=min_length, **common)
        else:
            # expand_state keeps the attention memory at one row per image: beams share it, never copy it
            hyps = beam_search(step_fn, state, beam_size=beam_size, length_penalty=length_penalty,
                               n_best=n_best, min_length=min_length, expand=self.decoder.expand_state, **common)
        return hyps
