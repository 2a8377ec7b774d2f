"""Reliability tests across modules: the bad-image corpus, fuzzed image bytes, and
property-based (hypothesis) tests of the tokenizer/vocabulary, caption search and the
config override parser. Per-mode image tests live in test_images.py, per-case search
tests in test_search.py; these tests check the contracts over generated inputs.

Hypothesis runs few examples (deadline off) so the file stays a few seconds on a CPU.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import random
import re
import tempfile
import typing
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from corpus import EXPECTED, make_bad_image_corpus  # tests/corpus.py (pytest puts tests/ on sys.path)
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from PIL import Image

from captioner import config as config_module
from captioner.config import Config, ConfigError, config_to_dict, get_path, load_config, parse_override, save_config
from captioner.data.images import ImageLoadError, load_image
from captioner.data.vocab import SPECIALS, Vocab, tokenize
from captioner.decoding.options import DecodeOptions
from captioner.decoding.search import beam_search, greedy_search, normalise_score

FEW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# =============================================================================== images


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    return make_bad_image_corpus(tmp_path_factory.mktemp("bad_images"))


def test_corpus_builds_every_expected_file(corpus):
    assert set(corpus) == set(EXPECTED)
    assert all(p.is_file() for p in corpus.values())
    assert corpus["zero_bytes.jpg"].stat().st_size == 0
    assert corpus["bomb.png"].stat().st_size < 200, "a bomb is a tiny file declaring a huge image"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_image_corpus_loads_or_fails_clearly(corpus, name):
    outcome, detail = EXPECTED[name]
    path = corpus[name]
    if outcome == "ok":
        im = load_image(path)
        assert im.mode == "RGB" and im.size == detail
        assert np.asarray(im).dtype == np.uint8
    else:
        with pytest.raises(ImageLoadError) as info:
            load_image(path)
        message = str(info.value)
        assert str(path) in message, "the error must name the file"
        assert re.search(detail, message, flags=re.IGNORECASE), message


def test_exif_rotation_moves_pixels_not_only_the_size(corpus):
    # Stored 20x12 with orientation 6 ("rotate 90 CW to display"): the stored left column
    # becomes the displayed top row.
    with Image.open(corpus["exif_rotated.jpg"]) as raw:
        stored = np.asarray(raw.convert("RGB")).astype(int)  # (12, 20, 3), no EXIF applied
    shown = np.asarray(load_image(corpus["exif_rotated.jpg"])).astype(int)  # (20, 12, 3)
    expected = np.rot90(stored, k=-1)  # 90 degrees clockwise
    assert shown.shape == expected.shape
    assert np.abs(shown - expected).mean() < 1.0


def _seed_images() -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8))
    out = {}
    for fmt, im in [("PNG", rgb), ("JPEG", rgb), ("GIF", rgb.convert("P")), ("BMP", rgb),
                    ("WEBP", rgb), ("TIFF", rgb), ("PNG", Image.new("I;16", (9, 7), 4000))]:
        buf = io.BytesIO()
        im.save(buf, format=fmt)
        out[f"{fmt}-{im.mode}"] = buf.getvalue()
    return out


SEED_IMAGES = _seed_images()


@st.composite
def mutated_image_bytes(draw) -> bytes:
    data = bytearray(SEED_IMAGES[draw(st.sampled_from(sorted(SEED_IMAGES)))])
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "zero"]))
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "truncate":
            del data[at:]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            data[at : at + 4] = b"\x00\x00\x00\x00"
    return bytes(data)


@pytest.mark.filterwarnings("ignore::UserWarning")  # PIL warns about the corrupt EXIF/TIFF data we feed it
@FEW
@given(data=st.one_of(mutated_image_bytes(), st.binary(max_size=64)))
def test_load_image_on_damaged_bytes_returns_rgb_or_image_load_error(data):
    # A small max_pixels keeps any header the mutation inflates cheap to refuse.
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "fuzz.img"
        path.write_bytes(data)
        try:
            im = load_image(path, max_pixels=4096)
        except ImageLoadError as err:
            assert str(path) in str(err)
            return
        assert im.mode == "RGB" and im.width * im.height <= 4096
        im.tobytes()  # fully decoded, detached from the (deleted) file


# ======================================================================== vocabulary

any_text = st.text(max_size=60)
words_text = st.lists(
    st.sampled_from(["a", "red", "circle", "<end>", "<unk>", "don't", "café", "GRASS.", ",", "x_y", "42"]),
    max_size=15,
).map(" ".join)


@FEW
@given(text=st.one_of(any_text, words_text))
def test_tokenize_encode_decode_round_trip(text):
    tokens = tokenize(text)
    vocab = Vocab.build([tokens])
    assert vocab.decode(vocab.encode(tokens)) == tokens
    # Tokens are never empty, never hold whitespace and never collide with a special
    # token (tokenize splits "<end>" into "<", "end", ">"), so decode drops nothing.
    assert all(t and not any(c.isspace() for c in t) for t in tokens)
    assert not set(tokens) & set(SPECIALS)


@FEW
@given(text=st.one_of(any_text, words_text))
def test_tokenize_is_idempotent_on_its_own_output(text):
    # References are stored both as tokens and as raw text; joining tokens and tokenizing
    # again (what a metric or a re-run does) must give the same tokens.
    tokens = tokenize(text)
    assert tokenize(" ".join(tokens)) == tokens


@FEW
@given(captions=st.lists(st.lists(st.sampled_from("abcdefgh"), max_size=8), min_size=1, max_size=6),
       min_count=st.integers(1, 3), max_length=st.one_of(st.none(), st.integers(0, 8)), seed=st.integers(0, 99))
def test_vocab_encode_decode_with_unknowns_and_truncation(captions, min_count, max_length, seed):
    vocab = Vocab.build(captions, min_count=min_count)
    shuffled = list(captions)
    random.Random(seed).shuffle(shuffled)
    assert Vocab.build(shuffled, min_count=min_count).words == vocab.words, "ids must not depend on caption order"
    for tokens in captions:
        ids = vocab.encode(tokens, max_length=max_length)
        kept = tokens if max_length is None else tokens[:max_length]
        assert ids[0] == vocab.start_id and ids[-1] == vocab.end_id and len(ids) == len(kept) + 2
        assert vocab.decode(ids) == [t for t in kept if t in vocab]
        assert vocab.decode(ids, keep_unk=True) == [t if t in vocab else "<unk>" for t in kept]
    restored = Vocab.from_dict(json.loads(json.dumps(vocab.to_dict())))
    assert restored.words == vocab.words and restored.min_count == vocab.min_count


# ============================================================================ search

END, START = 2, 1


class PrefixModel:
    """A random language model whose next-word distribution and alpha are a fixed function
    of (image, every token fed so far). The image id and the history travel in the state,
    so any wrong reorder, expansion or row drop of the state changes the scores."""

    def __init__(self, V: int, L: int, seed: int, end_bias: float, max_length: int):
        self.V, self.L, self.seed, self.end_bias, self.max_length = V, L, seed, end_bias, max_length

    def init_state(self, B: int):
        history = torch.full((B, self.max_length + 1), -1, dtype=torch.long)  # (B, T+1) fed tokens
        return (torch.arange(B), (history, torch.zeros(B, dtype=torch.long)))  # nested on purpose

    def dist(self, image: int, prefix: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        key = zlib.crc32(repr((self.seed, image, prefix)).encode())
        g = torch.Generator().manual_seed(key)
        logits = torch.randn(self.V, generator=g) * 2.0  # (V,)
        logits[END] += self.end_bias
        alpha = torch.softmax(torch.randn(self.L, generator=g), 0)  # (L,)
        return torch.log_softmax(logits, 0), alpha

    def __call__(self, tokens, state):
        image, (history, pos) = state
        history = history.scatter(1, pos[:, None], tokens[:, None])  # (N, T+1)
        rows = [self.dist(int(i), tuple(h[: int(p) + 1].tolist())) for i, h, p in zip(image, history, pos)]
        log_probs = torch.stack([r[0] for r in rows])  # (N, V)
        alpha = torch.stack([r[1] for r in rows])  # (N, L)
        return log_probs, alpha, (image, (history, pos + 1))

    def replay(self, image: int, tokens: list[int], finished: bool) -> tuple[float, list[torch.Tensor]]:
        prefix, total, alphas = (START,), 0.0, []
        for w in tokens + ([END] if finished else []):
            lp, alpha = self.dist(image, prefix)
            total += float(lp[w])
            alphas.append(alpha)
            prefix += (w,)
        return total, alphas[: len(tokens)]


search_cases = st.fixed_dictionaries({
    "B": st.integers(1, 3), "K": st.integers(1, 5), "V": st.integers(3, 8), "L": st.integers(1, 4),
    "max_length": st.integers(1, 7), "n_best": st.integers(1, 6), "seed": st.integers(0, 10_000),
    "end_bias": st.sampled_from([-3.0, 0.0, 1.5]), "length_penalty": st.sampled_from([0.0, 0.5, 1.0, 2.0]),
})


def _check_hypotheses(model: PrefixModel, image: int, hyps, max_length: int, length_penalty: float, L: int):
    assert hyps, "search returned no hypothesis"
    for h in hyps:
        assert len(h.tokens) <= max_length
        assert END not in h.tokens
        if h.finished is False and math.isfinite(h.score):
            assert len(h.tokens) == max_length, "an unfinished caption ran out of steps"
        replayed, alphas = model.replay(image, h.tokens, h.finished)
        assert h.score == pytest.approx(replayed, rel=1e-5, abs=1e-4), "score != sum of step log-probs"
        assert h.norm_score == pytest.approx(
            normalise_score(h.score, len(h.tokens) + h.finished, length_penalty), rel=1e-6, abs=1e-6)
        assert h.alphas is not None and tuple(h.alphas.shape) == (len(h.tokens), L)
        if alphas:
            assert torch.allclose(h.alphas, torch.stack(alphas), atol=1e-6), "alpha of another step or row"
    norms = [h.norm_score for h in hyps]
    assert norms == sorted(norms, reverse=True), "n-best not sorted by norm_score"
    keys = [(tuple(h.tokens), h.finished) for h in hyps]
    assert len(set(keys)) == len(keys), "duplicate hypotheses in the n-best list"


@FEW
@given(case=search_cases)
def test_beam_search_properties(case):
    model = PrefixModel(case["V"], case["L"], case["seed"], case["end_bias"], case["max_length"])
    B, K, lp = case["B"], case["K"], case["length_penalty"]
    n_best = min(case["n_best"], K)  # the options refuse more hypotheses than beams
    options = DecodeOptions(beam=K, n_best=n_best, max_length=case["max_length"], length_penalty=lp)
    results = beam_search(model, model.init_state(B), options, batch_size=B, start_id=START, end_id=END)
    assert len(results) == B
    for b, hyps in enumerate(results):
        assert 1 <= len(hyps) <= n_best
        _check_hypotheses(model, b, hyps, case["max_length"], lp, case["L"])
    if K == 1:
        greedy = greedy_search(model, model.init_state(B), options, batch_size=B, start_id=START, end_id=END)
        for b in range(B):
            assert results[b][0].tokens == greedy[b][0].tokens and results[b][0].finished == greedy[b][0].finished


@FEW
@given(case=search_cases)
def test_greedy_search_properties(case):
    model = PrefixModel(case["V"], case["L"], case["seed"], case["end_bias"], case["max_length"])
    B, lp = case["B"], case["length_penalty"]
    options = DecodeOptions(beam=1, max_length=case["max_length"], length_penalty=lp)
    greedy = greedy_search(model, model.init_state(B), options, batch_size=B, start_id=START, end_id=END)
    for results in (greedy,):
        assert len(results) == B and all(len(hyps) == 1 for hyps in results)
        for b, hyps in enumerate(results):
            _check_hypotheses(model, b, hyps, case["max_length"], lp, case["L"])


@FEW
@given(V=st.integers(3, 4), max_length=st.integers(1, 2), seed=st.integers(0, 10_000),
       end_bias=st.sampled_from([-2.0, 0.0, 2.0]), length_penalty=st.sampled_from([0.0, 1.0, 2.0]))
def test_wide_enough_beam_finds_the_exact_optimum(V, max_length, seed, end_bias, length_penalty):
    # With K >= V**max_length no candidate is ever pruned, so beam search is exhaustive and
    # must return the best norm_score over every caption (finished of any length, or
    # unfinished at max_length), computed here by brute force.
    model = PrefixModel(V, 2, seed, end_bias, max_length)
    words = [w for w in range(V) if w != END]
    best = -math.inf

    def visit(prefix: list[int]):
        nonlocal best
        if len(prefix) == max_length:
            score, _ = model.replay(0, prefix, finished=False)
            best = max(best, normalise_score(score, len(prefix), length_penalty))
            return
        score, _ = model.replay(0, prefix, finished=True)
        best = max(best, normalise_score(score, len(prefix) + 1, length_penalty))
        for w in words:
            visit(prefix + [w])

    visit([])
    top = beam_search(model, model.init_state(1),
                      DecodeOptions(beam=V**max_length, max_length=max_length, length_penalty=length_penalty),
                      batch_size=1, start_id=START, end_id=END)[0][0]
    assert top.norm_score == pytest.approx(best, rel=1e-5, abs=1e-5)


# ============================================================================ config


def _leaves(cls: type = Config, prefix: str = "") -> dict[str, type]:
    """Every settable leaf of the config tree: dotted path -> annotated type."""
    out = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        typ = hints[f.name]
        if dataclasses.is_dataclass(typ):
            out.update(_leaves(typ, path + "."))
        else:
            out[path] = typ
    return out


LEAVES = _leaves()
# Words YAML 1.1 reads as something other than a string.
_YAML_SPECIAL = re.compile(r"^(y|n|yes|no|on|off|true|false|null|~)$", re.IGNORECASE)


def _plain_word(s: str) -> bool:
    return not _YAML_SPECIAL.match(s) and yaml.safe_load(s) == s


def _valid_value(draw, path: str, typ: type, free_text: st.SearchStrategy, floats: st.SearchStrategy):
    if path in config_module.CHOICES:
        return draw(st.sampled_from(config_module.CHOICES[path]))
    if typ is bool:
        return draw(st.booleans())
    if typ is str:
        return draw(free_text)
    low = 1 if path in config_module.POSITIVE else 0 if path in config_module.NON_NEGATIVE else None
    if typ is int:
        return draw(st.integers(low if low is not None else -5, 10_000))
    if path in config_module.UNIT_INTERVAL:
        return draw(floats.filter(lambda x: x <= 1.0))
    value = draw(floats)
    return value if low != 1 or value > 0 else 1.0


def _as_typed(value) -> str:
    # What a user types after "=": true/false for bools, repr for numbers, strings verbatim.
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, (int, float)) else value


plain_words = st.from_regex(r"[A-Za-z][A-Za-z0-9_./:-]{0,15}", fullmatch=True).filter(_plain_word)
decimal_floats = st.integers(0, 10**6).map(lambda n: n / 1000)  # repr has a '.', no exponent


@st.composite
def plain_overrides(draw):
    paths = draw(st.lists(st.sampled_from(sorted(LEAVES)), min_size=1, max_size=5, unique=True))
    return {p: _valid_value(draw, p, LEAVES[p], plain_words, decimal_floats) for p in paths}


def _is_consistent(values: dict) -> bool:
    try:
        cfg_dict: dict = {}
        for path, value in values.items():
            node = cfg_dict
            *parents, last = path.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = value
        config_module.check_read_keys(config_module.config_from_dict(cfg_dict))
        return True
    except ConfigError:
        # a cross-field rule the draw happened to break (multi_head dim % heads; a key the run would not read)
        return False


@FEW
@given(values=plain_overrides())
def test_overrides_round_trip_through_load_and_save(values, tmp_path_factory):
    assume(_is_consistent(values))
    overrides = [f"{path}={_as_typed(value)}" for path, value in values.items()]
    for text, (path, value) in zip(overrides, values.items()):
        assert parse_override(text) == (path.split("."), value)
    cfg = load_config(overrides=overrides)
    for path, value in values.items():
        got = get_path(cfg, path)
        assert got == value and type(got) is type(value) or (type(value) is int and got == float(value)), path
    saved = tmp_path_factory.mktemp("cfg") / "resolved.yaml"
    save_config(cfg, saved)
    assert config_to_dict(load_config(saved)) == config_to_dict(cfg)


@FEW
@given(path=st.sampled_from(sorted(LEAVES)), depth=st.data(),
       bad=st.from_regex(r"[a-z][a-z_]{0,10}", fullmatch=True))
def test_unknown_key_errors_name_the_key_and_the_valid_ones(path, depth, bad):
    parts = path.split(".")
    i = depth.draw(st.integers(0, len(parts) - 1))
    cls = Config
    for part in parts[:i]:
        cls = typing.get_type_hints(cls)[part]
    valid = [f.name for f in dataclasses.fields(cls)]
    assume(bad not in valid)
    bad_path = ".".join(parts[:i] + [bad])
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[f"{'.'.join(parts[:i] + [bad] + parts[i + 1:])}=1"])
    message = str(info.value)
    assert repr(bad_path) in message or bad_path in message, message
    assert all(name in message for name in valid), "the error should list the valid keys"


@FEW
@given(path=st.sampled_from(sorted(p for p, t in LEAVES.items()
                                   if t in (int, float) and p not in config_module.CHOICES)),
       word=plain_words.filter(lambda s: not s[0].isdigit()))
def test_wrongly_typed_values_error_naming_the_key(path, word):
    with pytest.raises(ConfigError, match=re.escape(path)):
        load_config(overrides=[f"{path}={word}"])


# Values as people type them on a command line, which YAML 1.1 (PyYAML) would read as
# something else.
# Overrides are parsed by the target field's type, so these keep their meaning.
TYPED_OVERRIDES = [
    ("train.lr=1e-4", 1e-4),  # PyYAML: a float needs a '.', so '1e-4' is a str -> "expected float"
    ("train.time_budget_s=3e3", 3000.0),
    ("data.root=/data/my #1 run", "/data/my #1 run"),  # ' #' starts a YAML comment: silently truncated
    ("train.run_dir=2024-01-01", "2024-01-01"),  # a date object -> "expected str"
    ("train.device=on", "on"),  # YAML 1.1 bool
    ("model.encoder.weights_path=~", "~"),  # null
    ("train.run_dir=runs/a: b", "runs/a: b"),  # a mapping
    ("data.captions=[draft].json", "[draft].json"),  # a flow sequence -> parse error
]


@pytest.mark.parametrize("text, expected", TYPED_OVERRIDES, ids=[t for t, _ in TYPED_OVERRIDES])
def test_override_values_as_typed_on_a_command_line(text, expected):
    path = text.split("=", 1)[0]
    assert get_path(load_config(overrides=[text]), path) == expected


# ============================================================ checkpoints end to end


def test_load_captioner_round_trip_is_bit_exact(smoke_checkpoint):
    from captioner.api import load_captioner
    from captioner.store.checkpoint import load_checkpoint

    saved = load_checkpoint(smoke_checkpoint / "best.pt")["model"]
    loaded = load_captioner(smoke_checkpoint).state_dict()
    assert list(loaded) == list(saved)
    for key, value in saved.items():
        assert torch.equal(loaded[key], value), key


def _damage(src: Path, dst: Path, how: str, marker: Path) -> None:
    if how == "truncated":
        data = src.read_bytes()
        dst.write_bytes(data[: len(data) // 2])
    elif how == "garbage":
        dst.write_bytes(np.random.default_rng(0).bytes(4096))
    else:  # a crafted pickle whose unpickling would run code
        class Gadget:
            def __reduce__(self):
                return (exec, (f"open({str(marker)!r}, 'w').close()",))

        payload = torch.load(src, weights_only=True)
        payload["metrics"] = Gadget()
        torch.save(payload, dst)


@pytest.mark.parametrize("how", ["truncated", "garbage", "crafted"])
def test_load_captioner_and_cli_refuse_damaged_checkpoints(smoke_checkpoint, tmp_path, capsys, how):
    from captioner.api import load_captioner
    from captioner.cli import main
    from captioner.store.checkpoint import CheckpointError

    bad, marker = tmp_path / "bad.pt", tmp_path / "pwned"
    _damage(smoke_checkpoint / "best.pt", bad, how, marker)
    with pytest.raises(CheckpointError, match=re.escape(str(bad))):
        load_captioner(bad)
    image = tmp_path / "x.png"
    Image.new("RGB", (8, 8)).save(image)
    assert main(["caption", str(image), "--checkpoint", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "Traceback" not in err
    assert not marker.exists(), "loading ran code from the checkpoint"


def test_vocabulary_that_does_not_fit_the_weights_names_the_key(smoke_checkpoint, tmp_path):
    from captioner.api import load_captioner
    from captioner.store.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

    payload = load_checkpoint(smoke_checkpoint / "best.pt")
    V = len(payload["vocab"]["words"])
    payload["vocab"] = dict(payload["vocab"], words=payload["vocab"]["words"] + ["triangle"])
    save_checkpoint(tmp_path / "best.pt", payload)
    with pytest.raises(CheckpointError) as info:
        load_captioner(tmp_path)
    message = str(info.value)
    assert re.search(rf"\S+: checkpoint \({V}(, \d+)*,?\) vs model \({V + 1}(, \d+)*,?\)", message), message


@pytest.mark.parametrize("entry", ["vocab", "config"])
def test_broken_vocab_or_config_entry_names_the_checkpoint(smoke_checkpoint, tmp_path, entry):
    from captioner.api import load_captioner
    from captioner.store.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

    payload = load_checkpoint(smoke_checkpoint / "best.pt")
    if entry == "vocab":
        payload["vocab"] = {"words": ["a", "b"]}
    else:
        payload["config"]["model"]["attention"]["kind"] = "telepathic"
    path = tmp_path / "best.pt"
    save_checkpoint(path, payload)
    with pytest.raises(CheckpointError, match=re.escape(str(path))):
        load_captioner(path)


@pytest.mark.slow  # a few seconds: captions the whole corpus with the smoke model
def test_caption_cli_over_the_bad_image_corpus(smoke_checkpoint, corpus, capsys):
    from captioner.cli import main

    rc = main(["caption", *map(str, corpus.values()), "--checkpoint", str(smoke_checkpoint), "--json", "--beam", "2"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1, "some images failed, so the exit status says so"
    ok = {Path(r["image"]).name for r in out["results"]}
    failed = {Path(f["image"]).name: f["error"] for f in out["failed"]}
    assert ok == {n for n, (kind, _) in EXPECTED.items() if kind == "ok"}
    assert set(failed) == {n for n, (kind, _) in EXPECTED.items() if kind == "error"}
    for name, error in failed.items():
        assert str(corpus[name]) in error
    assert all(isinstance(r["caption"], str) for r in out["results"])
