"""Self-critical sequence training (Rennie et al. 2017): the training loop's second objective.

``train.objective: scst`` fine-tunes a cross-entropy model (``train.init``) on the metric it is judged
by. For each training image the decoder samples k captions (``CaptionDecoder.sample``, with
gradients; hard attention samples its cells on the same trajectory), each is scored by CIDEr-D
against the image's references (``rewards.CiderD``, document frequencies from the training split),
and ``losses.scst_loss`` weighs each caption's log-probability by its reward minus a baseline that
does not depend on it: the mean reward of the image's other samples (Luo 2020) or the reward of the
greedy caption (Rennie et al.). Batches hold images, not captions (a per-image dataset).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from torch import nn

from captioner.config import Config, check_scst_entropy
from captioner.training.losses import LossOutput, scst_baseline, scst_loss, sequence_cross_entropy
from captioner.training.rewards import CiderD


class SelfCritical:
    """The SCST objective for one run: the reward over the training references and the sampling settings.

    Args:
        cfg: the run's config (``train.scst``, ``eval``).
        model: the Captioner being trained (its vocabulary, attention kind and decoder).
        train_set: the per-image training dataset; its record index is the reward's image index.
        from_images: whether batches carry images (fine-tuning) rather than cached grids.
    """

    def __init__(self, cfg: Config, model: nn.Module, train_set: Any, from_images: bool) -> None:
        s = cfg.train.scst
        vocab = model.vocab
        self.samples = s.samples
        self.baseline = s.baseline
        self.reward_end = s.reward_end
        self.from_images = from_images
        # encoded captions are <start> w .. <end>: keep the <end> as a word when it is rewarded.
        references = [[ids[1:] if s.reward_end else ids[1:-1] for ids in caps] for caps in train_set.encoded]
        self.reward = CiderD(references, vocab_size=len(vocab))
        self.end_id = vocab.end_id
        # the greedy baseline decodes as validation does (the model's DecodeOptions, greedy), to SCST's length
        greedy = model.decode_options.replace_given(beam=1, max_length=s.max_length or None, forbid_unk=s.forbid_unk)
        self.greedy_mode = model.check_decode_options(greedy).attention_mode
        self.sampling = {"start_id": vocab.start_id, "end_id": vocab.end_id, "max_length": greedy.max_length,
                         "forbid_ids": (vocab.unk_id,) if greedy.forbid_unk else ()}
        # hard attention samples its cells with the words (one trajectory), or reads each word's arg-max cell
        self.sample_mode = s.attention_mode if model.decoder.stochastic else "expectation"
        self.greedy_images = s.greedy_images
        # the location policy's entropy bonus: set explicitly for sampled cells (also when cfg skipped load_config)
        check_scst_entropy(cfg)
        self.entropy_weight = max(s.entropy_weight, 0.0) if self.sample_mode == "sample" else 0.0
        self.xe_weight = s.xe_weight
        self.encoded = train_set.encoded  # per record: its reference captions, encoded
        self.pad_id = vocab.pad_id

    def rewards(self, tokens: torch.Tensor, lengths: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        """CIDEr-D of sampled rows tokens (N, T) with lengths (N,) (an <end> included when sampled)
        against the references of images (N,) (record indices). Returns (N,) float32 on tokens' device."""
        ids = tokens.cpu().numpy()
        n = lengths.cpu().numpy().astype(np.int64)
        if not self.reward_end:
            last = ids[np.arange(len(n)), np.maximum(n - 1, 0)]
            n = n - ((n > 0) & (last == self.end_id))
        scores = self.reward(ids, images.cpu().numpy(), lengths=n)
        return torch.from_numpy(scores).float().to(tokens.device)

    def loss(self, forward: nn.Module, model: nn.Module, batch: Any) -> LossOutput:
        """One batch of images: k samples each, their rewards, baselines and the REINFORCE loss."""
        k = self.samples
        out = forward(batch.inputs, sample={"samples": k, "attention_mode": self.sample_mode, **self.sampling})
        if self.sample_mode == "argmax":  # a deterministic read is no action of the policy: words only
            out = dataclasses.replace(out, location_log_probs=None, location_entropies=None)
        images = batch.indices.repeat_interleave(k)  # (B*k,) record index of each sample
        rewards = self.rewards(out.tokens, out.lengths, images)  # (B*k,)
        greedy = None
        if self.baseline == "greedy":
            greedy = self.greedy_rewards(model, batch.inputs, batch.indices)
        baselines = scst_baseline(rewards.view(-1, k), self.baseline, greedy).reshape(-1)
        res = scst_loss(out, rewards, baselines, entropy_weight=self.entropy_weight)
        if greedy is not None:
            res.parts["greedy_reward"] = greedy.mean()
        if self.xe_weight:
            xe = self.cross_entropy(forward, batch)
            res = LossOutput(loss=res.loss + self.xe_weight * xe, parts={**res.parts, "xe": xe.detach()})
        return res

    def cross_entropy(self, forward: nn.Module, batch: Any) -> torch.Tensor:
        """Teacher-forced cross-entropy of one reference per image, drawn at random (on the CPU RNG, restored
        on resume), read the way validation decodes (``eval.attention_mode``)."""
        from captioner.data.datasets import pad_batch

        indices = batch.indices.tolist()
        picks = [caps[int(torch.randint(len(caps), ()))] for caps in (self.encoded[i] for i in indices)]
        refs = pad_batch(batch.inputs, picks, indices, pad_id=self.pad_id)
        captions, lengths = refs.captions.to(batch.inputs.device), refs.lengths.to(batch.inputs.device)
        out = forward(refs.inputs, captions, lengths, attention_mode=self.greedy_mode)
        return sequence_cross_entropy(out, captions[:, 1:])

    @torch.no_grad()
    def greedy_rewards(self, model: nn.Module, inputs: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """The reward of each image's greedy caption (B,), decoded as at test time (eval mode)."""
        was_training = model.training
        model.eval()
        try:
            grid = model.grid_from(inputs, self.from_images)  # (B, L, D)
            out = model.decoder.sample(grid, 1, greedy=True, attention_mode=self.greedy_mode, **self.sampling)
        finally:
            model.train(was_training)
        return self.rewards(out.tokens, out.lengths, indices)

    def greedy_reward_on(self, model: nn.Module, dataset: Any, device: torch.device, batch_size: int) -> float:
        """Mean greedy reward over the first ``greedy_images`` training images (the per-epoch curve)."""
        from torch.utils.data import DataLoader

        from captioner.data.datasets import collate_captions

        n = min(self.greedy_images, len(dataset))
        if n == 0:
            return float("nan")
        subset = torch.utils.data.Subset(dataset, range(n))
        total = 0.0
        for batch in DataLoader(subset, batch_size=batch_size, collate_fn=collate_captions):
            total += float(self.greedy_rewards(model, batch.inputs.to(device), batch.indices).sum())
        return total / n
