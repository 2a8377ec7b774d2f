"""Encoder + decoder as one captioner, ``build_model(cfg, vocab)`` and ``load_captioner``.

``build_model`` is the only function that reads the config: it turns
``cfg.model`` into the constructor arguments of the encoder, the optional grid
self-attention and the Show-Attend-Tell decoder (Xu et al. 2015, §3).
The split mirrors timm's ``forward_features`` / head: ``encoder.backbone_features``
is the frozen, cacheable part; ``prepare_grid`` (projection + self-attention) and
the decoder are what training updates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from captioner.config import Config, config_from_dict
from captioner.data.vocab import Vocab
from captioner.models.attention import SelfAttentionEncoder
from captioner.models.decoder import DecoderOutput, ShowAttendTellDecoder
from captioner.models.encoder import Encoder, build_encoder


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
        decoder: the LSTM decoder with soft or hard attention.
        vocab: the vocabulary the decoder's ids refer to.
        refine: optional self-attention over the grid (identity when it has no layers).
        attention_kind: "soft", "hard", "key_value" or "multi_head" (recorded in outputs).
        attention_mode: default decoding mode for hard attention (expectation | argmax | sample).
        max_length: default for the most words a decoded caption may have.
        length_penalty: default beam-search ranking exponent (score / length ** length_penalty).
    """

    def __init__(
        self,
        encoder: Encoder,
        decoder: ShowAttendTellDecoder,
        vocab: Vocab,
        refine: nn.Module | None = None,
        attention_kind: str = "soft",
        attention_mode: str = "expectation",
        max_length: int = 20,
        length_penalty: float = 1.0,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.refine = refine if refine is not None else nn.Identity()
        self.vocab = vocab
        self.attention_kind = attention_kind
        self.attention_mode = attention_mode
        self.max_length = max_length
        self.length_penalty = length_penalty
        self.config: Config | None = None

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

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, S, S) -> prepared grid (B, L, D)."""
        return self.prepare_grid(self.encoder.backbone_features(images))

    def forward(
        self,
        grid: torch.Tensor,
        captions: torch.Tensor,
        lengths: torch.Tensor,
        attention_mode: str = "soft",
        expectation_mask: torch.Tensor | None = None,
    ) -> DecoderOutput:
        """Teacher-forced decoding over a prepared grid (B, L, D); see ShowAttendTellDecoder.forward."""
        return self.decoder(grid, captions, lengths, attention_mode=attention_mode, expectation_mask=expectation_mask)

    def decode_mode(self, attention_mode: str | None) -> str:
        """The attention mode decoding uses: soft models always decode softly."""
        if self.attention_kind != "hard":
            return "soft"
        return attention_mode or self.attention_mode

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
    ) -> list[list[Any]]:
        """Decode a prepared grid (B, L, D) into n_best Hypotheses per image (token ids, no words).

        ``max_length`` / ``length_penalty`` default to the model's (from the config it was built with).
        ``forbid_unk`` never lets the search choose <unk> (for captions a person reads).
        In hard attention's "sample"/"argmax" modes each Hypothesis also has ``locations``.
        """
        from captioner.search import beam_search, greedy_search

        max_length = self.max_length if max_length is None else max_length
        length_penalty = self.length_penalty if length_penalty is None else length_penalty
        mode = self.decode_mode(attention_mode)
        state = self.decoder.init_state(grid)
        chosen = mode in ("sample", "argmax")  # hard attention reads one cell per word: report which

        def step_fn(tokens, state):
            if not chosen:
                return self.decoder.step(tokens, state, attention_mode=mode)
            log_probs, alpha, location, state = self.decoder.step_with_location(tokens, state, attention_mode=mode)
            # The search carries one per-word tensor per row (and reorders it with the beams): the
            # cell rides along as an extra column of alpha, split off again below.
            return log_probs, torch.cat([alpha.float(), location.float().unsqueeze(1)], dim=1), state

        # <pad> and <start> are never words; forbidding them keeps word i aligned with alpha i.
        common = dict(batch_size=grid.size(0), start_id=self.vocab.start_id, end_id=self.vocab.end_id,
                      max_length=max_length, forbid_ids=(self.vocab.pad_id, self.vocab.start_id)
                      + ((self.vocab.unk_id,) if forbid_unk else ()))
        if beam_size == 1 and n_best == 1:
            hyps = greedy_search(step_fn, state, min_length=min_length, **common)
        else:
            # expand_state keeps the attention memory at one row per image: beams share it, never copy it
            hyps = beam_search(step_fn, state, beam_size=beam_size, length_penalty=length_penalty,
                               n_best=n_best, min_length=min_length, expand=self.decoder.expand_state, **common)
        if chosen:
            for hyp in (h for per_image in hyps for h in per_image):
                if hyp.alphas is not None:
                    hyp.locations = hyp.alphas[:, -1].round().long().tolist()
                    hyp.alphas = hyp.alphas[:, :-1]
        return hyps

    @torch.no_grad()
    def caption(
        self,
        images: Sequence[Any],
        beam: int = 3,
        attention_mode: str | None = None,
        max_length: int | None = None,
        n_best: int = 1,
        length_penalty: float | None = None,
        forbid_unk: bool = True,
    ) -> list[dict]:
        """Caption PIL images or image paths (``forbid_unk``: no <unk> in the captions, the default here).

        Returns, per image, a dict: ``caption`` (str), ``words``, ``alphas`` (numpy, (n_words, L)),
        ``grid_hw`` (H, W), ``score`` (sum of log-probabilities), ``attention_mode``, ``locations``
        (the grid cell read per word in hard attention's "sample"/"argmax" modes, else None) and
        ``n_best`` (every hypothesis as {caption, words, score}).
        """
        from captioner.data.images import load_image

        was_training = self.training
        self.eval()
        try:
            pil = [load_image(im) if isinstance(im, (str, Path)) else im for im in images]
            if not pil:
                return []
            batch = torch.stack([self.transform(im) for im in pil]).to(self.device)  # (B, 3, S, S)
            grid = self.encode(batch)  # (B, L, D)
            mode = self.decode_mode(attention_mode)
            hyps = self.generate(grid, beam_size=beam, max_length=max_length, attention_mode=attention_mode,
                                 n_best=n_best, length_penalty=length_penalty, forbid_unk=forbid_unk)
        finally:
            self.train(was_training)
        results = []
        for per_image in hyps:
            best = per_image[0]
            words = self.vocab.decode(best.tokens, keep_unk=True)
            alphas = (best.alphas.float().cpu().numpy() if best.alphas is not None
                      else np.zeros((len(best.tokens), grid.size(1)), dtype=np.float32))
            results.append({
                "caption": " ".join(words),
                "words": words,
                "alphas": alphas[: len(words)],
                "grid_hw": self.grid_hw,
                "score": float(best.score),
                "attention_mode": mode,
                "locations": None if best.locations is None else best.locations[: len(words)],
                "n_best": [_hypothesis_words(self.vocab, h) for h in per_image],
            })
        return results


def _hypothesis_words(vocab: Vocab, hyp: Any) -> dict:
    words = vocab.decode(hyp.tokens, keep_unk=True)
    return {"caption": " ".join(words), "words": words, "score": float(hyp.score)}


def decode_max_length(cfg: Config) -> int:
    """The most words a decoded caption may have: ``eval.max_length``, or when that is 0, the
    longest caption training saw (``data.max_length``)."""
    return cfg.eval.max_length or cfg.data.max_length


def build_model(cfg: Config, vocab: Vocab) -> Captioner:
    """The one translation of config into constructor arguments."""
    enc = cfg.model.encoder
    encoder = build_encoder(
        name=enc.name,
        pretrained=enc.pretrained,
        weights_path=enc.weights_path or None,
        input_size=enc.input_size,
        stage=None if enc.stage == -1 else enc.stage,
        grid_size=enc.grid_size or None,
        proj_dim=enc.proj_dim or None,
        finetune_blocks=enc.finetune_blocks,
    )
    refine_layers: list[nn.Module] = []
    if enc.position_embedding:
        H, W = encoder.grid_hw
        refine_layers.append(GridPositionEmbedding(H * W, encoder.out_dim))
    if enc.self_attention_layers > 0:
        refine_layers.append(SelfAttentionEncoder(dim=encoder.out_dim, layers=enc.self_attention_layers,
                                                  heads=cfg.model.attention.heads))
    refine = nn.Sequential(*refine_layers) if refine_layers else None
    att, dec = cfg.model.attention, cfg.model.decoder
    decoder = ShowAttendTellDecoder(
        vocab_size=len(vocab),
        feature_dim=encoder.out_dim,
        embed_dim=dec.embed_dim,
        hidden_dim=dec.hidden_dim,
        attention_dim=att.attention_dim,
        scorer=att.scorer,
        attention=att.kind,
        heads=att.heads,
        gate=dec.gate,
        dropout=dec.dropout,
        feature_dropout=dec.feature_dropout,
        pad_id=vocab.pad_id,
    )
    model = Captioner(encoder, decoder, vocab, refine=refine, attention_kind=att.kind,
                      attention_mode=cfg.eval.attention_mode, max_length=decode_max_length(cfg),
                      length_penalty=cfg.eval.length_penalty)
    model.config = cfg
    return model


def load_captioner(path: str | Path | None = None, device: str = "cpu") -> Captioner:
    """Rebuild a captioner from a checkpoint (file, or run directory holding best.pt / last.pt), or
    with no path or a shipped model's name (``"flickr8k"``) the pretrained model shipped with the
    package (captioner/zoo.py).

    The checkpoint carries the resolved config and the vocabulary; the model is rebuilt with
    ``pretrained=False`` (its weights, encoder included, come from the checkpoint) and the
    state dict is checked key by key, so a mismatch names the field that differs.
    """
    from captioner.checkpoint import CheckpointError, check_state_dict, load_checkpoint
    from captioner.zoo import is_shipped_name, load_shipped

    if path is None or is_shipped_name(str(path)):
        return load_shipped(None if path is None else str(path), device=device)
    payload = load_checkpoint(path, map_location="cpu")
    for key in ("config", "vocab", "model"):
        if key not in payload:
            raise CheckpointError(f"{path}: checkpoint has no {key!r} entry (keys: {', '.join(payload)})")
    try:
        cfg = config_from_dict(payload["config"])
    except ValueError as err:
        raise CheckpointError(f"{path}: the stored config is invalid: {err}") from None
    cfg.model.encoder.pretrained = False  # the weights come from the checkpoint; never touch the network
    try:
        vocab = Vocab.from_dict(payload["vocab"])
    except (ValueError, TypeError, KeyError) as err:
        raise CheckpointError(f"{path}: the stored vocabulary is invalid: {err}") from None
    model = build_model(cfg, vocab)
    check_state_dict(payload["model"], model.state_dict())
    model.load_state_dict(payload["model"])
    model.to(device)
    model.eval()
    return model
