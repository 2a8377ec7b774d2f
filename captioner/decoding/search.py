"""The search: greedy and batched beam search over a step function and token ids (Xu et al. 2015, Sec. 4.3 and
5.2), chosen by ``search`` from the decode's ``DecodeOptions``, whose settings (and their one default) every
search reads. It knows no words and no model: it drives a ``StepFn`` and carries an opaque state, which it only
expands and reorders. Its conventions (lengths, scores, per-word maps, per-image state, host reads) are
docs/search.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from captioner import fast as fast_paths
from captioner.decoding.diverse import diverse_first, diverse_top
from captioner.decoding.logits import BannedIds, Logits, _ban, _RowBans
from captioner.decoding.options import DecodeOptions

State = Any  # a tensor, or a (nested) tuple/list of tensors (or None), dim 0 = rows
StepFn = Callable[[Tensor, State], tuple[Tensor, "Tensor | tuple[Tensor, Tensor | None] | None", State]]


@dataclass
class Hypothesis:
    tokens: list[int]  # word ids: no <start>, no <end>
    score: float  # sum of step log-probs, incl. <end> when finished
    norm_score: float  # score / length ** length_penalty; what ranks hypotheses
    alphas: Tensor | None  # (len(tokens), L) on the CPU, or None if the step gives no alpha
    finished: bool  # True when the caption ended with <end>
    locations: list[int] | None = None  # the cell read per word (hard attention), when the step function gives it


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


class _StepBans:
    """The ids one search masks at each step: `forbid_ids` always, <end> too while fewer than min_length words
    exist; each set's index tensor is built once per search (BannedIds), not at every step."""

    def __init__(self, forbid_ids: Sequence[int], end_id: int, min_length: int) -> None:
        self.always, self.early = BannedIds(forbid_ids), BannedIds((*forbid_ids, end_id))
        self.min_length = min_length

    def at(self, t: int) -> BannedIds:
        return self.early if t < self.min_length else self.always


def _to_host(*tensors: Tensor | None) -> list[Tensor | None]:
    """The tensors (or None) on the CPU after one wait for the device, however many there are (each .cpu() would
    wait on its own): CUDA copies into page-locked memory without waiting, then the stream is synchronised once."""
    devices = {x.device for x in tensors if x is not None and x.device.type != "cpu"}
    if not devices:
        return list(tensors)
    if any(d.type != "cuda" for d in devices):  # no stream to wait on: a blocking copy each
        return [None if x is None else x.cpu() for x in tensors]
    host = [None if x is None else x.to("cpu", non_blocking=True) for x in tensors]
    for device in devices:
        torch.cuda.current_stream(device).synchronize()
    return host


def _check_args(batch_size: int, max_length: int, min_length: int) -> None:
    """What the options (checked by DecodeOptions) do not hold: the batch, and min_length against max_length."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not 0 <= min_length <= max_length:
        raise ValueError(f"min_length must be in [0, max_length={max_length}], got {min_length}")


PerWord = "tuple[Tensor | None, ...]"  # per-word tensors of one step, each (N, ...): (alpha, location)


def _step(step_fn: StepFn, tokens: Tensor, state: State, rows: int, banned: "BannedIds | Sequence[int]"):
    """One step call; returns float32 log-probs (rows, V) with the `banned` ids at -inf (or the step's Logits as
    they are: their reader bans), the per-word tensors as a tuple (alpha, and the read location when the step
    function gives one) or None, and the state."""
    log_probs, per_word, state = step_fn(tokens, state)
    if isinstance(log_probs, Logits) and not fast_paths.enabled():  # the reference: dense log-probs
        log_probs = log_probs.dense()
    scores = log_probs.logits if isinstance(log_probs, Logits) else log_probs
    if scores.dim() != 2 or scores.size(0) != rows:
        raise ValueError(f"step_fn must return log_probs (N={rows}, V), got shape {tuple(scores.shape)}")
    if per_word is not None:
        per_word = (per_word,) if isinstance(per_word, Tensor) else tuple(per_word)
        alpha = per_word[0]
        if alpha is None or alpha.dim() != 2 or alpha.size(0) != rows:
            raise ValueError(f"step_fn must return alpha (N={rows}, L) or None, got "
                             f"{None if alpha is None else tuple(alpha.shape)}")
        bad = [tuple(x.shape) for x in per_word[1:] if x is not None and (x.dim() == 0 or x.size(0) != rows)]
        if bad:
            raise ValueError(f"step_fn's per-word tensors must have N={rows} rows, got shapes {bad}")
        per_word = tuple(x.detach() if x is not None else None for x in per_word)
    if isinstance(log_probs, Logits):  # banned by the search that reads it (Logits.best)
        return log_probs, per_word, state
    return _ban(log_probs.float(), banned), per_word, state


HostRow = "tuple[list[int], Tensor | None, list[int] | None]"  # a row on the host: tokens, alphas (n, L), cells


def _hypothesis(row: HostRow, score: float, finished: bool, length_penalty: float) -> Hypothesis:
    """The one place a Hypothesis is made, from a row already on the host (_History.host_rows)."""
    tokens, alphas, locations = row
    if alphas is not None:
        alphas = alphas.clone()  # (n, L): owns its memory, not a view of the copied rows'
    return Hypothesis(tokens=tokens, score=score, finished=finished, alphas=alphas, locations=locations,
                      norm_score=normalise_score(score, len(tokens) + finished, length_penalty))


class _History:
    """Per-row histories of one search: the words and each per-word tensor, (rows, t, ...) after t steps."""

    def __init__(self, rows: int, device: torch.device) -> None:
        self.words = torch.zeros(rows, 0, dtype=torch.long, device=device)  # (rows, t)
        self.per_word: list[Tensor | None] | None = None  # None once a step gave no per-word tensors
        self._started = False

    def append(self, words: Tensor, per_word: "PerWord | None", parent: Tensor | None = None) -> None:
        """Add step t's words (rows,) and per-word tensors; ``parent`` (rows,) reorders the history first."""
        pick = (lambda x: x) if parent is None else (lambda x: x.index_select(0, parent))
        self.words = torch.cat([pick(self.words), words[:, None]], 1)
        if not self._started:  # the first step decides whether per-word tensors are kept
            self._started = True
            self.per_word = None if per_word is None else [None if x is None else pick(x)[:, None] for x in per_word]
            return
        if self.per_word is None or per_word is None:
            self.per_word = None
            return
        self.per_word = [None if old is None or new is None else torch.cat([pick(old), pick(new)[:, None]], 1)
                         for old, new in zip(self.per_word, per_word)]

    def keep(self, rows: Tensor) -> None:
        self.words = self.words.index_select(0, rows)
        if self.per_word is not None:
            self.per_word = [None if x is None else x.index_select(0, rows) for x in self.per_word]

    def host_rows(self, index: Tensor | None, n: int, lengths: list[int] | None = None) -> list[HostRow]:
        """The rows ``index`` (n', a tensor on the history's device; None: every row) copied to the host at once,
        each as (its first n words, their alphas (n, L) float32, their read cells), or its first lengths[i]."""
        def pick(x: Tensor | None) -> Tensor | None:  # (rows, t, ...) -> (n', n, ...)
            if x is None:
                return None
            return (x if index is None else x.index_select(0, index))[:, :n]

        alpha, location = (self.per_word + [None])[:2] if self.per_word is not None else (None, None)
        words, alpha, location = _to_host(pick(self.words), pick(alpha), pick(location))
        words = words.tolist()  # the host's reads of the copies: one each, not one per row
        locations = location.long().tolist() if location is not None else None
        alpha = alpha.float() if alpha is not None else None
        rows = []
        for i, tokens in enumerate(words):
            m = n if lengths is None else lengths[i]
            rows.append((tokens[:m], None if alpha is None else alpha[i, :m],
                         None if locations is None else locations[i][:m]))
        return rows


# ---------------------------------------------------------------------------------------
# greedy: one path per image


def _state_device(state: State) -> torch.device:
    found = []
    map_state(state, lambda x: found.append(x.device) or x)
    return found[0] if found else torch.device("cpu")


def greedy_search(
    step_fn: StepFn,
    state: State,
    options: DecodeOptions,
    *,
    batch_size: int,
    start_id: int,
    end_id: int,
    forbid_ids: Sequence[int] = (),
    min_length: int = 0,
) -> list[list[Hypothesis]]:
    """Arg-max decoding; returns B lists holding one Hypothesis. Equals `beam_search` with a beam of one.

    ``options`` must ask for one hypothesis of a beam of one; their `max_length`, `block_trigrams` and
    `length_penalty` are read (the last only sets `norm_score`: greedy does not rank anything). A step's Logits
    give their best word directly (Logits.best); dense log-probs take topk, not argmax: the op beam search uses,
    so ties break identically.
    """
    if options.beam != 1 or options.n_best != 1:
        raise ValueError(f"greedy_search decodes one hypothesis with a beam of one, got beam={options.beam}, "
                         f"n_best={options.n_best} (search() picks the beam search for those)")
    max_length, length_penalty, block_trigrams = options.max_length, options.length_penalty, options.block_trigrams
    _check_args(batch_size, max_length, min_length)
    _check_state_rows(state, batch_size)
    B, bans = batch_size, _StepBans(forbid_ids, end_id, min_length)
    tokens = torch.full((B,), start_id, dtype=torch.long, device=_state_device(state))
    scores = lengths = finished = history = None
    for t in range(max_length):
        banned = bans.at(t)
        log_probs, per_word, state = _step(step_fn, tokens, state, B, banned)
        row_bans = _RowBans.repeats(history.words, ~finished, end_id) if block_trigrams and t else None
        if isinstance(log_probs, Logits):
            word_lp, word = (x.squeeze(1) for x in log_probs.best(1, banned, row_bans))  # (B,) each
        else:
            if row_bans is not None:
                log_probs = row_bans.fill(log_probs)
            word_lp, word = (x.squeeze(1) for x in log_probs.topk(1, dim=1))  # (B,) each
        if scores is None:  # created on the device the model answers on
            scores = torch.zeros(B, device=word_lp.device)
            lengths = torch.zeros(B, dtype=torch.long, device=word_lp.device)
            finished = torch.zeros(B, dtype=torch.bool, device=word_lp.device)
            history = _History(B, word_lp.device)
        # rows already finished keep their score and length; what they are fed from now on is ignored
        scores = torch.where(finished, scores, scores + word_lp)
        is_end = word == end_id
        lengths = lengths + (~finished & ~is_end).long()
        finished = finished | is_end
        history.append(word, per_word)
        tokens = word
        if bool(finished.all()):  # the step's one host read
            break
    scores_l, lengths_l, finished_l = torch.stack([scores.double(), lengths.double(), finished.double()]).tolist()
    lengths_l = [int(n) for n in lengths_l]
    rows = history.host_rows(None, history.words.size(1), lengths_l)
    return [[_hypothesis(rows[b], length_penalty=length_penalty, score=scores_l[b], finished=bool(finished_l[b]))]
            for b in range(B)]


# ---------------------------------------------------------------------------------------
# beam search: K beams per image, all B*K rows in one step call


def beam_search(
    step_fn: StepFn,
    state: State,
    options: DecodeOptions,
    *,
    batch_size: int,
    start_id: int,
    end_id: int,
    forbid_ids: Sequence[int] = (),
    min_length: int = 0,
    expand: Callable[[State, int], State] | None = None,
    static_rows: bool = False,
) -> list[list[Hypothesis]]:
    """Batched beam search with ``options.beam`` beams per image; returns B lists of up to `options.n_best`
    hypotheses, best `norm_score` first (ranked by `options.length_penalty`).

    Row b*K + k holds beam k of image b. Candidates are ranked by raw score inside the
    search (as in the classic SAT beam search); a beam that emits <end> is copied to its
    image's pool and stays frozen in its slot (its only continuation is itself at +0), so
    a beam of one is exactly greedy. Length normalisation ranks the final hypotheses.
    An image stops once its pool holds `n_best` hypotheses that no live beam can beat in
    `norm_score` (log-probs <= 0 bound every continuation), and its rows leave the batch (with `static_rows` they
    stay and run on, unread: a compiled step wants the same rows at every step, models/decoders/contract.py).
    With `options.beam_groups` G > 1 it is diverse beam search: the beams choose in G groups, each
    penalised for the words the groups before it chose at that step (decoding/diverse.py).
    Beams still running after `max_length` calls join the ranking as unfinished; the list
    is filled to `n_best` whenever that many hypotheses with a finite score exist, and is
    never empty.

    The first call runs on the B images' own rows (their K beams would all start alike); its K best
    words start the beams, and `expand(state, K)` then gives each image K rows of the state that call
    returned (default: every tensor repeat_interleaved). A tensor it leaves at B rows is per-image
    data the step function reads for all K beams (e.g. the decoder's attention memory, see
    CaptionDecoder.expand_state in models/decoders/contract.py).
    """
    max_length = options.max_length
    _check_args(batch_size, max_length, min_length)
    _check_state_rows(state, batch_size)
    beams = _Beams(state, batch_size, options.beam, start_id, end_id, options.length_penalty, options.n_best, expand,
                   max_length, options.block_trigrams, (options.beam_groups, options.diversity), static_rows)
    bans = _StepBans(forbid_ids, end_id, min_length)
    for t in range(max_length):
        log_probs, per_word, beams.state = _step(step_fn, beams.tokens, beams.state, beams.rows, ())
        beams.advance(log_probs, per_word, bans.at(t), t)
        if t + 1 < max_length and not beams.prune():
            break
    return beams.finish()


class _Beams:
    """The state of one batched beam search: K rows per image still searching (row i*K + k is beam k of
    local image i), their scores, finished flags and histories, the decoder state, and per original
    image the pool of finished hypotheses and, once decided, its result.

    advance() scores every (beam, word) candidate and keeps the K best per image, then copies to the host, once,
    what the step's bookkeeping reads (_report); prune() retires the images whose pool no live beam can still
    beat; finish() ranks what is left.
    """

    def __init__(self, state: State, batch_size: int, K: int, start_id: int, end_id: int, length_penalty: float,
                 n_best: int, expand: Callable[[State, int], State] | None, max_length: int,
                 block_trigrams: bool, diverse: tuple[int, float] = (1, 0.0), static_rows: bool = False) -> None:
        self.K, self.end_id, self.length_penalty, self.n_best = K, end_id, length_penalty, n_best
        self.static_rows = static_rows  # retired images keep their rows (prune)
        self.groups, self.diversity = diverse  # diverse beam search's groups and lambda (1: plain beam search)
        self.max_length, self.block_trigrams = max_length, block_trigrams
        self.active = list(range(batch_size))  # original image index of each image still in the batch
        B = batch_size
        # The first step runs on the B unexpanded rows (self.steps == 0): the K beams of an image all start
        # from <start> in the same state, so they would make K identical step calls. expand gives the rows after it.
        self.expand = expand
        self.state = state
        device = _state_device(state)
        self.tokens = torch.full((B,), start_id, dtype=torch.long, device=device)
        self.scores = torch.zeros(B * K, device=device)  # scores and finished: (B*K,), set by the first step
        self.finished = torch.zeros(B * K, dtype=torch.bool, device=device)
        # the host's copy of the last step's (_report): per row its score and finished flag, per image its bound
        self.host_scores: list[float] = []
        self.host_finished: list[bool] = []
        self.host_bound: list[float] = []
        self.history = _History(B * K, device)
        self.pools: list[list[Hypothesis]] = [[] for _ in range(batch_size)]  # finished, per original image
        self.results: list[list[Hypothesis] | None] = [None] * batch_size
        self.frozen_row: Tensor | None = None  # (V,): -inf except 0 at <end>
        self.steps = 0

    def _expand(self) -> None:
        """The state after the first step, made K rows per image (B*K rows, or B for per-image tensors)."""
        B, K = len(self.active), self.K
        if self.expand is None:
            state = map_state(self.state, lambda x: x.repeat_interleave(K, dim=0))  # (B*K, ...)
        else:
            state = self.expand(self.state, K)
            bad = [tuple(x.shape) for x in _leaves(state) if x.dim() == 0 or x.size(0) not in (B, B * K)]
            if bad:
                raise ValueError(f"expand must give state tensors B*K={B * K} (or B={B}) rows, got shapes {bad}")
        self.state = state

    @property
    def rows(self) -> int:
        return len(self.active) * (self.K if self.steps else 1)  # one row per image before the first step

    def advance(self, log_probs: Tensor, per_word: "PerWord | None", banned: BannedIds, t: int) -> None:
        """Step t: the K best (beam, word) continuations per image by raw score; finished beams stay frozen."""
        dense = log_probs.logits if isinstance(log_probs, Logits) else log_probs
        B, K, N, V = len(self.active), self.K, self.rows, dense.size(1)
        if self.frozen_row is None:
            self.frozen_row = torch.full((V,), -math.inf, device=dense.device)
            self.frozen_row[self.end_id] = 0.0
            self.history.words = self.history.words.to(dense.device)
        if isinstance(log_probs, Logits) and (K > V or self.groups > 1):  # rank them all
            log_probs = log_probs.dense()
        if not self.steps:
            return self._first(log_probs, per_word, banned)
        # finished beams are frozen below, whatever their words
        row_bans = _RowBans.repeats(self.history.words, ~self.finished, self.end_id) if self.block_trigrams else None
        if isinstance(log_probs, Logits):
            top_scores, parent, word = self._best_of_rows(log_probs, banned, row_bans)
        else:
            cand = self.scores[:, None] + log_probs  # (N, V): the only full-size pass besides top-k; ours to modify
            if banned:
                cand.index_fill_(1, banned.index(cand.device), -math.inf)
            if row_bans is not None:
                row_bans.fill(cand, in_place=True)
            if any(self.host_finished):  # a finished beam's only continuation is <end> at +0 (known from _report)
                cand = torch.where(self.finished[:, None], self.frozen_row + self.scores[:, None], cand)
            if self.groups > 1:  # the groups choose in turn, each penalised by the earlier ones' words
                top_scores, top_idx = diverse_top(cand.view(B, K, V), self.groups, self.diversity,
                                                  self.finished.view(B, K))
            else:
                top_scores, top_idx = cand.view(B, K * V).topk(K, dim=1)  # (B, K)
            parent = (torch.arange(B, device=cand.device)[:, None] * K + top_idx // V).view(N)  # (N,) row it extends
            word = (top_idx % V).view(N)  # (N,)
        self.scores = top_scores.view(N)
        was_finished = self.finished.index_select(0, parent)
        newly = (word == self.end_id) & ~was_finished & torch.isfinite(self.scores)
        self.finished = was_finished | newly
        # the per-word tensors that produced word t are the parent's at this step
        self.history.append(word, per_word, parent)
        # parents always lie in their child's image block: per-image tensors (B rows) are never reordered
        self.state = map_state(self.state, lambda x: x if x.size(0) != N else x.index_select(0, parent))
        self._after(word, newly, t)

    def _after(self, word: Tensor, newly: Tensor, t: int) -> None:
        self.tokens = word
        self.steps = t + 1
        self._report(newly, t)

    def _first(self, log_probs: "Tensor | Logits", per_word: "PerWord | None", banned: BannedIds) -> None:
        """Step 0 from one row per image: its K best words start the K beams (as K identical rows would, of
        which only one may extend: the others would repeat its words)."""
        B, K = len(self.active), self.K
        if self.groups > 1:
            scores, word = diverse_first(_ban(log_probs, banned), K, self.groups, self.diversity)
        elif isinstance(log_probs, Logits):
            scores, word = log_probs.best(K, banned)  # (B, K) each
        else:  # dense log-probs; with fewer words than beams, the missing ones at -inf
            log_probs, V = _ban(log_probs, banned), log_probs.size(1)
            if K > V:
                log_probs = torch.cat([log_probs, log_probs.new_full((B, K - V), -math.inf)], dim=1)
            scores, word = log_probs.topk(K, dim=1)  # (B, K)
            word = word % V  # a valid id for the -inf fillers
        self.scores, word = scores.reshape(B * K), word.reshape(B * K)
        newly = (word == self.end_id) & torch.isfinite(self.scores)
        self.finished = newly
        image = torch.arange(B, device=word.device).repeat_interleave(K)  # (B*K,): each beam's row at step 0
        self.history.append(word, per_word, image)
        self._expand()
        self._after(word, newly, 0)

    def _best_of_rows(self, step: Logits, banned: BannedIds, row_bans: "_RowBans | None"
                      ) -> tuple[Tensor, Tensor, Tensor]:
        """advance()'s K best continuations per image from Logits: each row's K best words (Logits.best), then
        the K best of the image's K x K. Returns (top scores (B, K), parent (N,), word (N,))."""
        B, K, N = len(self.active), self.K, self.rows
        log_probs, words = step.best(K, banned, row_bans)  # (N, K) each
        cand = log_probs.add_(self.scores[:, None])  # (N, K)
        if any(self.host_finished):  # a finished beam's only continuation is <end> at +0 (known from _report)
            frozen = torch.full_like(cand, -math.inf)
            frozen[:, 0] = self.scores
            cand = torch.where(self.finished[:, None], frozen, cand)
            words = torch.where(self.finished[:, None], torch.full_like(words, self.end_id), words)
        top_scores, top_idx = cand.view(B, K * K).topk(K, dim=1)  # (B, K)
        parent = (torch.arange(B, device=cand.device)[:, None] * K + top_idx // K).view(N)
        word = words.view(B, K * K).gather(1, top_idx).view(N)
        return top_scores, parent, word

    def _report(self, newly: Tensor, t: int) -> None:
        """The step's one host copy: every row's score and finished flag, whether it finished at this step, and
        every image's bound (prune); the rows that finished then join their images' pools."""
        N = self.rows
        host = torch.cat([self.scores.double(), self.finished.double(), newly.double(), self._bound(t)]).tolist()
        self.host_scores, self.host_bound = host[:N], host[3 * N:]
        self.host_finished = [f != 0.0 for f in host[N:2 * N]]
        rows = [r for r, f in enumerate(host[2 * N:3 * N]) if f != 0.0]
        if rows:
            # (n,): the rows that finished, ascending, found on the device (no index copied from the host)
            index = torch.argsort((~newly).to(torch.uint8), stable=True)[:len(rows)]
            self._pool_finished(rows, index, t)

    def _bound(self, t: int) -> Tensor:
        """(B,) float64: the best norm_score a live beam of each image can still reach after step t (-inf when
        none lives): continuations only lower the score (log-probs <= 0), so s / L**lp is maximal at an extreme
        length. float64 so that the comparison with the pools' (Python float) scores is not rounded."""
        B, K = len(self.active), self.K
        live = ~self.finished & torch.isfinite(self.scores)
        lo, hi = float(t + 1), float(self.max_length + 1)
        s64 = self.scores.double()
        bound = torch.maximum(s64 / lo ** self.length_penalty, s64 / hi ** self.length_penalty)
        return torch.where(live, bound, torch.full_like(bound, -math.inf)).view(B, K).amax(1)  # (B,)

    def _pool_finished(self, rows: list[int], index: Tensor, t: int) -> None:
        """Copy the beams that emitted <end> at step t (rows, and the same as a tensor on the device) to their
        images' pools (t words, <end> not stored), all in one copy to the host."""
        for row, host_row in zip(rows, self.history.host_rows(index, t)):
            self.pools[self.active[row // self.K]].append(
                _hypothesis(host_row, score=self.host_scores[row], finished=True, length_penalty=self.length_penalty))
        for b in {self.active[row // self.K] for row in rows}:
            self.pools[b].sort(key=lambda h: -h.norm_score)  # stable: ties keep discovery order

    def prune(self) -> bool:
        """Retire every image whose pool holds n_best hypotheses that no live beam can beat in norm_score
        (the last step's bounds, _report); False when no image is left. With static_rows a retired image's rows stay
        in the batch, its result decided (results[b] set: never retired twice)."""
        done = [self.results[b] is None and self.host_bound[i] <= (self.pools[b][self.n_best - 1].norm_score
                                                                   if len(self.pools[b]) >= self.n_best else -math.inf)
                for i, b in enumerate(self.active)]
        if not any(done):
            return True
        # an empty pool here means every beam has score -inf: return those rather than nothing
        empty = [i for i, b in enumerate(self.active) if done[i] and not self.pools[b]]
        unfinished = dict(zip(empty, self._unfinished(empty))) if empty else {}
        for i, b in enumerate(self.active):
            if done[i]:
                self.results[b] = _rank(self.pools[b], unfinished.get(i, []), self.n_best)
        keep = [i for i, b in enumerate(self.active) if self.results[b] is None]
        if keep and not self.static_rows:
            self._keep_images(keep)
        return bool(keep)

    def _keep_images(self, keep: list[int]) -> None:
        """Drop the retired images' rows so later steps only pay for images still searching."""
        N, K = self.rows, self.K
        device = self.scores.device
        keep_images = torch.tensor(keep).to(device, non_blocking=True)  # (B',): no wait for the device
        keep_rows = (keep_images[:, None] * K + torch.arange(K, device=device)).view(-1)  # (B'*K,)
        host_rows = [i * K + k for i in keep for k in range(K)]
        self.active = [self.active[i] for i in keep]
        self.scores, self.finished, self.tokens = (self.scores[keep_rows], self.finished[keep_rows],
                                                   self.tokens[keep_rows])
        self.host_scores = [self.host_scores[r] for r in host_rows]
        self.host_finished = [self.host_finished[r] for r in host_rows]
        self.history.keep(keep_rows)

        def select_kept(x: Tensor) -> Tensor:
            index = keep_rows if x.size(0) == N else keep_images  # rows, or per-image tensors
            return x.index_select(0, index.to(x.device))

        self.state = map_state(self.state, select_kept)

    def _unfinished(self, images: list[int]) -> list[list[Hypothesis]]:
        """Per local image of ``images``, the hypotheses of its not-finished slots after self.steps words (every
        row copied to the host at once)."""
        host_rows = self.history.host_rows(None, self.steps)
        K = self.K
        return [[_hypothesis(host_rows[r], score=self.host_scores[r], finished=False,
                             length_penalty=self.length_penalty)
                 for r in range(i * K, (i + 1) * K) if not self.host_finished[r]] for i in images]

    def finish(self) -> list[list[Hypothesis]]:
        """Images still searching after max_length calls: live beams compete as unfinished captions."""
        left = [i for i, b in enumerate(self.active) if self.results[b] is None]
        for i, unfinished in zip(left, self._unfinished(left) if left else []):
            b = self.active[i]
            self.results[b] = _rank(self.pools[b], unfinished, self.n_best)
        return self.results  # type: ignore[return-value]


def _rank(pool: list[Hypothesis], unfinished: list[Hypothesis], n_best: int) -> list[Hypothesis]:
    """Top n_best by norm_score; -inf scores only when nothing finite exists (never empty)."""
    everything = sorted(pool + unfinished, key=lambda h: -h.norm_score)  # stable: finished first on ties
    finite = [h for h in everything if math.isfinite(h.score)]
    return (finite or everything[:1])[:n_best]


def search(step_fn: StepFn, state: State, options: DecodeOptions, *, batch_size: int, start_id: int, end_id: int,
           forbid_ids: Sequence[int] = (), expand: Callable[[State, int], State] | None = None,
           min_length: int = 0, static_rows: bool = False) -> list[list[Hypothesis]]:
    """Decode B images with ``options`` (decoding/options.py): greedy when one hypothesis of a beam of one is
    asked for, else the beam search. ``forbid_ids`` are token ids never chosen (the caller's <pad> and <start>,
    and <unk> when ``options.forbid_unk``: the ids are the caller's to name, Captioner.generate). ``static_rows``:
    every step gets the same rows (greedy search always does; beam search then keeps retired images' rows)."""
    common = dict(batch_size=batch_size, start_id=start_id, end_id=end_id, forbid_ids=tuple(forbid_ids),
                  min_length=min_length)
    if options.beam == 1 and options.n_best == 1:
        return greedy_search(step_fn, state, options, **common)
    return beam_search(step_fn, state, options, expand=expand, static_rows=static_rows, **common)
