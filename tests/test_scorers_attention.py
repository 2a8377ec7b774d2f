"""Scorers (scorers.py) and attention modules (attention.py): shapes, normalisation, gradients,
argmax, sampling frequencies, key-value == soft with identity projections, self-attention."""
import pytest
import torch
from scipy.stats import chisquare

from captioner.models.attention import (
    MODES,
    ONE_CELL_MODES,
    KeyValueAttention,
    SelfAttentionEncoder,
    SoftAttention,
    build_attention,
    read_context,
)
from captioner.models.scorers import build_scorer
from captioner.names import ATTENTIONS, SCORERS

B, L, D, Q, A = 5, 7, 12, 10, 16
KINDS = sorted(ATTENTIONS)
SCORER_NAMES = sorted(SCORERS)


def make(kind: str, scorer: str, key_dim: int = D, query_dim: int = Q) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_attention(kind, scorer, key_dim, query_dim, attention_dim=A,
                           heads=4 if kind == "multi_head" else 1)


def inputs(batch: int = B):
    g = torch.Generator().manual_seed(1)
    return torch.randn(batch, L, D, generator=g), torch.randn(batch, Q, generator=g)


@pytest.mark.parametrize("name", SCORER_NAMES)
@pytest.mark.parametrize("query_dim", [Q, D])
def test_scorer_shapes_and_prepare_once(name, query_dim):
    scorer = build_scorer(name, D, query_dim, A)
    keys, query = torch.randn(B, L, D), torch.randn(B, query_dim)
    prepared = scorer.prepare(keys)
    assert isinstance(prepared, torch.Tensor) and prepared.shape[:2] == (B, L)
    scores = scorer(query, prepared)
    assert scores.shape == (B, L)
    # Scores of one row do not depend on the other rows of the batch.
    assert torch.allclose(scorer(query[:2], prepared[:2]), scores[:2], atol=1e-6)


def test_scorer_formulas():
    keys, query = torch.randn(B, L, D), torch.randn(B, D)
    dot = build_scorer("dot", D, D)
    assert torch.allclose(dot(query, dot.prepare(keys)), torch.einsum("bld,bd->bl", keys, query), atol=1e-5)
    scaled = build_scorer("scaled_dot", D, D)
    assert torch.allclose(scaled(query, scaled.prepare(keys)), torch.einsum("bld,bd->bl", keys, query) / D ** 0.5,
                          atol=1e-5)
    bil = build_scorer("bilinear", D, Q)
    q = torch.randn(B, Q)
    assert torch.allclose(bil(q, bil.prepare(keys)), torch.einsum("bld,dq,bq->bl", keys, bil.weight, q), atol=1e-5)
    add = build_scorer("additive", D, Q, A)
    expected = add.v(torch.tanh(add.key_proj(keys) + add.query_proj(q)[:, None])).squeeze(-1)
    assert torch.allclose(add(q, add.prepare(keys)), expected, atol=1e-6)


def test_unknown_names_list_valid_ones():
    with pytest.raises(ValueError, match="additive"):
        build_scorer("cosine", D, Q, A)
    with pytest.raises(ValueError, match="key_value"):
        build_attention("local", "dot", D, Q, A)
    with pytest.raises(ValueError, match="divisible"):
        build_attention("multi_head", "dot", D, Q, A, heads=3)
    attn = make("soft", "dot")
    grid, query = inputs()
    with pytest.raises(ValueError, match="expectation"):
        attn(query, attn.prepare(grid), "nearest")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("scorer", SCORER_NAMES)
@pytest.mark.parametrize("mode", MODES)
def test_shapes_and_alpha_sums_to_one(kind, scorer, mode):
    attn = make(kind, scorer)
    grid, query = inputs()
    memory = attn.prepare(grid)
    assert isinstance(memory, tuple) and all(m.shape[0] == B for m in memory)
    out = attn(query, memory, mode)
    assert out.context.shape == (B, attn.out_dim)
    assert out.alpha.shape == (B, L)
    assert torch.allclose(out.alpha.sum(-1), torch.ones(B), atol=1e-5)
    assert (out.alpha >= 0).all()
    assert out.entropy.shape == (B,) and (out.entropy >= 0).all()
    if mode in ONE_CELL_MODES:  # sample, argmax, gumbel
        assert out.log_prob.shape == (B,) and (out.log_prob <= 0).all()
        assert out.index.shape == ((B, 4) if kind == "multi_head" else (B,))
    else:
        assert out.log_prob is None and out.index is None
    # Reordering the memory (what beam search does) reorders the result.
    perm = torch.tensor([4, 2, 0, 1, 3])
    moved = attn(query[perm], tuple(m.index_select(0, perm) for m in memory), "expectation")
    assert torch.allclose(moved.context, attn(query, memory, "expectation").context[perm], atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("scorer", SCORER_NAMES)
@pytest.mark.parametrize("mode", ["expectation", "sample"])
def test_gradients_reach_every_parameter(kind, scorer, mode):
    attn = make(kind, scorer)
    grid, query = inputs()
    out = attn(query, attn.prepare(grid), mode)
    weights = torch.randn_like(out.context)
    loss = (out.context * weights).sum()
    if mode == "sample":
        # REINFORCE-style surrogate: the scorer learns only through log p(s).
        loss = loss + (out.log_prob * torch.randn(B)).sum()
    loss.backward()
    params = dict(attn.named_parameters())
    assert params or kind in ("soft", "hard")
    for name, p in params.items():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("scorer", SCORER_NAMES)
def test_hard_sample_scorer_learns_through_log_prob_only(kind, scorer):
    attn = make(kind, scorer)
    grid, query = inputs()
    out = attn(query, attn.prepare(grid), "sample")
    out.log_prob.sum().backward()
    scorer_params = [p for n, p in attn.named_parameters() if not n.startswith(("value_proj", "out_proj"))]
    assert scorer_params
    for p in scorer_params:
        assert p.grad is not None and p.grad.abs().sum() > 0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("scorer", SCORER_NAMES)
def test_argmax_picks_the_highest_score(kind, scorer):
    attn = make(kind, scorer)
    grid, query = inputs()
    memory = attn.prepare(grid)
    out = attn(query, memory, "argmax")
    if kind == "multi_head":
        assert torch.equal(out.index, out.head_alpha.argmax(-1))
    else:
        scores = attn.scorer(query, memory[1])
        assert torch.equal(out.index, scores.argmax(-1))
        # The context is the value at the chosen location.
        assert torch.allclose(out.context, memory[0][torch.arange(B), out.index])
        assert torch.allclose(out.log_prob, out.alpha.log()[torch.arange(B), out.index], atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("scorer", SCORER_NAMES)
def test_sampling_frequencies_match_alpha(kind, scorer):
    attn = make(kind, scorer)
    grid, query = inputs(batch=1)
    n = 4000
    memory = tuple(m.expand(n, *m.shape[1:]) for m in attn.prepare(grid))
    with torch.no_grad():
        out = attn(query.expand(n, Q), memory, "sample", generator=torch.Generator().manual_seed(0))
    index = out.index if kind == "multi_head" else out.index.unsqueeze(1)  # (n, M)
    alpha = out.head_alpha[0] if kind == "multi_head" else out.alpha[:1]  # (M, L)
    for m in range(index.shape[1]):
        counts = torch.bincount(index[:, m], minlength=L).double()
        expected = alpha[m].double() * n
        expected = expected * counts.sum() / expected.sum()
        assert chisquare(counts.numpy(), expected.numpy()).pvalue > 1e-3


@pytest.mark.parametrize("scorer", SCORER_NAMES)
def test_key_value_with_identity_projections_equals_soft(scorer):
    torch.manual_seed(0)
    soft = SoftAttention(scorer, D, Q, attention_dim=D)
    kv = KeyValueAttention(scorer, D, Q, attention_dim=D)
    with torch.no_grad():
        for proj in (kv.key_proj, kv.value_proj):
            proj.weight.copy_(torch.eye(D))
            proj.bias.zero_()
    kv.scorer.load_state_dict(soft.scorer.state_dict())
    grid, query = inputs()
    a, b = soft(query, soft.prepare(grid), "expectation"), kv(query, kv.prepare(grid), "expectation")
    assert torch.allclose(a.alpha, b.alpha, atol=1e-6)
    assert torch.allclose(a.context, b.context, atol=1e-5)


def test_expectation_mask_reads_soft_context_with_zero_log_prob():
    attn = make("hard", "additive")
    grid, query = inputs()
    memory = attn.prepare(grid)
    keep = torch.tensor([True, False, True, False, False])
    out = attn(query, memory, "sample", expectation_mask=keep)
    soft = attn(query, memory, "expectation")
    assert torch.allclose(out.context[keep], soft.context[keep], atol=1e-6)
    assert (out.log_prob[keep] == 0).all() and (out.log_prob[~keep] < 0).all()
    assert (out.index[keep] == -1).all()


def test_read_context_soft_is_expectation():
    scores = torch.randn(3, L)
    values = torch.randn(3, L, 4)
    out = read_context(scores, values, "expectation")
    alpha = scores.softmax(-1)
    assert torch.allclose(out.context, (alpha.unsqueeze(-1) * values).sum(1), atol=1e-6)
    assert torch.allclose(out.entropy, -(alpha * alpha.log()).sum(-1), atol=1e-6)
    fast = read_context(scores, values, "expectation", entropy=False)  # the soft decoder's path
    assert fast.entropy is None and torch.allclose(fast.context, out.context, atol=1e-6)


def test_self_attention_encoder_identity_shape_and_residual():
    grid = torch.randn(B, L, D)
    assert torch.equal(SelfAttentionEncoder(D, layers=0)(grid), grid)
    enc = SelfAttentionEncoder(D, layers=2, heads=3)
    out = enc(grid)
    assert out.shape == (B, L, D)
    out.sum().backward()
    assert all(p.grad is not None for p in enc.parameters())
    # With the attention branch switched off, a layer is LayerNorm(x + 0): the residual path.
    one = SelfAttentionEncoder(D, layers=1, heads=2)
    with torch.no_grad():
        one.layers[0].out.weight.zero_()
        one.layers[0].out.bias.zero_()
    assert torch.allclose(one(grid), torch.nn.functional.layer_norm(grid, (D,)), atol=1e-5)
    # The layer mixes locations: changing one location changes the others' outputs.
    moved = grid.clone()
    moved[:, 0] += 1.0
    assert not torch.allclose(enc(moved)[:, 1:], enc(grid)[:, 1:])
