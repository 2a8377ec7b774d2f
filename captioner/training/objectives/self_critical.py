"""Self-critical sequence training (Rennie et al. 2017): ``train.objective.kind: scst``.

It fine-tunes a cross-entropy model (``train.init``) on the metric it is judged by. For each training image the
decoder samples k captions (``CaptionDecoder.sample``, with gradients; hard attention samples its cells on the same
trajectory, or reads each word's arg-max cell), each is scored by CIDEr-D against the image's references
(``rewards.CiderD``, document frequencies from the training split), and ``losses.scst_loss`` weighs each caption's
log-probability by its reward minus a baseline that does not depend on it: the mean reward of the image's other
samples (Luo 2020) or the reward of the greedy caption (Rennie et al.). Batches hold images, not captions (a
per-image dataset). With ``reward_end`` the <end> of sampled and reference captions is scored as a word; with
``sample_temperature`` T the words are drawn from softmax(logits / T), and T's policy is the one the gradient moves.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from torch import nn

from captioner.training.losses import LossOutput, scst_baseline, scst_loss, sequence_cross_entropy
from captioner.training.objectives.base import Needs, Objective
from captioner.training.rewards import CiderD


class SelfCritical(Objective):
    """The SCST objective of one run: the reward over the training references and the sampling settings."""

    per_image = True  # it samples its own captions of each image, scored against all its references
    # hard attention reading its arg-max cell trains no scorer without xe_weight's term
    may_leave_parameters_out = True

    def __init__(self, section: Any, needs: Needs) -> None:
        super().__init__(section, needs)
        s, model = section, needs.model
        vocab = model.vocab
        self.model, self.train_set, self.from_images = model, needs.train_set, needs.from_images
        self.eval_batch_size = needs.eval_batch_size
        self.end_id = vocab.end_id
        # encoded captions are <start> w .. <end>: the <end> stays a word where it is rewarded
        references = [[ids[1:] if s.reward_end else ids[1:-1] for ids in caps] for caps in needs.train_set.encoded]
        self.reward = CiderD(references, vocab_size=len(vocab))
        # the greedy baseline decodes as validation does (the model's DecodeOptions, greedy), to SCST's length
        greedy = model.decode_options.replace_given(beam=1, max_length=s.max_length or None, forbid_unk=s.forbid_unk)
        self.greedy_mode = model.check_decode_options(greedy).attention_mode
        self.sampling = {"start_id": vocab.start_id, "end_id": vocab.end_id, "max_length": greedy.max_length,
                         "forbid_ids": (vocab.unk_id,) if greedy.forbid_unk else ()}
        # hard attention samples its cells with the words (one trajectory), or reads each word's arg-max cell
        self.sample_mode = s.attention_mode if needs.hard else "expectation"
        self.entropy_weight = s.location_entropy_weight if self.sample_mode == "sample" else 0.0
        self.pad_id = vocab.pad_id

    def rewards(self, tokens: torch.Tensor, lengths: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        """CIDEr-D of sampled rows tokens (N, T) with lengths (N,) (an <end> included when sampled)
        against the references of images (N,) (record indices). Returns (N,) float32 on tokens' device."""
        ids = tokens.cpu().numpy()
        n = lengths.cpu().numpy().astype(np.int64)
        if not self.section.reward_end:
            last = ids[np.arange(len(n)), np.maximum(n - 1, 0)]
            n = n - ((n > 0) & (last == self.end_id))
        scores = self.reward(ids, images.cpu().numpy(), lengths=n)
        return torch.from_numpy(scores).float().to(tokens.device)

    def loss(self, forward: nn.Module, batch: Any) -> LossOutput:
        """One batch of images: k samples each, their rewards, baselines and the REINFORCE loss."""
        s = self.section
        k = s.samples
        out = forward(batch.inputs, sample={"samples": k, "attention_mode": self.sample_mode,
                                            "temperature": s.sample_temperature, **self.sampling})
        if self.sample_mode == "argmax":  # a deterministic read is no action of the policy: words only
            out = dataclasses.replace(out, location_log_probs=None, location_entropies=None)
        images = batch.indices.repeat_interleave(k)  # (B*k,) record index of each sample
        rewards = self.rewards(out.tokens, out.lengths, images)  # (B*k,)
        greedy = self.greedy_rewards(batch.inputs, batch.indices) if s.baseline == "greedy" else None
        baselines = scst_baseline(rewards.view(-1, k), s.baseline, greedy).reshape(-1)
        res = scst_loss(out, rewards, baselines, entropy_weight=self.entropy_weight)
        if greedy is not None:
            res.parts["greedy_reward"] = greedy.mean()
        if s.xe_weight or s.grounding_weight:  # the grounding term supervises this teacher-forced reference's alpha
            xe = self.cross_entropy(forward, batch)
            res = LossOutput(loss=res.loss + s.xe_weight * xe if s.xe_weight else res.loss,
                             parts={**res.parts, "xe": xe.detach()}, reward_sum=res.reward_sum,
                             reward_count=res.reward_count)
        return res

    def cross_entropy(self, forward: nn.Module, batch: Any) -> torch.Tensor:
        """Teacher-forced cross-entropy of one reference per image, drawn at random (on the CPU RNG, restored
        on resume), read the way validation decodes (``eval.attention_mode``); label-smoothed by
        ``label_smoothing``."""
        from captioner.data.datasets import pad_batch

        indices = batch.indices.tolist()
        encoded = self.train_set.encoded
        picks = [caps[int(torch.randint(len(caps), ()))] for caps in (encoded[i] for i in indices)]
        refs = pad_batch(batch.inputs, picks, indices, pad_id=self.pad_id)
        captions, lengths = refs.captions.to(batch.inputs.device), refs.lengths.to(batch.inputs.device)
        out = forward(refs.inputs, captions, lengths, attention_mode=self.greedy_mode)
        return sequence_cross_entropy(out, captions[:, 1:], self.section.label_smoothing)

    @torch.no_grad()
    def greedy_rewards(self, inputs: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """The reward of each image's greedy caption (B,), decoded as at test time (eval mode)."""
        model = self.model
        was_training = model.training
        model.eval()
        try:
            grid = model.grid_from(inputs, self.from_images)  # (B, L, D)
            out = model.decoder.sample(grid, 1, greedy=True, attention_mode=self.greedy_mode, **self.sampling)
        finally:
            model.train(was_training)
        return self.rewards(out.tokens, out.lengths, indices)

    def epoch_figures(self) -> dict[str, Any]:
        """``train_greedy_reward``: the mean greedy reward over the first ``greedy_images`` training images."""
        from torch.utils.data import DataLoader

        from captioner.data.datasets import collate_captions

        n = min(self.section.greedy_images, len(self.train_set))
        if n == 0:
            return {"train_greedy_reward": float("nan")}
        device = next(self.model.parameters()).device
        subset = torch.utils.data.Subset(self.train_set, range(n))
        total = 0.0
        for batch in DataLoader(subset, batch_size=self.eval_batch_size, collate_fn=collate_captions):
            total += float(self.greedy_rewards(batch.inputs.to(device), batch.indices).sum())
        return {"train_greedy_reward": total / n}
