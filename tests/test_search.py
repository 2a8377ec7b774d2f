"""Search tests with mock step functions (token ids only, no model)."""

import dataclasses
import math

import pytest
import torch

from captioner.decoding.logits import _row_topk
from captioner.decoding.options import DecodeOptionError, DecodeOptions
from captioner.decoding.search import Hypothesis, Logits, _RowBans, beam_search, greedy_search, map_state

PAD, START, END = 0, 1, 2


def batch(B):
    """A search's own arguments for B images of these step functions' vocabulary (the rest are DecodeOptions)."""
    return dict(batch_size=B, start_id=START, end_id=END)


class RandomStep:
    """A fixed random language model whose next-word log-probs depend on the last token, a
    float state h and the whole token history carried in the state (so a wrong reorder of
    any state tensor changes the scores). It returns the history as "alpha" so tests can
    check which step produced each recorded alpha. Rows are independent (elementwise ops)."""

    def __init__(self, V=12, S=6, max_len=12, seed=0, end_bias=1.0):
        g = torch.Generator().manual_seed(seed)
        self.V, self.S, self.max_len, self.end_bias = V, S, max_len, end_bias
        self.table = torch.randn(V, V, generator=g, dtype=torch.float64) * 2
        self.emb = torch.randn(V, S, generator=g, dtype=torch.float64)
        self.w = torch.randn(S, generator=g, dtype=torch.float64)
        self.U = torch.randn(S, V, generator=g, dtype=torch.float64)
        self.memory = torch.randn(7, V, generator=g, dtype=torch.float64)
        self.h0 = torch.randn(64, S, generator=g, dtype=torch.float64)
        self.calls = 0

    def init_state(self, B):
        hist = torch.zeros(B, self.max_len + 1, dtype=torch.long)
        return (self.h0[:B].clone(), (hist, torch.zeros(B, dtype=torch.long)))  # nested on purpose

    def __call__(self, tokens, state):
        self.calls += 1
        h, (hist, pos) = state
        hist = hist.scatter(1, pos[:, None], tokens[:, None])  # (N, T+1) tokens fed so far
        h = torch.tanh(h * self.w + self.emb[tokens])  # (N, S)
        logits = self.table[tokens] + (h[:, :, None] * self.U).sum(1) + self.memory[hist.sum(1) % 7]  # (N, V)
        logits[:, END] += self.end_bias
        return torch.log_softmax(logits, -1), hist.double(), (h, (hist, pos + 1))

    def replay_score(self, image, tokens, finished):
        """Sum of log-probs of `tokens` (+ <end>) for image row `image`, fed one by one."""
        state = map_state(self.init_state(64), lambda x: x[image : image + 1])
        fed, total = START, 0.0
        for w in list(tokens) + ([END] if finished else []):
            lp, _, state = self(torch.tensor([fed]), state)
            total += float(lp[0, w])
            fed = w
        return total


def lattice_step(tokens, state):
    """Greedy takes A (0.55) then only reaches <end> with 0.35; B (0.45) then <end> (0.95) is better."""
    A, B = 3, 4
    probs = torch.full((tokens.size(0), 6), 1e-6)
    for i, tok in enumerate(tokens.tolist()):
        if tok == START:
            probs[i, A], probs[i, B] = 0.55, 0.45
        elif tok == A:
            probs[i, END], probs[i, A], probs[i, B] = 0.35, 0.33, 0.32
        elif tok == B:
            probs[i, END], probs[i, 5] = 0.95, 0.05
        else:
            probs[i, END] = 1.0
    probs = probs / probs.sum(1, keepdim=True)
    return probs.log(), None, state


def never_end_step(tokens, state):
    """Uniform-ish over words 3..V-1 with a token-dependent tilt; <end> is essentially impossible."""
    V = 8
    logits = torch.arange(V, dtype=torch.float32).repeat(tokens.size(0), 1) * 0.1
    logits = logits + (tokens[:, None] % 3) * torch.linspace(0, 1, V)
    logits[:, END] = -1e4
    logits[:, PAD] = logits[:, START] = -1e4
    return torch.log_softmax(logits, -1), None, state


def same(h1: Hypothesis, h2: Hypothesis, exact=True):
    assert h1.tokens == h2.tokens and h1.finished == h2.finished
    if exact:
        assert h1.score == h2.score
    else:
        assert h1.score == pytest.approx(h2.score, abs=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_beam_width_one_equals_greedy(seed):
    m = RandomStep(seed=seed)
    g = greedy_search(m, m.init_state(5), DecodeOptions(beam=1, max_length=10), **batch(5))
    b = beam_search(m, m.init_state(5), DecodeOptions(beam=1, max_length=10), **batch(5))
    for hg, hb in zip(g, b):
        same(hg[0], hb[0])
        assert hg[0].norm_score == hb[0].norm_score
        assert torch.equal(hg[0].alphas, hb[0].alphas)


def test_beam_finds_what_greedy_misses():
    state = (torch.zeros(1, 1),)
    calls = []

    def counted(tokens, state):
        calls.append(1)
        return lattice_step(tokens, state)

    g = greedy_search(lattice_step, state, DecodeOptions(beam=1, max_length=5), **batch(1))[0][0]
    b = beam_search(counted, state, DecodeOptions(beam=2, max_length=5), **batch(1))[0][0]
    assert len(calls) == 2  # both beams finished at step 2: the search stopped early
    assert g.tokens == [3] and b.tokens == [4] and b.finished
    assert b.score == pytest.approx(math.log(0.45 * 0.95), abs=1e-4)
    assert b.score > g.score and b.alphas is None


@pytest.mark.parametrize("K,n_best,lp", [(3, 3, 1.0), (4, 2, 0.0), (2, 2, 0.7)])
def test_batched_beam_equals_single_image_beams(K, n_best, lp):
    m = RandomStep(seed=1)
    B = 5
    batched = beam_search(m, m.init_state(B), DecodeOptions(beam=K, n_best=n_best, max_length=9, length_penalty=lp),
                          **batch(B))
    for b in range(B):
        single_state = map_state(m.init_state(B), lambda x, b=b: x[b : b + 1])
        single = beam_search(m, single_state, DecodeOptions(beam=K, n_best=n_best, max_length=9, length_penalty=lp),
                             **batch(1))[0]
        assert len(single) == len(batched[b]) == n_best
        for h1, h2 in zip(batched[b], single):
            same(h1, h2, exact=False)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_scores_match_replay_and_state_history(search):
    m = RandomStep(seed=2, end_bias=1.5)
    B = 4
    if search == "greedy":
        out = greedy_search(m, m.init_state(B), DecodeOptions(beam=1, max_length=8), **batch(B))
    else:
        out = beam_search(m, m.init_state(B), DecodeOptions(beam=4, n_best=4, max_length=8), **batch(B))
    n_finished = 0
    for b, hyps in enumerate(out):
        for h in hyps:
            assert h.score == pytest.approx(m.replay_score(b, h.tokens, h.finished), abs=1e-4)
            length = len(h.tokens) + h.finished
            assert h.norm_score == pytest.approx(h.score / length, rel=1e-6)
            # alpha i came from the step fed <start> w_0 .. w_{i-1}: the history the state carried then
            assert h.alphas.shape == (len(h.tokens), m.max_len + 1)
            for i in range(len(h.tokens)):
                assert h.alphas[i, : i + 1].long().tolist() == [START] + h.tokens[:i]
            assert END not in h.tokens
            n_finished += h.finished
    assert n_finished > 0  # the property was checked on finished captions too


def test_max_length_respected_and_n_best_sorted():
    m = RandomStep(seed=3, end_bias=-1.0)
    for max_length in (1, 3, 6):
        out = beam_search(m, m.init_state(6), DecodeOptions(beam=3, n_best=3, max_length=max_length), **batch(6))
        for hyps in out:
            assert len(hyps) == 3
            norms = [h.norm_score for h in hyps]
            assert norms == sorted(norms, reverse=True)
            for h in hyps:
                assert len(h.tokens) <= max_length
                assert len(h.tokens) < max_length if h.finished else len(h.tokens) == max_length


def test_never_ending_beams_return_best_unfinished():
    state = (torch.zeros(3, 2),)
    out = beam_search(never_end_step, state, DecodeOptions(beam=3, n_best=3, max_length=5), **batch(3))
    for hyps in out:
        assert len(hyps) == 3
        assert all(not h.finished and len(h.tokens) == 5 for h in hyps)
        assert hyps[0].score >= hyps[1].score >= hyps[2].score
        assert hyps[0].tokens != hyps[1].tokens
    g = greedy_search(never_end_step, state, DecodeOptions(beam=1, max_length=5), **batch(3))
    assert all(not h[0].finished and len(h[0].tokens) == 5 for h in g)


def test_n_best_above_the_beam_never_reaches_a_search():
    with pytest.raises(DecodeOptionError, match="n_best"):  # the options refuse it, once, for every search
        DecodeOptions(beam=2, n_best=4)
    with pytest.raises(ValueError, match="beam of one"):  # greedy is one hypothesis of one beam
        greedy_search(never_end_step, (torch.zeros(3, 2),), DecodeOptions(beam=2, max_length=5), **batch(3))


def test_min_length_masks_end_and_fixes_work():
    m = RandomStep(seed=5, end_bias=3.0)  # would end almost at once
    out = beam_search(m, m.init_state(4), DecodeOptions(beam=3, n_best=3, max_length=7), min_length=3, **batch(4))
    assert all(len(h.tokens) >= 3 for hyps in out for h in hyps)
    for search in ("greedy", "beam"):
        m.calls = 0
        if search == "greedy":
            out = greedy_search(m, m.init_state(4), DecodeOptions(beam=1, max_length=6), min_length=6, **batch(4))
        else:
            out = beam_search(m, m.init_state(4), DecodeOptions(beam=3, max_length=6), min_length=6, **batch(4))
        assert m.calls == 6
        assert all(len(h.tokens) == 6 and not h.finished for hyps in out for h in hyps)


def test_bad_arguments_raise():
    m = RandomStep()
    with pytest.raises(ValueError, match="batch_size"):
        beam_search(m, m.init_state(3), DecodeOptions(), **batch(4))
    with pytest.raises(ValueError, match="min_length"):
        greedy_search(m, m.init_state(2), DecodeOptions(beam=1, max_length=3), min_length=4, **batch(2))


def reference_beam(m, image, K, max_length, lp, n_best):
    """Plain-Python beam search with the documented semantics and no early stop, one image."""
    beams = [(0.0, [], False, map_state(m.init_state(64), lambda x: x[image : image + 1]))]
    pool = []
    for _t in range(max_length):
        cands = []
        for score, toks, fin, st in beams:
            if fin:  # a finished beam is frozen: its only continuation is itself
                cands.append((score, toks, True, st, False))
                continue
            lp_t, _, st2 = m(torch.tensor([toks[-1] if toks else START]), st)
            for w in range(m.V):
                cands.append((score + float(lp_t[0, w]), toks + [w], False, st2, w == END))
        cands.sort(key=lambda c: -c[0])
        beams = []
        for score, toks, fin, st, ends in cands[:K]:
            if ends:
                pool.append((score / (len(toks)) ** lp, score, toks[:-1], True))
            beams.append((score, toks[:-1] if ends else toks, fin or ends, st))
    everything = pool + [(s / len(toks) ** lp, s, toks, False) for s, toks, fin, _ in beams if not fin]
    everything.sort(key=lambda h: -h[0])
    return everything[:n_best]


@pytest.mark.parametrize("seed,K,lp,n_best", [(0, 3, 1.0, 2), (1, 2, 0.0, 1), (2, 4, 1.0, 4), (3, 3, 2.0, 3)])
def test_batched_early_stopping_beam_matches_plain_reference(seed, K, lp, n_best):
    m = RandomStep(seed=seed, end_bias=1.0)
    B, max_length = 4, 7
    out = beam_search(m, m.init_state(B),
                      DecodeOptions(beam=K, n_best=n_best, max_length=max_length, length_penalty=lp), **batch(B))
    for b in range(B):
        ref = reference_beam(m, b, K, max_length, lp, n_best)
        assert [h.tokens for h in out[b]] == [r[2] for r in ref]
        assert [h.finished for h in out[b]] == [r[3] for r in ref]
        assert [h.score for h in out[b]] == pytest.approx([r[1] for r in ref], abs=1e-4)


def chain_step(tokens, state):
    """<start> -> A 0.6 | B 0.4; A -> <end> 0.9 | C 0.1; B -> C -> D -> E -> <end>, each ~1."""
    A, B, C, D, E = 3, 4, 5, 6, 7
    nxt = {START: {A: 0.6, B: 0.4}, A: {END: 0.9, C: 0.1}, B: {C: 1.0}, C: {D: 1.0}, D: {E: 1.0}, E: {END: 1.0}}
    probs = torch.full((tokens.size(0), 9), 1e-9)
    for i, tok in enumerate(tokens.tolist()):
        for w, p in nxt.get(tok, {END: 1.0}).items():
            probs[i, w] = p
    return (probs / probs.sum(1, keepdim=True)).log(), None, state


def test_early_stop_waits_for_a_longer_caption_that_wins_after_normalisation():
    state = (torch.zeros(1, 1),)
    # raw log-prob prefers the early [A]; per-token (length_penalty=1) prefers [B, C, D, E]
    raw, per_token = (beam_search(chain_step, state, DecodeOptions(beam=2, max_length=7, length_penalty=lp),
                                  **batch(1))[0][0] for lp in (0.0, 1.0))
    assert raw.tokens == [3] and raw.finished
    assert per_token.tokens == [4, 5, 6, 7] and per_token.finished
    assert per_token.norm_score == pytest.approx(math.log(0.4) / 5, abs=1e-4)


def test_forbidden_ids_are_never_chosen():
    m = RandomStep(seed=8, end_bias=0.5)
    banned = (PAD, START, 3, 4)
    g = greedy_search(m, m.init_state(6), DecodeOptions(beam=1, max_length=8), forbid_ids=banned, **batch(6))
    b = beam_search(m, m.init_state(6), DecodeOptions(beam=1, max_length=8), forbid_ids=banned, **batch(6))
    k = beam_search(m, m.init_state(6), DecodeOptions(beam=4, n_best=4, max_length=8), forbid_ids=banned, **batch(6))
    for out in (g, b, k):
        assert not any(set(h.tokens) & set(banned) for hyps in out for h in hyps)
    for hg, hb in zip(g, b):
        same(hg[0], hb[0])


def test_per_word_locations_follow_their_beams():
    """A step function may return (alpha, location): each hypothesis gets the locations of the steps that
    produced its words, reordered with the beams exactly like alpha."""
    V, L = 7, 5
    g = torch.Generator().manual_seed(0)
    table = torch.log_softmax(torch.randn(V, V, generator=g), dim=1)  # next-word log-probs given the last word

    def step(tokens, state):
        alpha = torch.nn.functional.one_hot(tokens % L, L).float()  # (N, L): peaked at the input word's cell
        location = tokens % L  # the cell "read"
        return table[tokens], (alpha, location), state + 1

    for search, options in ((beam_search, DecodeOptions(beam=3, n_best=3, max_length=6)),
                            (greedy_search, DecodeOptions(beam=1, max_length=6))):
        for hyps in search(step, torch.zeros(2), options, batch_size=2, start_id=1, end_id=2, forbid_ids=(0,)):
            for h in hyps:
                inputs = [1] + h.tokens[:-1]  # the word fed at each step
                assert h.locations == [w % L for w in inputs]
                assert h.alphas.argmax(1).tolist() == h.locations


# ---------------------------------------------------------------------------------------
# step functions that hand over raw logits (search.Logits) decode exactly like dense log-probs


class LogitsStep:
    """RandomStep's model, answering with Logits (raw logits, shifted by a per-row constant so that only the
    search's own normalisation can make them log-probs)."""

    def __init__(self, model: RandomStep):
        self.model = model

    def __call__(self, tokens, state):
        log_probs, alpha, state = self.model(tokens, state)
        shift = torch.linspace(-3.0, 5.0, tokens.shape[0], dtype=log_probs.dtype)[:, None]
        return Logits(log_probs + shift), alpha, state


@pytest.mark.parametrize("seed,K,n_best,min_length,banned", [(0, 3, 2, 0, ()), (1, 4, 4, 3, (PAD, START, 5)),
                                                            (2, 1, 1, 0, (PAD, START)), (3, 5, 3, 2, (4,))])
def test_beam_search_from_logits_equals_dense_log_probs(seed, K, n_best, min_length, banned):
    m = RandomStep(seed=seed, end_bias=3.0)
    options = DecodeOptions(beam=K, n_best=n_best, max_length=8)
    common = dict(min_length=min_length, forbid_ids=banned, **batch(6))
    dense = beam_search(m, m.init_state(6), options, **common)
    fast = beam_search(LogitsStep(m), m.init_state(6), options, **common)
    assert any(h.finished for hyps in dense for h in hyps) and any(len(h.tokens) < 8 for hyps in dense for h in hyps)
    for a, b in zip(dense, fast):
        assert len(a) == len(b)
        for ha, hb in zip(a, b):
            same(ha, hb, exact=False)
            assert torch.equal(ha.alphas, hb.alphas)


@pytest.mark.parametrize("banned", [(), (PAD, START, 3)])
def test_greedy_from_logits_equals_dense_and_equals_beam_one(banned):
    m = RandomStep(seed=5, end_bias=0.5)
    dense = greedy_search(m, m.init_state(6), DecodeOptions(beam=1, max_length=9), forbid_ids=banned, **batch(6))
    fast = greedy_search(LogitsStep(m), m.init_state(6), DecodeOptions(beam=1, max_length=9), forbid_ids=banned,
                         **batch(6))
    beam = beam_search(LogitsStep(m), m.init_state(6), DecodeOptions(beam=1, max_length=9), forbid_ids=banned,
                       **batch(6))
    for a, b, c in zip(dense, fast, beam):
        same(a[0], b[0], exact=False)
        same(b[0], c[0], exact=False)  # rows leave the beam search as images finish: other shifts, other rounding


def test_logits_best_counts_banned_words_in_the_normaliser():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 3.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    expected = torch.log_softmax(logits, dim=1)
    values, words = Logits(logits.clone()).best(2, banned=[4])
    assert words.tolist() == [[0, 1], [0, 1]] or words[1].tolist() != words[0].tolist()  # row 2 ties: any two
    assert words[0].tolist() == [0, 1]
    torch.testing.assert_close(values[0], expected[0, [0, 1]])
    torch.testing.assert_close(values[1], expected[1, :2])
    assert 4 not in words[1].tolist()


@pytest.mark.parametrize("V,k", [(10_000, 5), (10_000, 1), (2_541, 8), (300, 3), (129, 1), (40, 5)])
def test_row_topk_equals_topk(V, k):
    x = torch.randn(37, V, generator=torch.Generator().manual_seed(V + k))
    x[3, -1] = 50.0  # the best value in the columns past the last whole chunk
    x[4, :] = -math.inf
    x[4, 7] = 1.0  # one finite value: the others tie at -inf
    expected = x.topk(k, dim=1)
    values, index = _row_topk(x, k)
    assert torch.equal(values, expected.values)
    assert torch.equal(x.gather(1, index), values)  # indices may differ only among equal values
    rows = [r for r in range(37) if r != 4]
    assert torch.equal(index[rows], expected.indices[rows])


def test_beam_search_from_logits_with_more_beams_than_words():
    m = RandomStep(V=4, seed=2, end_bias=1.0)
    dense = beam_search(m, m.init_state(3), DecodeOptions(beam=6, n_best=3, max_length=5), **batch(3))
    fast = beam_search(LogitsStep(m), m.init_state(3), DecodeOptions(beam=6, n_best=3, max_length=5), **batch(3))
    for b, (a, f) in enumerate(zip(dense, fast)):
        assert [h.tokens for h in a] == [h.tokens for h in f]
        assert [h.score for h in a] == pytest.approx([h.score for h in f], abs=1e-5)
        ref = reference_beam(m, b, 6, 5, 1.0, 3)  # both as the plain reference, which runs all K beams from step 0
        assert [h.tokens for h in a] == [r[2] for r in ref]
        assert [h.score for h in a] == pytest.approx([r[1] for r in ref], abs=1e-4)


def test_first_step_runs_on_one_row_per_image_then_expand_sees_its_state():
    m = RandomStep(seed=4)
    B, K = 3, 4
    rows, expanded = [], []

    def step(tokens, state):
        rows.append(tokens.size(0))
        return m(tokens, state)

    def expand(state, beams):
        h, (hist, pos) = state
        expanded.append(pos.tolist())  # the state after step 0: one word fed per image
        return map_state(state, lambda x: x.repeat_interleave(beams, dim=0))

    beam_search(step, m.init_state(B), DecodeOptions(beam=K, max_length=5), min_length=5, expand=expand, **batch(B))
    assert rows == [B] + [B * K] * 4
    assert expanded == [[1] * B]
    out = beam_search(m, m.init_state(B), DecodeOptions(beam=K, n_best=2, max_length=6), expand=expand, **batch(B))
    for b in range(B):  # the plain reference runs all K beams from step 0
        ref = reference_beam(m, b, K, 6, 1.0, 2)
        assert [h.tokens for h in out[b]] == [r[2] for r in ref]
        assert [h.score for h in out[b]] == pytest.approx([r[1] for r in ref], abs=1e-4)


# ---------------------------------------------------------------------------------------
# block_trigrams: no word that would complete a trigram its hypothesis already holds


A, B_, C, D, E = 3, 4, 5, 6, 7  # words of the cycle model below


def cycle_step(V=8):
    """A model that loops "a b c a b c ...": each word's favourite next word is the cycle's, then d, then e;
    <end> is possible but unlikely; the words past e (V > 8) are unlikely too."""
    cycle = {START: A, A: B_, B_: C, C: A, D: A, E: A}
    table = torch.full((V, V), -6.0)
    table[:, END] = -3.0
    table[:, D], table[:, E] = 1.0, 0.0
    for prev, nxt in cycle.items():
        table[prev, nxt] = 3.0
    # No two hypotheses may tie: d and e lead back to a less surely than c does (else "a b c a b d" and
    # "a b d a b c" score the same), and which of two tied ones a search keeps follows float rounding, which
    # differs between CPU kernel sets (ATEN_CPU_CAPABILITY)
    table[D, A], table[E, A] = 2.0, 1.5
    table += 0.05 * torch.rand(V, V, generator=torch.Generator().manual_seed(0))  # nor may partial sums tie
    table[:, PAD] = table[:, START] = -1e4
    log_probs = torch.log_softmax(table, dim=1)  # (V, V): next-word log-probs given the last word

    def step(tokens, state):
        return log_probs[tokens], None, state

    return step, log_probs


def as_logits(step):
    def logits_step(tokens, state):
        log_probs, per_word, state = step(tokens, state)
        return Logits(log_probs + 2.5), per_word, state  # shifted: only the search's normalisation undoes it

    return logits_step


def trigrams(tokens):
    return [tuple(tokens[i : i + 3]) for i in range(len(tokens) - 2)]


def replay(log_probs, h):
    """The model's log-probability of h's words (and <end> when finished), fed one by one."""
    fed = [START] + h.tokens
    said = h.tokens + ([END] if h.finished else [])
    return sum(float(log_probs[f, w]) for f, w in zip(fed, said))


def test_repeats_bans_the_words_that_would_complete_an_earlier_trigram():
    words = torch.tensor([[A, B_, C, A, B_, D, A, B_],  # (a b) seen before c and d: both banned
                          [A, B_, C, A, B_, D, A, B_],  # the same, but no longer writing
                          [A, A, A, C, A, A, A, A],  # (a a) before a and c
                          [A, B_, END, A, B_, C, A, B_],  # (a b) before <end> too: <end> stays allowed
                          [C, D, E, A, B_, C, E, D]])  # no earlier (e d): nothing
    live = torch.tensor([True, False, True, True, True])
    bans = _RowBans.repeats(words, live, END)
    assert sorted(zip(bans.rows.tolist(), bans.ids.tolist())) == [(0, C), (0, D), (2, A), (2, C), (3, C)]
    assert bans.most == 2
    candidates = torch.tensor([[C, E, D], [C, D, A], [A, B_, C], [END, C, A], [C, D, E]])
    assert bans.hits(candidates).tolist() == [[True, False, True], [False] * 3, [True, False, True],
                                              [False, True, False], [False] * 3]
    assert _RowBans.repeats(words[:, :2], live, END) is None
    assert _RowBans.repeats(words, torch.zeros(5, dtype=torch.bool), END) is None


@pytest.mark.recorded  # which of two near-equal hypotheses wins is float rounding's: none may tie
@pytest.mark.parametrize("logits", [False, True])
@pytest.mark.parametrize("V", [8, 300])  # 300 words: the fused read (kernels) serves Logits.best when built
def test_block_trigrams_stops_a_looping_caption_in_greedy_and_beam(logits, V):
    step, log_probs = cycle_step(V)
    step = as_logits(step) if logits else step
    state = torch.zeros(2, 1)
    for search, options in ((greedy_search, DecodeOptions(beam=1, max_length=12)),
                            (beam_search, DecodeOptions(beam=3, n_best=3, max_length=12))):
        loose = search(step, state, options, **batch(2))
        blocked = search(step, state, dataclasses.replace(options, block_trigrams=True), **batch(2))
        assert loose[0][0].tokens[:6] == [A, B_, C, A, B_, C]  # without the ban the best caption loops
        for hyps in blocked:
            for h in hyps:
                assert len(set(trigrams(h.tokens))) == len(trigrams(h.tokens)), h.tokens
                assert h.score == pytest.approx(replay(log_probs, h), abs=1e-4)  # banned words still normalise
        assert blocked[0][0].tokens[:6] == [A, B_, C, A, B_, D]  # c banned after "a b c a b": the next best, d
        assert blocked[0][0].tokens == blocked[1][0].tokens  # rows are independent


@pytest.mark.parametrize("seed", range(3))
def test_block_trigrams_off_is_the_default_and_changes_only_looping_captions(seed):
    m = RandomStep(V=6, seed=seed, end_bias=-2.0)  # few words, long captions: some rows repeat a trigram
    common = dict(forbid_ids=(PAD, START), **batch(8))
    for search, options in ((greedy_search, DecodeOptions(beam=1, max_length=10)),
                            (beam_search, DecodeOptions(beam=3, n_best=2, max_length=10))):
        assert options.block_trigrams is False
        plain = search(m, m.init_state(8), options, **common)
        off = search(m, m.init_state(8), dataclasses.replace(options, block_trigrams=False), **common)
        for a, b in zip(plain, off):
            for ha, hb in zip(a, b):
                same(ha, hb)
    plain = greedy_search(m, m.init_state(8), DecodeOptions(beam=1, max_length=10), **common)
    blocked = greedy_search(m, m.init_state(8), DecodeOptions(beam=1, max_length=10, block_trigrams=True), **common)
    repeating = [len(set(trigrams(h[0].tokens))) < len(trigrams(h[0].tokens)) for h in plain]
    assert any(repeating)
    for rep, a, b in zip(repeating, plain, blocked):
        assert (a[0].tokens != b[0].tokens) == rep  # a caption with no repeat is decoded exactly as before
        assert len(set(trigrams(b[0].tokens))) == len(trigrams(b[0].tokens))
        if not rep:
            same(a[0], b[0])


@pytest.mark.parametrize("logits", [False, True])
def test_block_trigrams_never_bans_the_way_out(logits):
    """One word besides <end>: "a a a" bans a, and the search must end there rather than choose a banned word."""
    table = torch.tensor([-1e4, -1e4, 0.0, 5.0])  # <pad>, <start>, <end>, a

    def step(tokens, state):
        return torch.log_softmax(table.repeat(tokens.size(0), 1), dim=1), None, state

    step = as_logits(step) if logits else step
    state = torch.zeros(2, 1)
    for search, options in ((greedy_search, DecodeOptions(beam=1, max_length=8)),
                            (beam_search, DecodeOptions(beam=3, max_length=8))):
        loose = search(step, state, options, forbid_ids=(PAD, START), **batch(2))
        assert loose[0][0].tokens == [A] * 8 and not loose[0][0].finished
        blocked = dataclasses.replace(options, block_trigrams=True)
        for hyps in search(step, state, blocked, forbid_ids=(PAD, START), **batch(2)):
            h = hyps[0]
            assert h.tokens == [A] * 3 and h.finished and math.isfinite(h.score)
