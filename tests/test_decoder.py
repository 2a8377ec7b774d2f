"""The Show-Attend-Tell decoder (models/decoders/): learning, step() == teacher forcing (the fast step against the
fast and the reference teacher forcing), padding, hard attention."""
import pytest
import torch
import torch.nn.functional as F

from captioner import fast as fast_paths
from captioner.models.decoders.contract import DecoderOutput
from captioner.models.decoders.show_attend_tell import ShowAttendTellDecoder
from captioner.models.decoders.show_attend_tell_fast import FastShowAttendTellDecoder
from captioner.names import ATTENTIONS

V, D, L = 23, 12, 6
KINDS = sorted(ATTENTIONS)


def make(kind: str = "soft", scorer: str = "additive", gate: str = "scalar", dropout: float = 0.0,
         cls: type = FastShowAttendTellDecoder):
    torch.manual_seed(0)
    return cls(V, D, embed_dim=16, hidden_dim=20, attention_dim=16, scorer=scorer,
                                 attention=kind, heads=4 if kind == "multi_head" else 1, gate=gate,
                                 dropout=dropout)


def batch(b: int = 4, t: int = 8, seed: int = 0):
    """Random grids and captions <start> w.. <end> <pad>.. of varied lengths (longest = t)."""
    g = torch.Generator().manual_seed(seed)
    grid = torch.randn(b, L, D, generator=g)
    lengths = torch.randint(3, t + 1, (b,), generator=g)
    lengths[0] = t
    captions = torch.randint(4, V, (b, t), generator=g)
    captions[:, 0] = 1
    for i, n in enumerate(lengths.tolist()):
        captions[i, n - 1] = 2
        captions[i, n:] = 0
    return grid, captions, lengths


def test_output_shapes_and_mask():
    dec = make()
    grid, captions, lengths = batch()
    out = dec(grid, captions, lengths)
    assert isinstance(out, DecoderOutput)
    assert out.logits.shape == (4, 7, V) and out.alphas.shape == (4, 7, L)
    assert out.log_probs is None and out.entropies is None
    assert torch.equal(out.mask, torch.arange(7)[None] < (lengths - 1)[:, None])
    assert torch.allclose(out.alphas.sum(-1), out.mask.float(), atol=1e-5)  # 1 at real steps, 0 at padding


@pytest.fixture
def one_thread():
    """Tiny tensors: one thread avoids oversubscribing the shared CPUs (and is faster)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("kind", KINDS)
def test_teacher_forced_loss_falls(kind, one_thread):
    torch.manual_seed(0)
    dec = make(kind)
    # Synthetic task: caption = the ids of the two locations with the largest first feature.
    grid = torch.randn(32, L, D)
    top = grid[:, :, 0].topk(2, dim=1).indices + 4  # (B, 2)
    captions = torch.cat([torch.ones(32, 1, dtype=torch.long), top, torch.full((32, 1), 2)], dim=1)
    lengths = torch.full((32,), 4)
    opt = torch.optim.Adam(dec.parameters(), lr=1e-2)
    mode = "sample" if kind == "hard" else "expectation"
    losses = []
    for _ in range(50):
        out = dec(grid, captions, lengths, attention_mode=mode)
        loss = F.cross_entropy(out.logits.flatten(0, 1), captions[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0], losses[::10]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("scorer", ["additive", "bilinear", "scaled_dot"])
@pytest.mark.parametrize("gate", ["scalar", "vector", "none"])
def test_step_reproduces_teacher_forced_logits(kind, scorer, gate):
    dec = make(kind, scorer, gate, dropout=0.5).eval()
    grid, captions, lengths = batch()
    mode = "expectation"
    with torch.no_grad():
        out = dec(grid, captions, lengths, attention_mode=mode)
        state = dec.init_state(grid)
        assert all(s.shape[0] == 4 for s in state)
        for t in range(captions.shape[1] - 1):
            log_probs, alpha, _, state = dec.step_with_location(captions[:, t], state, attention_mode=mode)
            real = out.mask[:, t]
            expected = F.log_softmax(out.logits[:, t], dim=-1)
            assert torch.allclose(log_probs[real], expected[real], atol=1e-5), t
            assert torch.allclose(alpha[real], out.alphas[real, t], atol=1e-5), t


@pytest.mark.parametrize("kind", KINDS)
def test_fast_step_reproduces_the_reference_teacher_forcing(kind):
    """The fast decoding step (cached word-gate table, stacked column-major weights, fused cell, raw logits with
    the output bias apart) against the reference module's teacher forcing, every fast path off there."""
    dec = make(kind, dropout=0.5).eval()
    ref = make(kind, dropout=0.5, cls=ShowAttendTellDecoder).eval()
    ref.load_state_dict(dec.state_dict())
    grid, captions, lengths = batch()
    mode = "argmax" if kind == "hard" else "expectation"
    with torch.no_grad():
        with fast_paths.reference():
            out = ref(grid, captions, lengths, attention_mode=mode)
        state = dec.init_state(grid)
        for t in range(captions.shape[1] - 1):
            logits, alpha, location, state = dec.step_with_location(captions[:, t], state, mode, dense=False)
            real = out.mask[:, t]
            expected = F.log_softmax(out.logits[:, t], dim=-1)
            torch.testing.assert_close(logits.dense()[real], expected[real], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(alpha[real], out.alphas[real, t], atol=1e-5, rtol=1e-5)
            assert (location is None) == (kind != "hard")


@pytest.mark.parametrize("kind", KINDS)
def test_padding_does_not_change_real_steps(kind):
    dec = make(kind).eval()
    grid, captions, lengths = batch()
    padded = F.pad(captions, (0, 3), value=0)  # (B, T + 3)
    mode = "expectation"
    with torch.no_grad():
        a = dec(grid, captions, lengths, attention_mode=mode)
        b = dec(grid, padded, lengths, attention_mode=mode)
    assert b.logits.shape[1] == a.logits.shape[1] + 3
    real = a.mask
    assert torch.allclose(a.logits[real], b.logits[:, :-3][real], atol=1e-5)
    assert torch.allclose(a.alphas, b.alphas[:, :-3], atol=1e-6)
    assert (b.alphas[:, -3:] == 0).all() and not b.mask[:, -3:].any()
    # And a caption decoded alone equals itself inside the batch.
    with torch.no_grad():
        alone = dec(grid[2:3], captions[2:3, : int(lengths[2])], lengths[2:3], attention_mode=mode)
    n = int(lengths[2]) - 1
    assert torch.allclose(alone.logits[0], a.logits[2, :n], atol=1e-5)


def test_hard_sample_log_probs_and_entropies_masked():
    dec = make("hard")
    grid, captions, lengths = batch()
    out = dec(grid, captions, lengths, attention_mode="sample")
    assert out.log_probs.shape == out.entropies.shape == (4, 7)
    assert (out.log_probs[~out.mask] == 0).all() and (out.entropies[~out.mask] == 0).all()
    assert (out.log_probs[out.mask] < 0).all() and (out.entropies[out.mask] > 0).all()
    assert (out.alphas[~out.mask] == 0).all()
    # REINFORCE reaches the scorer through log p(s_t).
    out.log_probs.sum().backward()
    for p in dec.attention.parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_hard_expectation_mask_hook():
    dec = make("hard").eval()
    grid, captions, lengths = batch()
    use_soft = torch.tensor([True, False, True, False])
    with torch.no_grad():
        out = dec(grid, captions, lengths, attention_mode="sample", expectation_mask=use_soft)
        soft = dec(grid, captions, lengths, attention_mode="expectation")
    assert (out.log_probs[use_soft] == 0).all()
    assert (out.log_probs[~use_soft][out.mask[~use_soft]] < 0).all()
    assert torch.allclose(out.logits[use_soft], soft.logits[use_soft], atol=1e-5)


def test_hard_argmax_is_deterministic_and_soft_reads_one_cell_on_request():
    hard = make("hard").eval()
    grid, captions, lengths = batch()
    with torch.no_grad():
        a = hard(grid, captions, lengths, attention_mode="argmax")
        b = hard(grid, captions, lengths, attention_mode="argmax")
        assert torch.equal(a.logits, b.logits)
        assert a.log_probs is not None
        soft = make("soft").eval()  # the same weights as hard (same seed, same parameters)
        assert torch.equal(soft(grid, captions, lengths, "expectation").logits,
                           soft(grid, captions, lengths, "expectation").logits)
        # asked for argmax, a soft model reads the arg-max cell as the hard one does, not its soft read
        one_cell = soft(grid, captions, lengths, "argmax")
        assert torch.equal(one_cell.logits, a.logits)
        assert not torch.allclose(one_cell.logits, soft(grid, captions, lengths, "expectation").logits)


def test_bad_arguments_name_valid_choices():
    with pytest.raises(ValueError, match="scalar"):
        make(gate="channel")
    dec = make()
    grid, captions, lengths = batch()
    with pytest.raises(ValueError, match="expectation"):
        dec(grid, captions, lengths, attention_mode="nope")


def test_lengths_outside_the_caption_are_rejected():
    dec = make()
    grid, captions, lengths = batch()
    with pytest.raises(ValueError, match="lengths"):
        dec(grid, captions, lengths + captions.shape[1])


@pytest.mark.parametrize("kind", KINDS)
def test_keys_projected_once_and_output_layer_applied_once(kind):
    dec = make(kind)
    calls = {"prepare": 0, "out": 0}
    prepare = dec.attention.prepare

    def counting_prepare(grid):
        calls["prepare"] += 1
        return prepare(grid)

    dec.attention.prepare = counting_prepare
    dec.out.register_forward_hook(lambda *_: calls.__setitem__("out", calls["out"] + 1))
    grid, captions, lengths = batch(t=10)
    out = dec(grid, captions, lengths)
    assert calls == {"prepare": 1, "out": 0}  # L_o runs in the loss, fused with the cross-entropy
    assert out.packed_logits is out.packed_logits  # applied once, for all real steps, when asked for
    torch.testing.assert_close(out.packed_logits, dec.out(out.packed_features))
    assert out.logits.view(-1, out.logits.shape[-1])[out.rows].equal(out.packed_logits)


def test_state_can_be_reordered_and_expanded_for_beam_search():
    dec = make("multi_head").eval()
    grid, captions, _ = batch()
    with torch.no_grad():
        state = dec.init_state(grid)
        base = dec.step_with_location(captions[:, 0], state)[0]
        wide = tuple(s.repeat_interleave(3, dim=0) for s in state)  # (B*K, ...)
        log_probs, alpha, _, new_state = dec.step_with_location(captions[:, 0].repeat_interleave(3), wide)
    assert log_probs.shape == (12, V) and alpha.shape == (12, L)
    assert all(s.shape[0] == 12 for s in new_state)
    assert torch.allclose(log_probs.view(4, 3, V), base.unsqueeze(1).expand(4, 3, V), atol=1e-5)
    assert torch.allclose(log_probs.exp().sum(-1), torch.ones(12), atol=1e-5)


def test_feature_dropout_acts_in_training_only():
    grid, captions, lengths = batch()
    plain = make()
    torch.manual_seed(0)
    dropped = FastShowAttendTellDecoder(V, D, embed_dim=16, hidden_dim=20, attention_dim=16, dropout=0.0,
                                    feature_dropout=0.5)
    dropped.load_state_dict(plain.state_dict())
    plain.eval(), dropped.eval()
    with torch.no_grad():
        assert torch.equal(plain(grid, captions, lengths).logits, dropped(grid, captions, lengths).logits)
        dropped.train()
        assert not torch.allclose(plain(grid, captions, lengths).logits, dropped(grid, captions, lengths).logits)
