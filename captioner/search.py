"""Caption search over a step function: greedy, sampling and batched beam search.

Owns inference-time decoding of Xu et al. 2015 ("Show, Attend and Tell", Sec. 4.3 and
5.2: captions are generated with beam search, and the per-word attention maps alpha_t of
Eq. (4)-(5) are what the paper's figures visualise). Like nanochat's engine this module
knows nothing about words or models: it drives a `StepFn` on token ids and carries an
opaque state (a possibly nested tuple of tensors whose dim 0 is the row), which it only
expands (`repeat_interleave`) and reorders (`index_select`).

Conventions shared by all three searches:
- `max_length` is the number of step calls, hence the most words a caption can have. A
  hypothesis that emits <end> at call t (0-based) has t words and is `finished`; one still
  running after `max_length` calls is returned with `finished=False` and `max_length` words
  (its <end> was never scored).
- `min_length` sets log p(<end>) to -inf until that many words exist; with
  `min_length == max_length` every run makes exactly `max_length` calls (for benchmarks).
  `forbid_ids` (e.g. <pad>, <start>, <unk>) are never chosen: their log-prob is set to -inf.
- `score` is the sum of the model's log-probabilities of the words and, when finished, of
  <end> (untempered, unmasked by top-k, so it is comparable across searches).
- `norm_score = score / length ** length_penalty`, `length = len(tokens) + finished` (the
  <end> counts as a predicted token). It ranks hypotheses; `length_penalty=0` ranks by raw
  log-probability, 1 by mean log-probability per predicted token.
- `alphas[i]` is the attention map returned by the step call that produced word i.
- Log-probabilities are assumed <= 0 (log-softmaxed), which the beam search's early stop
  relies on.
- State tensors are never modified in place by the step function (it returns new tensors).
  Beam search relies on it: a state tensor the step function hands back as the very same
  object (e.g. the decoder's attention memory, (B*K, L, D)) still holds K identical rows per
  image, so reordering beams inside an image leaves it unchanged and it is not copied.
  With `expand`, a step function may even keep such tensors at one row per image (B rows
  while the others have B*K): beam search then never copies or reorders them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any, Callable

import torch
from torch import Tensor

State = Any  # a tensor, or a (nested) tuple/list of tensors (or None), dim 0 = rows
StepFn = Callable[[Tensor, State], tuple[Tensor, "Tensor | None", State]]


@dataclass
class Hypothesis:
    tokens: list[int]  # word ids: no <start>, no <end>
    score: float  # sum of step log-probs, incl. <end> when finished
    norm_score: float  # score / length ** length_penalty; what ranks hypotheses
    alphas: Tensor | None  # (len(tokens), L) on the CPU, or None if the step gives no alpha
    finished: bool  # True when the caption ended with <end>
    locations: list[int] | None = None  # the cell read per word, set by callers that know it (hard attention)


def normalise_score(score: float, length: int, length_penalty: float) -> float:
    """Length-normalised score: score / length ** length_penalty (length >= 1 counts <end>)."""
    return score / max(length, 1) ** length_penalty


def map_state(state: State, fn: Callable[[Tensor], Tensor]) -> State:
    """Apply `fn` to every tensor of a (nested) tuple/list state; None passes through."""
    if isinstance(state, Tensor):
        return fn(state)
    if state is None:
        return None
    if isinstance(state, (tuple, list)):
        return type(state)(map_state(s, fn) for s in state)
    raise TypeError(f"search state must be a tensor or a (nested) tuple/list of tensors, got {type(state).__name__}")


def _leaves(state: State) -> list[Tensor]:
    found: list[Tensor] = []
    map_state(state, lambda x: found.append(x) or x)
    return found


def _check_state_rows(state: State, rows: int) -> None:
    def check(x: Tensor) -> Tensor:
        if x.dim() == 0 or x.size(0) != rows:
            raise ValueError(f"every state tensor needs dim 0 == batch_size == {rows}, got shape {tuple(x.shape)}")
        return x

    map_state(state, check)


def _banned(t: int, end_id: int, min_length: int, forbid_ids: tuple[int, ...]) -> list[int]:
    """Ids masked at step t: `forbid_ids` always, <end> while fewer than min_length words exist."""
    return list(forbid_ids) + ([end_id] if t < min_length else [])


def _check_args(batch_size: int, max_length: int, min_length: int) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    if not 0 <= min_length <= max_length:
        raise ValueError(f"min_length must be in [0, max_length={max_length}], got {min_length}")


def _step(step_fn: StepFn, tokens: Tensor, state: State, rows: int, banned: list[int]):
    """One step call; returns float32 log-probs (rows, V) with the `banned` ids at -inf."""
    log_probs, alpha, state = step_fn(tokens, state)
    if log_probs.dim() != 2 or log_probs.size(0) != rows:
        raise ValueError(f"step_fn must return log_probs (N={rows}, V), got shape {tuple(log_probs.shape)}")
    if alpha is not None and (alpha.dim() != 2 or alpha.size(0) != rows):
        raise ValueError(f"step_fn must return alpha (N={rows}, L) or None, got shape {tuple(alpha.shape)}")
    log_probs = log_probs.float()
    if banned:
        # index_fill is out of place: the caller's tensor is never modified
        log_probs = log_probs.index_fill(1, torch.tensor(banned, device=log_probs.device), -math.inf)
    return log_probs, alpha, state


# ---------------------------------------------------------------------------------------
# greedy and sampling: one path per image


def _single_path_search(step_fn, state, batch_size, start_id, end_id, max_length, min_length, length_penalty,
                        forbid_ids, choose):
    """Shared loop of greedy and sampling; `choose(log_probs (B, V)) -> tokens (B,)`."""
    _check_args(batch_size, max_length, min_length)
    _check_state_rows(state, batch_size)
    B = batch_size
    tokens = torch.full((B,), start_id, dtype=torch.long, device=_state_device(state))
    scores = lengths = finished = None
    words, alphas = [], []
    use_alpha = True
    for t in range(max_length):
        log_probs, alpha, state = _step(step_fn, tokens, state, B, _banned(t, end_id, min_length, forbid_ids))
        if scores is None:  # created on the device the model answers on
            scores = torch.zeros(B, device=log_probs.device)
            lengths = torch.zeros(B, dtype=torch.long, device=log_probs.device)
            finished = torch.zeros(B, dtype=torch.bool, device=log_probs.device)
        word = choose(log_probs)  # (B,)
        word_lp = log_probs.gather(1, word[:, None]).squeeze(1)  # (B,)
        # rows already finished keep their score and length; what they are fed from now on is ignored
        scores = torch.where(finished, scores, scores + word_lp)
        is_end = word == end_id
        lengths = lengths + (~finished & ~is_end).long()
        finished = finished | is_end
        words.append(word)
        use_alpha = use_alpha and alpha is not None
        if use_alpha:
            alphas.append(alpha)
        tokens = word
        if bool(finished.all()):
            break
    words_bt = torch.stack(words, 1).cpu()  # (B, T)
    alphas_btl = torch.stack(alphas, 1).detach().float().cpu() if use_alpha else None  # (B, T, L)
    scores_l, lengths_l, finished_l = scores.tolist(), lengths.tolist(), finished.tolist()
    out = []
    for b in range(B):
        n = lengths_l[b]
        out.append([
            Hypothesis(
                tokens=words_bt[b, :n].tolist(),
                score=scores_l[b],
                norm_score=normalise_score(scores_l[b], n + finished_l[b], length_penalty),
                alphas=alphas_btl[b, :n].clone() if alphas_btl is not None else None,
                finished=bool(finished_l[b]),
            )
        ])
    return out


def _state_device(state: State) -> torch.device:
    found = []
    map_state(state, lambda x: found.append(x.device) or x)
    return found[0] if found else torch.device("cpu")


def greedy_search(
    step_fn: StepFn,
    state: State,
    batch_size: int,
    start_id: int,
    end_id: int,
    max_length: int = 20,
    *,
    min_length: int = 0,
    length_penalty: float = 1.0,
    forbid_ids: Sequence[int] = (),
) -> list[list[Hypothesis]]:
    """Arg-max decoding; returns B lists holding one Hypothesis. Equals `beam_search(beam_size=1)`.

    `length_penalty` only sets `norm_score` (greedy does not rank anything).
    """

    def choose(log_probs: Tensor) -> Tensor:
        # topk, not argmax: the same op beam search uses, so ties break identically
        return log_probs.topk(1, dim=1).indices.squeeze(1)

    return _single_path_search(step_fn, state, batch_size, start_id, end_id, max_length, min_length, length_penalty,
                               tuple(forbid_ids), choose)


def sample_search(
    step_fn: StepFn,
    state: State,
    batch_size: int,
    start_id: int,
    end_id: int,
    max_length: int = 20,
    temperature: float = 1.0,
    top_k: int = 0,
    generator: torch.Generator | None = None,
    *,
    min_length: int = 0,
    length_penalty: float = 1.0,
    forbid_ids: Sequence[int] = (),
) -> list[list[Hypothesis]]:
    """Ancestral sampling from softmax(log_probs / temperature), optionally restricted to the top-k words.

    `top_k=0` samples from the full vocabulary; `top_k=1` equals greedy. Pass a seeded
    `torch.Generator` on the log-probs' device for reproducible samples. The returned score
    is the model's (untempered) log-probability of the sampled caption.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (use greedy_search for arg-max decoding), got {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = no restriction), got {top_k}")

    def choose(log_probs: Tensor) -> Tensor:
        logits = log_probs / temperature  # (B, V)
        if 0 < top_k < logits.size(1):
            top = logits.topk(top_k, dim=1)
            logits = torch.full_like(logits, -math.inf).scatter(1, top.indices, top.values)
        probs = torch.softmax(logits, dim=1)  # (B, V)
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)

    return _single_path_search(step_fn, state, batch_size, start_id, end_id, max_length, min_length, length_penalty,
                               tuple(forbid_ids), choose)


# ---------------------------------------------------------------------------------------
# beam search: K beams per image, all B*K rows in one step call


def beam_search(
    step_fn: StepFn,
    state: State,
    batch_size: int,
    start_id: int,
    end_id: int,
    beam_size: int = 3,
    max_length: int = 20,
    length_penalty: float = 1.0,
    n_best: int = 1,
    *,
    min_length: int = 0,
    forbid_ids: Sequence[int] = (),
    expand: Callable[[State, int], State] | None = None,
) -> list[list[Hypothesis]]:
    """Batched beam search; returns B lists of up to `n_best` hypotheses, best `norm_score` first.

    Row b*K + k holds beam k of image b. Candidates are ranked by raw score inside the
    search (as in the classic SAT beam search); a beam that emits <end> is copied to its
    image's pool and stays frozen in its slot (its only continuation is itself at +0), so
    `beam_size=1` is exactly greedy. Length normalisation ranks the final hypotheses.
    An image stops once its pool holds `n_best` hypotheses that no live beam can beat in
    `norm_score` (log-probs <= 0 bound every continuation), and its rows leave the batch.
    Beams still running after `max_length` calls join the ranking as unfinished; the list
    is filled to `n_best` whenever that many hypotheses with a finite score exist, and is
    never empty.

    `expand(state, K)` gives each image its K rows (default: every tensor repeat_interleaved).
    A tensor it leaves at B rows is per-image data the step function reads for all K beams
    (e.g. the decoder's attention memory, see ShowAttendTellDecoder.expand_state).
    """
    _check_args(batch_size, max_length, min_length)
    if beam_size < 1 or n_best < 1:
        raise ValueError(f"beam_size and n_best must be >= 1, got beam_size={beam_size}, n_best={n_best}")
    _check_state_rows(state, batch_size)
    forbid_ids = tuple(forbid_ids)
    K = beam_size
    active = list(range(batch_size))  # original image index of each image still in the batch
    B = batch_size
    if expand is None:
        state = map_state(state, lambda x: x.repeat_interleave(K, dim=0))  # (B*K, ...)
    else:
        state = expand(state, K)  # (B*K, ...) rows, or (B, ...) per-image tensors
        bad = [tuple(x.shape) for x in _leaves(state) if x.dim() == 0 or x.size(0) not in (B, B * K)]
        if bad:
            raise ValueError(f"expand must give state tensors B*K={B * K} (or B={B}) rows, got shapes {bad}")
    # Tensors whose K rows per image are identical (just expanded, never replaced by the step
    # function): id -> tensor, the reference keeps the id from being reused.
    invariant: dict[int, Tensor] = {}
    map_state(state, lambda x: invariant.setdefault(id(x), x))
    device = _state_device(state)
    tokens = torch.full((B * K,), start_id, dtype=torch.long, device=device)
    # only beam 0 is live at first: the K copies are identical and would all pick the same words
    scores = torch.full((B, K), -math.inf, device=device)
    scores[:, 0] = 0.0
    scores = scores.view(B * K)
    finished = torch.zeros(B * K, dtype=torch.bool, device=device)
    hist_words = torch.zeros(B * K, 0, dtype=torch.long, device=device)  # (B*K, t)
    hist_alpha: Tensor | None = None  # (B*K, t, L)
    use_alpha = True
    pools: list[list[Hypothesis]] = [[] for _ in range(batch_size)]  # finished, per original image
    results: list[list[Hypothesis] | None] = [None] * batch_size
    frozen_row: Tensor | None = None  # (V,): -inf except 0 at <end>
    steps = 0

    def _unfinished(i: int, n_words: int) -> list[Hypothesis]:
        """Hypotheses of the not-finished slots of local image i (reads the loop's current tensors)."""
        rows = slice(i * K, (i + 1) * K)  # a view: no gather kernels per image
        row_scores, row_finished = scores[rows].tolist(), finished[rows].tolist()
        words = hist_words[rows].cpu()  # (K, n_words)
        alphas = hist_alpha[rows].float().cpu() if use_alpha and hist_alpha is not None else None  # (K, n_words, L)
        return [
            Hypothesis(
                tokens=words[k, :n_words].tolist(),
                score=row_scores[k],
                norm_score=normalise_score(row_scores[k], n_words, length_penalty),
                alphas=alphas[k, :n_words].clone() if alphas is not None else None,
                finished=False,
            )
            for k in range(K)
            if not row_finished[k]
        ]

    for t in range(max_length):
        N = B * K
        log_probs, alpha, state = _step(step_fn, tokens, state, N, [])  # banned ids are masked in cand below
        V = log_probs.size(1)
        if frozen_row is None:
            frozen_row = torch.full((V,), -math.inf, device=log_probs.device)
            frozen_row[end_id] = 0.0
            scores, finished, hist_words = scores.to(log_probs.device), finished.to(log_probs.device), hist_words.to(log_probs.device)
        cand = scores[:, None] + log_probs  # (N, V): the only full-size pass besides top-k; ours to modify
        banned = _banned(t, end_id, min_length, forbid_ids)
        if banned:
            cand.index_fill_(1, torch.tensor(banned, device=cand.device), -math.inf)
        if bool(finished.any()):  # a finished beam's only continuation is <end> at +0
            cand = torch.where(finished[:, None], frozen_row + scores[:, None], cand)
        cand = cand.view(B, K * V)  # (B, K*V)
        top_scores, top_idx = cand.topk(K, dim=1)  # (B, K)
        parent = (torch.arange(B, device=cand.device)[:, None] * K + top_idx // V).view(N)  # (N,) row it extends
        word = (top_idx % V).view(N)  # (N,)
        scores = top_scores.view(N)
        was_finished = finished.index_select(0, parent)
        newly = (word == end_id) & ~was_finished & torch.isfinite(scores)
        finished = was_finished | newly
        hist_words = torch.cat([hist_words.index_select(0, parent), word[:, None]], 1)  # (N, t+1)
        use_alpha = use_alpha and alpha is not None
        if use_alpha:
            # the alpha that produced word t is the parent's alpha at this step
            a = alpha.detach().index_select(0, parent)[:, None]  # (N, 1, L)
            hist_alpha = a if hist_alpha is None else torch.cat([hist_alpha.index_select(0, parent), a], 1)
        # parents always lie in their child's image block, so beam-invariant tensors need no copy
        # per-image tensors (B rows) are never reordered either
        state = map_state(state, lambda x: x if invariant.get(id(x)) is x or x.size(0) != N else x.index_select(0, parent))
        invariant = {id(x): x for x in _leaves(state) if invariant.get(id(x)) is x}  # drop replaced ones
        tokens = word
        steps = t + 1

        if bool(newly.any()):  # cheap bookkeeping, only on steps where some beam finishes
            rows = newly.nonzero().squeeze(1).tolist()
            row_scores = scores[rows].tolist()
            for row, s in zip(rows, row_scores):
                b = active[row // K]
                pools[b].append(Hypothesis(
                    tokens=hist_words[row, :t].tolist(),  # the word at t is <end>
                    score=s,
                    norm_score=normalise_score(s, t + 1, length_penalty),
                    alphas=hist_alpha[row, :t].float().cpu() if use_alpha else None,
                    finished=True,
                ))
            for b in {active[row // K] for row in rows}:
                pools[b].sort(key=lambda h: -h.norm_score)  # stable: ties keep discovery order

        if t + 1 == max_length:
            break
        # early stop per image: best norm_score any live beam could still reach vs the pool's n_best-th
        live = ~finished & torch.isfinite(scores)
        # continuations only lower the score (log-probs <= 0), so s / L**lp is maximal at an extreme length
        lo, hi = float(t + 1), float(max_length + 1)
        s64 = scores.double()  # float64 so the comparison with the (Python float) pool scores is not rounded
        bound = torch.maximum(s64 / lo**length_penalty, s64 / hi**length_penalty)
        bound = torch.where(live, bound, torch.full_like(bound, -math.inf)).view(B, K).amax(1)  # (B,)
        threshold = torch.tensor(
            [pools[b][n_best - 1].norm_score if len(pools[b]) >= n_best else -math.inf for b in active],
            dtype=torch.float64,
            device=bound.device,
        )
        done = (bound <= threshold).tolist()
        if not any(done):
            continue
        for i, b in enumerate(active):
            if done[i]:
                # an empty pool here means every beam has score -inf: return those rather than nothing
                results[b] = _rank(pools[b], [] if pools[b] else _unfinished(i, steps), n_best)
        keep = [i for i in range(B) if not done[i]]
        if not keep:
            break
        # drop finished images' rows so later steps only pay for images still searching
        keep_images = torch.tensor(keep, device=scores.device)  # (B',)
        keep_rows = (keep_images[:, None] * K + torch.arange(K, device=scores.device)).view(-1)  # (B'*K,)
        active = [active[i] for i in keep]
        B = len(active)
        scores, finished, tokens = scores[keep_rows], finished[keep_rows], tokens[keep_rows]
        hist_words = hist_words[keep_rows]
        hist_alpha = hist_alpha[keep_rows] if hist_alpha is not None else None

        def select_kept(x: Tensor) -> Tensor:
            index = keep_rows if x.size(0) == N else keep_images  # rows, or per-image tensors
            kept = x.index_select(0, index.to(x.device))  # whole images: still beam-invariant
            if invariant.pop(id(x), None) is x:
                invariant[id(kept)] = kept
            return kept

        state = map_state(state, select_kept)

    # images still searching after max_length calls: live beams compete as unfinished captions
    for i, b in enumerate(active):
        if results[b] is None:
            results[b] = _rank(pools[b], _unfinished(i, steps), n_best)
    return results  # type: ignore[return-value]


def _rank(pool: list[Hypothesis], unfinished: list[Hypothesis], n_best: int) -> list[Hypothesis]:
    """Top n_best by norm_score; -inf scores only when nothing finite exists (never empty)."""
    everything = sorted(pool + unfinished, key=lambda h: -h.norm_score)  # stable: finished first on ties
    finite = [h for h in everything if math.isfinite(h.score)]
    return (finite or everything[:1])[:n_best]
