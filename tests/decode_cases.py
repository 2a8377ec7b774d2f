"""Fixed small decoders and the decodes that tests/test_decode_syncs.py pins (captions, scores, finished flags and
read cells at beam 1, 3 and 5): the weights come from one seeded generator in parameter-name order, so they do not
depend on the order the modules draw their initial weights in. ``python tests/decode_cases.py >
tests/decode_expected.json`` records them (recorded with the code before the search's host syncs were taken out of
its per-word loop)."""
from __future__ import annotations

import contextlib

import torch

from captioner.config import AttentionConfig
from captioner.decoding.options import DecodeOptions
from captioner.decoding.search import search
from captioner.models.decoders import DECODERS
from captioner.models.decoders.registry import build_decoder

PAD, START, END, UNK = 0, 1, 2, 3
D, L, B = 12, 6, 4

# name: (decoder kind, attention, vocabulary size, attention_mode); V >= 256 reaches the fused read (fast/kernels/)
MODELS = {
    "lstm_soft_v19": ("lstm", "soft", 19, "expectation"),
    "lstm_soft_v300": ("lstm", "soft", 300, "expectation"),
    "lstm_hard_v19": ("lstm", "hard", 19, "argmax"),
    "transformer_v19": ("transformer", "soft", 19, "expectation"),
}
# (beam, n_best, block_trigrams, min_length, max_length): min_length = max_length runs every step
DECODES = [(1, 1, False, 0, 10), (3, 1, False, 0, 10), (3, 2, False, 0, 10), (5, 3, False, 0, 10),
           (5, 5, False, 0, 12), (3, 2, True, 0, 10), (5, 2, False, 8, 8), (1, 1, False, 8, 8)]


def fixed_decoder(name: str) -> torch.nn.Module:
    kind, attention, V, _ = MODELS[name]
    family = DECODERS.section(kind)
    sizes = dict(embed_dim=16, hidden_dim=24, layers=2, dropout=0.0)
    section = family(**{f: v for f, v in sizes.items() if f in family.__dataclass_fields__})
    dec = build_decoder(section, AttentionConfig(attention=attention, attention_dim=16, heads=2), vocab_size=V,
                        feature_dim=D, pad_id=PAD)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for _, p in sorted(dec.named_parameters()):
            p.copy_(torch.randn(p.shape, generator=g) * 0.6)
    return dec.eval()


def fixed_grid() -> torch.Tensor:
    return torch.randn(B, L, D, generator=torch.Generator().manual_seed(11))  # (B, L, D)


def decode(name: str, beam: int, n_best: int, block_trigrams: bool, min_length: int, max_length: int,
           device: str = "cpu", around_search=None, around_step=None) -> list[list[list]]:
    """The search as Captioner.generate drives it (Logits, per-image attention memory, <pad> <start> <unk> banned);
    per image its hypotheses as plain data: [tokens, score, finished, locations, each word's mean cell under alpha].
    ``around_search`` / ``around_step``: context managers (factories) the search / each step call of the model runs
    in (the gpu test counts the search's syncs: on around the search, off around the model's step)."""
    dec = fixed_decoder(name).to(device)
    grid = fixed_grid().to(device)
    mode = MODELS[name][3]
    options = DecodeOptions(beam=beam, n_best=n_best, max_length=max_length, block_trigrams=block_trigrams,
                            attention_mode=mode)

    def step(tokens, state):
        with around_step() if around_step is not None else contextlib.nullcontext():
            log_probs, alpha, location, state = dec.step_with_location(tokens, state, mode, dense=False)
        return log_probs, (alpha, location), state

    with torch.no_grad():
        state = dec.init_state(grid)
        with around_search() if around_search is not None else contextlib.nullcontext():
            hyps = search(step, state, options, batch_size=B, start_id=START, end_id=END,
                          forbid_ids=(PAD, START, UNK), expand=dec.expand_state, min_length=min_length)
    cells = torch.arange(L, dtype=torch.float32)  # (L,): alpha's mean cell per word tells which maps were kept
    return [[[h.tokens, h.score, h.finished, h.locations, [round(x, 4) for x in (h.alphas @ cells).tolist()]]
             for h in image] for image in hyps]


def decode_all(device: str = "cpu") -> dict:
    return {f"{name} {args}": decode(name, *args, device=device) for name in MODELS for args in DECODES}


if __name__ == "__main__":
    import json
    import sys

    json.dump(decode_all(), sys.stdout, separators=(",", ":"))
