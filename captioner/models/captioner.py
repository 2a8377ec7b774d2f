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

from captioner.decoding.options import DecodeOptions
from captioner.models.attention import check_read
from captioner.models.decoders.contract import CaptionDecoder, DecoderOutput
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
        decode_options: how ``generate`` decodes when not told otherwise (decoding/options.py; built from the
            config's eval section by api.build_model).
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
        decode_options: DecodeOptions | None = None,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.refine = refine if refine is not None else nn.Identity()
        self.start_id, self.end_id, self.pad_id, self.unk_id = start_id, end_id, pad_id, unk_id
        self.attention_kind = attention_kind
        self.decode_options = decode_options if decode_options is not None else DecodeOptions()

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
        """Images (B, 3, S, S) -> prepared grid (B, L, D), through the very path cached rows take in training. A
        fine-tuned backbone that cannot be split (a ``timm:`` one: ``encoder.splits`` is False) has no cached
        rows: its images go through the whole backbone, as ``data.use_cache: false`` trains it."""
        if not self.encoder.frozen and not self.encoder.splits:
            return self.prepare_grid(self.encoder.backbone_features(images))
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
        attention_mode: str = "expectation",
        expectation_mask: torch.Tensor | None = None,
        dropout_rows: torch.Tensor | None = None,
        temperature: float = 1.0,
        sample_prob: float = 0.0,
    ) -> DecoderOutput:
        """Teacher-forced decoding over a prepared grid (B, L, D); see CaptionDecoder.forward (``temperature``: τ
        of the "gumbel" read; ``sample_prob``: scheduled sampling's share of input words the model samples itself,
        which only a decoder that reads its words one step at a time takes: the config refuses it elsewhere)."""
        more = {"sample_prob": sample_prob} if sample_prob else {}
        return self.decoder(grid, captions, lengths, attention_mode=attention_mode, expectation_mask=expectation_mask,
                            dropout_rows=dropout_rows, temperature=temperature, **more)

    def check_decode_options(self, options: DecodeOptions) -> DecodeOptions:
        """``options`` as they are, once this model can decode with them: a one-cell read ("argmax"/"sample")
        needs attention that can read one cell (hard attention, or soft attention whose module can); the
        multi-head module refuses it rather than ignore it (attention.check_read)."""
        check_read(options.attention_mode, self.decoder.stochastic, self.decoder.one_cell)
        return options

    @torch.no_grad()
    def generate(self, grid: torch.Tensor, options: DecodeOptions | None = None,
                 min_length: int = 0) -> list[list[Any]]:
        """Decode a prepared grid (B, L, D) into ``options.n_best`` Hypotheses per image (token ids, no words).

        ``options`` as they are (default: the model's, ``decode_options``, its config's eval section); a caller
        with other settings builds them (``model.decode_options.replace_given(beam=5)``: a command merges its
        flags once, decoding/options.py). ``forbid_unk`` never lets the search choose <unk> (for captions a
        person reads); ``block_trigrams`` never lets a caption repeat a trigram (docs/search.md). In the
        one-cell modes ("sample"/"argmax") each Hypothesis also has ``locations``.
        """
        from captioner.decoding.search import search

        options = self.check_decode_options(self.decode_options if options is None else options)
        mode = options.attention_mode
        state = self.decoder.init_state(grid)
        def step_fn(tokens, state):
            # alpha and, in the one-cell modes, the cell read (else None) per word: the search keeps both with
            # the beams (Hypothesis.alphas / .locations)
            log_probs, alpha, location, state = self.decoder.step_with_location(tokens, state, attention_mode=mode,
                                                                                dense=False)
            return log_probs, (alpha, location), state

        # <pad> and <start> are never words; forbidding them keeps word i aligned with alpha i. The beams share
        # the attention memory at one row per image (expand_state): beam search never copies it.
        forbid = (self.pad_id, self.start_id) + ((self.unk_id,) if options.forbid_unk else ())
        return search(step_fn, state, options, batch_size=grid.size(0), start_id=self.start_id, end_id=self.end_id,
                      forbid_ids=forbid, expand=self.decoder.expand_state, min_length=min_length,
                      static_rows=self.decoder.static_rows)
