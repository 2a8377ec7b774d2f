"""What the training loop calls on an objective: ``Objective``, the verbs every training objective has.

A step asks its objective for ``loss(forward, batch)``; once the step is taken (every rank alike), ``after_step``
gets the batch's mean reward, all-reduced over the ranks (None when the loss had none); ``on_epoch`` comes before
each epoch's first step. What an objective keeps between steps (a moving baseline) is its ``state_dict``, saved in
every checkpoint and restored on resume; what it adds to an epoch's metrics line is ``epoch_figures``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from captioner.training.losses import LossOutput, attention_mass_loss, attention_supervision_loss


@dataclass
class Needs:
    """What an objective may be built from besides its section (registry.build_objective fills it)."""

    model: nn.Module  # the Captioner being trained
    train_set: Any  # the training dataset (SCST: per image, its record index is the reward's image index)
    from_images: bool  # batches carry images (fine-tuning) rather than cached grids
    hard: bool  # the attention is hard: it has a location policy (config.hard_attention)
    epochs: int  # train.epochs: what a schedule over the run spans
    eval_batch_size: int  # eval.batch_size: images per batch where an objective decodes for its figures
    box_targets: "BoxTargets | None" = None  # train.objective.grounding_weight > 0: each boxed word's box map


class BoxTargets:
    """Per training image, the box map of each word that names a boxed phrase (Flickr30k Entities): what
    ``train.objective.grounding_weight`` pulls that word's alpha towards (losses.attention_supervision_loss).

    A caption word is supervised when its lemma equals the head noun (last word) of a boxed phrase of any of the
    photo's annotated captions; its map is the union of the boxes of every chain such a phrase names
    (data.entities.EntityImage.boxed_heads), as cell fractions normalised over the grid. Looking words up rather
    than aligning phrases serves every caption alike: the references of xe, reinforce, loo and gumbel, and SCST's
    teacher-forced reference. A mirrored training copy (data.mirror) gets the map flipped left-right.

    Args:
        records: the training records, in the dataset's order (batch.indices index them).
        entities: their annotations (data.entities.read_entities).
        vocab: the model's vocabulary.
        grid_hw: (H, W) of the attention grid.
        loss: ``train.objective.grounding_loss``: "cross_entropy" keeps the map (the shares raised to ``power``,
            normalised over the grid); "mass" keeps the cells' shares inside the boxes as they are.
        power: ``train.objective.grounding_power`` (cross_entropy only): 1, the plain map; larger, sharper.
    """

    def __init__(self, records: Sequence[Any], entities: Any, vocab: Any, grid_hw: tuple[int, int],
                 loss: str = "cross_entropy", power: float = 1.0) -> None:
        from captioner.data.entities import lemma
        from captioner.evaluation.regions import cell_shares

        H, W = grid_hw
        self.vocab_size = V = len(vocab)
        ids_of: dict[str, list[int]] = {}
        for word_id in range(V):
            ids_of.setdefault(lemma(vocab.words[word_id]), []).append(word_id)
        keys, maps = [], []
        for index, record in enumerate(records):
            photo = entities.get(record.image_id)
            if photo is None:
                continue
            for head, (boxes, _) in photo.boxed_heads().items():
                if head not in ids_of:
                    continue
                f = cell_shares(boxes, grid_hw)  # boxed_heads' boxes have area (entities.clip_boxes): f.sum() > 0
                if record.mirrored:
                    f = f.reshape(H, W)[:, ::-1].reshape(H * W)
                for word_id in ids_of[head]:
                    keys.append(index * V + word_id)
                    maps.append(f if loss == "mass" else f ** power / (f ** power).sum())
        order = np.argsort(np.asarray(keys, dtype=np.int64), kind="stable")
        self.keys = torch.from_numpy(np.asarray(keys, dtype=np.int64)[order])  # (K,) sorted image * V + word
        self.maps = torch.from_numpy(np.asarray(maps, dtype=np.float32).reshape(-1, H * W)[order])  # (K, L)
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def __len__(self) -> int:
        return int(self.keys.numel())

    def lookup(self, images: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, T, L) box maps and (N, T) bool hits for ``tokens`` (N, T) of captions of ``images`` (N,) (record
        indices), on ``tokens``' device."""
        device = tokens.device
        if device not in self._on:
            self._on[device] = (self.keys.to(device), self.maps.to(device))
        keys, maps = self._on[device]
        if keys.numel() == 0:
            return tokens.new_zeros((*tokens.shape, self.maps.shape[1]), dtype=torch.float32), torch.zeros_like(
                tokens, dtype=torch.bool)
        query = images.to(device).long().unsqueeze(1) * self.vocab_size + tokens.long()  # (N, T)
        pos = torch.searchsorted(keys, query).clamp(max=keys.numel() - 1)  # (N, T)
        hit = keys[pos] == query
        return maps[pos] * hit.unsqueeze(-1), hit  # (N, T, L), (N, T)


class _TeacherForcedReads:
    """The training forward, noting each teacher-forced call's output, captions and rows (what the grounding term
    reads); sampling calls (SCST's) pass through."""

    def __init__(self, forward: nn.Module) -> None:
        self.forward = forward
        self.calls: list[tuple[Any, torch.Tensor, torch.Tensor | None]] = []

    def __call__(self, inputs: torch.Tensor, captions: torch.Tensor | None = None,
                 lengths: torch.Tensor | None = None, **kwargs: Any) -> Any:
        out = self.forward(inputs, captions, lengths, **kwargs)
        if kwargs.get("sample") is None and captions is not None:
            self.calls.append((out, captions, kwargs.get("rows")))
        return out


class Objective:
    """A training objective built from its ``train.objective`` section (``section``) and ``Needs``."""

    # what it reads from the data: True, a batch per image with all its references (the training set's
    # per_image mode: SCST samples its own captions); False, a batch of (image, caption) pairs
    per_image = False
    # DDP must search every step for parameters without a gradient (find_unused_parameters) when a step may
    # leave one out: every cross-entropy objective reaches every parameter (tests/test_ddp.py checks each)
    may_leave_parameters_out = False

    def __init__(self, section: Any, needs: Needs) -> None:
        self.section = section
        self.box_targets = needs.box_targets if section.grounding_weight > 0 else None
        self.grounding_term = attention_mass_loss if section.grounding_loss == "mass" else attention_supervision_loss

    def loss(self, forward: nn.Module, batch: Any) -> LossOutput:
        """One batch's objective. ``forward`` is the training loop's _TrainForward (DDP-wrapped or not)."""
        raise NotImplementedError

    def total_loss(self, forward: nn.Module, batch: Any) -> LossOutput:
        """``loss`` plus, with ``grounding_weight``, the supervised-attention term on the alphas of every caption
        the objective read teacher-forced (losses.attention_supervision_loss), per real target word of those
        captions; ``parts["grounding"]`` is its mean per supervised word. What the training loop calls."""
        if self.box_targets is None:
            return self.loss(forward, batch)
        reads = _TeacherForcedReads(forward)
        res = self.loss(reads, batch)
        if not reads.calls:
            raise RuntimeError(f"train.objective.grounding_weight: the {self.section.kind!r} objective read no "
                               "caption teacher-forced, so no alpha could be supervised")
        total = count = words = 0
        for out, captions, rows in reads.calls:
            images = batch.indices if rows is None else batch.indices.index_select(0, rows.cpu())
            targets = captions[:, 1:]  # (N, T-1): step t predicts token t + 1
            maps, hit = self.box_targets.lookup(images, targets)
            ce_sum, n = self.grounding_term(out.alphas, maps, hit & out.mask)
            total, count, words = total + ce_sum, count + n, words + out.mask.sum()
        term = total / words.clamp(min=1)
        parts = {**res.parts, "grounding": (total / count.clamp(min=1)).detach(),
                 "grounded_words": (count / words.clamp(min=1)).detach()}
        return LossOutput(loss=res.loss + self.section.grounding_weight * term, parts=parts,
                          reward_sum=res.reward_sum, reward_count=res.reward_count)

    def after_step(self, mean_reward: float | None) -> None:
        """The step was taken; ``mean_reward``: the batch's mean reward over every rank (None: the loss had none)."""

    def on_epoch(self, epoch: int) -> None:
        """Epoch ``epoch`` (0-based) is about to train."""

    def epoch_figures(self) -> dict[str, Any]:
        """What this objective adds to the epoch's metrics line."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``'s values (a resume: then the run continues as if never stopped)."""
