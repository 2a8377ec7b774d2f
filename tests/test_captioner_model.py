"""build_model: the config's options reach the model; the grid position embedding."""

import pytest
import torch

from captioner.api import build_model
from captioner.config import load_config
from captioner.data.vocab import Vocab
from captioner.models.captioner import GridPositionEmbedding

SMOKE = "configs/smoke.yaml"
HARD = ["model.attention.attention=hard", "train.objective.kind=reinforce"]


@pytest.fixture
def vocab():
    return Vocab.build([["a", "red", "circle"], ["a", "blue", "square"]])


def test_position_embedding_is_built_and_trains(vocab):
    cfg = load_config(SMOKE, ["model.encoder.position_embedding=true", "model.encoder.self_attention_layers=1"])
    model = build_model(cfg, vocab)
    pos = [m for m in model.refine.modules() if isinstance(m, GridPositionEmbedding)]
    assert len(pos) == 1
    H, W = model.grid_hw
    assert pos[0].weight.shape == (1, H * W, model.encoder.out_dim)
    grid = torch.randn(2, H * W, model.encoder.backbone_dim)
    captions = torch.tensor([[1, 4, 5, 2], [1, 6, 2, 0]])
    out = model(model.prepare_grid(grid), captions, torch.tensor([4, 3]))
    out.logits.sum().backward()
    assert pos[0].weight.grad is not None and pos[0].weight.grad.abs().sum() > 0


def test_position_embedding_starts_as_identity_and_checks_locations():
    emb = GridPositionEmbedding(4, 3)
    grid = torch.randn(2, 4, 3)
    assert torch.equal(emb(grid), grid)
    with pytest.raises(ValueError, match="5 locations"):
        emb(torch.randn(2, 5, 3))


def test_default_model_has_no_refinement(vocab):
    model = build_model(load_config(SMOKE), vocab)
    assert isinstance(model.refine, torch.nn.Identity)


def _spy_reads(model, monkeypatch) -> list[torch.Tensor]:
    """Record the cell every attention read picks, step by step (what the decoder really used)."""
    reads: list[torch.Tensor] = []
    attention = model.decoder.attention
    original = attention.forward

    def spy(*args, **kwargs):
        out = original(*args, **kwargs)
        reads.append(out.index.clone())
        return out

    monkeypatch.setattr(attention, "forward", spy)
    return reads


@pytest.mark.parametrize("mode", ["sample", "argmax"])
def test_hard_greedy_decoding_reports_the_cells_it_read(vocab, monkeypatch, mode):
    model = build_model(load_config(SMOKE, HARD), vocab).eval()
    H, W = model.grid_hw
    torch.manual_seed(0)
    grid = model.prepare_grid(torch.randn(3, H * W, model.encoder.backbone_dim))
    reads = _spy_reads(model, monkeypatch)
    with torch.no_grad():
        options = model.decode_options.replace_given(beam=1, max_length=6, attention_mode=mode)
        hyps = model.generate(grid, options, min_length=3)
    for b, (hyp,) in enumerate(hyps):
        n = len(hyp.tokens)
        assert n >= 3 and hyp.alphas.shape == (n, H * W)
        assert hyp.locations == [int(reads[t][b]) for t in range(n)]  # greedy rows never move
    argmaxes = [int(i) for (hyp,) in hyps for i in hyp.alphas.argmax(1)]
    chosen = [i for (hyp,) in hyps for i in hyp.locations]
    if mode == "argmax":
        assert chosen == argmaxes
    else:  # an untrained model's alpha is flat: a sampled cell is often not its arg-max
        assert chosen != argmaxes


def test_hard_beam_search_and_caption_carry_locations(vocab):
    from PIL import Image

    model = build_model(load_config(SMOKE, HARD), vocab).eval()
    H, W = model.grid_hw
    grid = model.prepare_grid(torch.randn(2, H * W, model.encoder.backbone_dim))
    with torch.no_grad():
        options = model.decode_options.replace_given(beam=3, n_best=2, max_length=5, attention_mode="argmax")
        hyps = model.generate(grid, options, min_length=2)
    for hyp in (h for per_image in hyps for h in per_image):
        assert hyp.alphas.shape == (len(hyp.tokens), H * W)
        assert hyp.locations == hyp.alphas.argmax(1).tolist()  # carried through the beams' reordering
    image = Image.new("RGB", (64, 64), (200, 30, 30))
    (out,) = model.caption([image], beam=2, attention_mode="sample")
    assert len(out["locations"]) == len(out["words"]) == len(out["alphas"])
    assert all(0 <= i < H * W for i in out["locations"])
    (soft_out,) = model.caption([image], beam=2, attention_mode="expectation")
    assert soft_out["locations"] is None


def _crafted_step(end_first: float, word_first: float, end_after: float, word_after: float = -50.0):
    """A step function for model.decoder.step_with_location (what generate() calls): from <start>, <end> costs
    ``end_first`` and the word "a" (id 4) ``word_first``; after a word, <end> costs ``end_after`` and "a"
    ``word_after``; everything else is (nearly) impossible."""

    def step(tokens, state, attention_mode="expectation", dense=True):
        N = tokens.shape[0]
        log_probs = torch.full((N, 8), -50.0)
        at_start = tokens == 1
        log_probs[at_start, 2] = end_first
        log_probs[at_start, 4] = word_first
        log_probs[~at_start, 2] = end_after
        log_probs[~at_start, 4] = word_after
        L = state[-1].shape[1] if state[-1].dim() > 2 else 4
        return log_probs, torch.full((N, L), 1.0 / L), None, state  # no cell read: soft attention

    return step


def _tiny_vocab():
    return Vocab(["<pad>", "<start>", "<end>", "<unk>", "a", "red", "blue", "circle"])


@pytest.mark.parametrize("length_penalty, expected", [(0.0, []), (1.0, ["a"])])
def test_eval_length_penalty_reaches_generate_and_the_decode_loop(length_penalty, expected, monkeypatch):
    """Raw scores: "<end>" -1.0 beats "a <end>" -1.2; per word (penalty 1) -0.6 beats -1.0."""
    from captioner.evaluation.split import decode_batches

    model = build_model(load_config(SMOKE, [f"eval.length_penalty={length_penalty}"]), _tiny_vocab()).eval()
    monkeypatch.setattr(model.decoder, "step_with_location", _crafted_step(-1.0, -0.6, -0.6))
    H, W = model.grid_hw
    grid = model.prepare_grid(torch.randn(2, H * W, model.encoder.backbone_dim))
    hyps = model.generate(grid, model.decode_options.replace_given(beam=3))
    assert [model.vocab.decode(per_image[0].tokens) for per_image in hyps] == [expected, expected]
    # The decode loop behind `captioner evaluate` and validation uses the model's value...
    ((_, _, words),) = list(decode_batches(model, [(["img"], grid[:1])], model.decode_options.replace_given(beam=3)))
    assert words == expected
    # ...and an explicit value (`captioner evaluate/caption --length-penalty`) wins.
    other = [] if expected else ["a"]
    explicit = model.decode_options.replace_given(beam=3, length_penalty=1.0 - length_penalty)
    ((_, _, words),) = list(decode_batches(model, [(["img"], grid[:1])], explicit))
    assert words == other


def test_decoding_length_defaults_to_the_training_caption_length(monkeypatch):
    model = build_model(load_config(SMOKE, ["data.max_length=7", "eval.max_length=0"]), _tiny_vocab()).eval()
    assert model.decode_options.max_length == 7
    monkeypatch.setattr(model.decoder, "step_with_location", _crafted_step(-5.0, -0.1, -5.0, -0.1))
    # The crafted model prefers "a" to <end> at every step: the caption uses the whole allowance.
    H, W = model.grid_hw
    grid = model.prepare_grid(torch.randn(1, H * W, model.encoder.backbone_dim))
    (per_image,) = model.generate(grid, model.decode_options.replace_given(beam=1))
    assert len(per_image[0].tokens) == 7
    explicit = build_model(load_config(SMOKE, ["data.max_length=7", "eval.max_length=3"]), _tiny_vocab())
    assert explicit.decode_options.max_length == 3


@pytest.mark.parametrize("beam", [1, 3])
def test_eval_block_trigrams_reaches_generate_and_the_decode_loop(beam, monkeypatch):
    """The crafted model prefers "a" to <end> at every step: "a a a a a" (max_length 5) repeats the trigram
    "a a a"; with eval.block_trigrams the fourth "a" is banned and the caption ends."""
    from captioner.evaluation.split import decode_batches

    off = build_model(load_config(SMOKE, ["eval.max_length=5"]), _tiny_vocab()).eval()
    on = build_model(load_config(SMOKE, ["eval.max_length=5", "eval.block_trigrams=true"]), _tiny_vocab()).eval()
    assert (off.decode_options.block_trigrams, on.decode_options.block_trigrams) == (False, True)
    H, W = on.grid_hw
    grid = on.prepare_grid(torch.randn(2, H * W, on.encoder.backbone_dim))
    for model in (off, on):
        monkeypatch.setattr(model.decoder, "step_with_location", _crafted_step(-5.0, -0.1, -5.0, -0.1))
    looping, blocked = ["a"] * 5, ["a"] * 3
    for model, words in ((off, looping), (on, blocked)):
        hyps = model.generate(grid, model.decode_options.replace_given(beam=beam))
        assert [model.vocab.decode(h[0].tokens) for h in hyps] == [words, words]
    # The decode loop behind `captioner evaluate` and validation uses the model's value...
    ((_, _, words),) = list(decode_batches(on, [(["img"], grid[:1])], on.decode_options.replace_given(beam=beam)))
    assert words == blocked
    # ...and an explicit value (`captioner evaluate/caption --block-trigrams / --no-block-trigrams`) wins.
    ((_, _, words),) = list(decode_batches(on, [(["img"], grid[:1])],
                                           on.decode_options.replace_given(beam=beam, block_trigrams=False)))
    assert words == looping
    ((_, _, words),) = list(decode_batches(off, [(["img"], grid[:1])],
                                           off.decode_options.replace_given(beam=beam, block_trigrams=True)))
    assert words == blocked
