"""Caption metrics (BLEU, METEOR, ROUGE-L, CIDEr-D) and figures of the attention maps.

Caption scores are the field's standard coco-caption implementations from `pycocoevalcap`
(BLEU-1..4 of Papineni et al. 2002 with the "closest" reference length; METEOR 1.5 of
Denkowski & Lavie 2014, a Java jar; ROUGE-L of Lin 2004 with beta 1.2; and CIDEr-D of
Vedantam et al. 2015), reported on the 0-100 scale as in Table 1 of Xu et al. 2015.
pycocoevalcap's class is named `Cider`, but its scorer is CIDEr-D: clipped n-gram counts,
a Gaussian length penalty (sigma 6), the x10 factor and idf from the evaluated references.
Note that its length term counts the candidate's bigrams rather than its words; we keep
the reference implementation as it is so numbers stay comparable with published ones.

Attention grounding measures how much of a word's attention alpha_t (Eq. (4)-(5) of Xu et al.) falls on the
object the word names: the grounding sources, the rasteriser and the formula are in captioner/evaluation/regions.py.
Here: ``cells_read`` (in hard attention's argmax/sample decoding the word read one cell, and that cell is what is
scored), the attention's sharpness and movement, and the mirror check.

Caption diversity (``caption_diversity``) says how generic the captions are, which n-gram scores reward: the
number of distinct words the predictions use, and the share of captions that are distinct strings (a model
that writes one safe caption for many images scores low on both).
"""

from __future__ import annotations

import re
import shutil
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from captioner.data.vocab import UNK, tokenize

CAPTION_METRICS = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D")

TOKENIZERS = ("ptb", "treebank", "simple")
# The tokens coco-caption's PTBTokenizer drops after tokenizing (pycocoevalcap/tokenizer/ptbtokenizer.py).
# It lower-cases first, so its upper-case bracket names never match: brackets survive as "-lrb-" etc.
PTB_PUNCTUATION = frozenset({"''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-", ".", "?", "!", ",", ":",
                             "-", "--", "...", ";"})
# The unknown word as captions hold it (decoding keeps it: vocab.decode(keep_unk=True)); any case, as PTB lower-cases.
UNK_TOKEN = re.compile(re.escape(UNK), re.IGNORECASE)


def _keeping_unk(tokenize_part: Callable[[str], list[str]], text: str) -> str:
    """``tokenize_part`` over the text between the <unk> tokens, each <unk> kept as one token "<unk>", as
    coco-caption's PTB tokenizer keeps it: the fallbacks split it into "<", "unk", ">" (or dropped its brackets),
    so a caption with <unk> had two or three more words, and one more unigram than PTB gives it."""
    parts = UNK_TOKEN.split(text)
    tokens = tokenize_part(parts[0])
    for part in parts[1:]:
        tokens += ["<unk>", *tokenize_part(part)]
    return " ".join(tokens)


def _simple_tokens(text: str) -> list[str]:
    return [t for t in tokenize(text) if any(ch.isalnum() for ch in t)]


def _normalise(text: str) -> str:
    """The "simple" tokenizer: the project's (captioner.data.vocab.tokenize) without punctuation
    tokens, space-joined. Used only when Java, and so coco-caption's PTB tokenizer, is absent; it
    lower-cases and drops punctuation as PTB does, but splits differently: "man's" stays one token
    (PTB: "man 's") and "t-shirt" becomes two (PTB keeps "t-shirt"). <unk> stays one token, as in PTB."""
    return _keeping_unk(_simple_tokens, text)


def _treebank_tokens(text: str) -> list[str]:
    from nltk.tokenize import TreebankWordTokenizer

    tokens = TreebankWordTokenizer().tokenize(" ".join(text.split()), convert_parentheses=True)
    return [t for t in (t.lower() for t in tokens) if t not in PTB_PUNCTUATION]


def _treebank(text: str) -> str:
    """The "treebank" tokenizer: nltk's Penn Treebank word tokenizer (no downloaded data needed) on the
    lower-cased caption, with the punctuation PTB scoring drops removed. The fallback without Java:
    it splits clitics ("man's" -> "man 's") and keeps hyphenated words ("t-shirt") as PTB does, and <unk>
    whole, as PTB does."""
    return _keeping_unk(_treebank_tokens, text)


def _ptb_missing() -> str | None:
    """Why coco-caption's PTB tokenizer cannot run here (None when it can): it needs Java on PATH and its CoreNLP
    jar, which the slimmed pycocoevalcap of an offline GPU node leaves out (scripts/slim_pycocoevalcap.py)."""
    import importlib.util

    if shutil.which("java") is None:
        return "Java (`java` on PATH)"
    spec = importlib.util.find_spec("pycocoevalcap")
    folder = Path(next(iter(spec.submodule_search_locations or []), "")) / "tokenizer" if spec else None
    if folder is None or not any(folder.glob("stanford-corenlp-*.jar")):
        return "pycocoevalcap's CoreNLP jar (a slimmed pycocoevalcap lacks it: pip install pycocoevalcap)"
    return None


def resolve_tokenizer(tokenizer: str = "auto") -> str:
    """"auto" -> "ptb" when Java and the tokenizer's jar are present (coco-caption's Stanford PTB tokenizer, what
    published tables use), else "treebank" (nltk's, close to PTB). Explicit names are checked; "ptb" without
    them is an error."""
    if tokenizer == "auto":
        return "ptb" if _ptb_missing() is None else "treebank"
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {tokenizer!r}; valid: auto, {', '.join(TOKENIZERS)}")
    missing = _ptb_missing() if tokenizer == "ptb" else None
    if missing is not None:
        raise ValueError(f"tokenizer 'ptb' needs {missing}; use 'treebank' or 'auto'")
    return tokenizer


def tokenize_captions(captions: dict[Any, list[str]], tokenizer: str) -> dict[Any, list[str]]:
    """Tokenize {key: [caption, ...]} for scoring: lower-case, punctuation dropped, tokens joined by
    spaces. "ptb" runs coco-caption's PTBTokenizer once (one JVM start) over every caption."""
    if tokenizer == "simple":
        return {k: [_normalise(c) for c in caps] for k, caps in captions.items()}
    if tokenizer == "treebank":
        return {k: [_treebank(c) for c in caps] for k, caps in captions.items()}
    if tokenizer != "ptb":
        raise ValueError(f"unknown tokenizer {tokenizer!r}; valid: {', '.join(TOKENIZERS)}")
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    # PTB reads one caption per line: a line break inside a caption would shift every later one.
    keyed = {i: [{"caption": " ".join(c.split()) or "."} for c in caps]
             for i, caps in enumerate(captions.values())}
    out = PTBTokenizer().tokenize(keyed)
    keys = list(captions)
    result = {keys[i]: out.get(i, []) for i in range(len(keys))}
    sizes = [(len(result[k]), len(captions[k])) for k in keys]
    if any(a != b for a, b in sizes):
        raise RuntimeError("the PTB tokenizer returned a different number of captions than it was given")
    return result


def caption_scores(
    predictions: dict[str, str],
    references: dict[str, list[str]],
    *,
    meteor: bool = True,
    metrics: Sequence[str] | None = None,
    meteor_timeout_s: float = 600.0,
    tokenizer: str = "auto",
) -> dict[str, float | None]:
    """Corpus-level caption metrics on the 0-100 scale.

    Args:
        predictions: image id -> generated caption (raw text).
        references: image id -> its raw reference captions (never vocab-re-encoded, so
            words outside the vocabulary still count against the model). Same ids.
        meteor: False skips METEOR (a JVM start, ~30 s here); its value is then None.
        metrics: names to compute (default all of CAPTION_METRICS), e.g. ("BLEU-4", "CIDEr-D")
            for fast validation during training. Only these keys are returned.
        meteor_timeout_s: a METEOR run longer than this is killed and reported as None.
        tokenizer: "auto" (PTB when Java is present, as papers score; else "treebank"), "ptb", "treebank" or
            "simple"; ``resolve_tokenizer`` tells which "auto" picks, for reporting beside the scores.

    Returns:
        name -> score, or None for METEOR when Java is missing, it was skipped, or it failed
        (never 0, which would read as a real, terrible score).
    """
    wanted = tuple(CAPTION_METRICS if metrics is None else metrics)
    unknown = [m for m in wanted if m not in CAPTION_METRICS]
    if unknown:
        raise ValueError(f"unknown caption metric(s) {unknown}; valid names: {list(CAPTION_METRICS)}")
    if not predictions:
        raise ValueError("caption_scores needs at least one prediction")
    missing = sorted(set(predictions) - set(references))[:5]
    extra = sorted(set(references) - set(predictions))[:5]
    if missing or extra:
        raise ValueError(
            f"predictions and references must cover the same image ids; "
            f"without references: {missing}, without predictions: {extra} (first 5 shown)"
        )
    empty = [k for k, refs in references.items() if not refs][:5]
    if empty:
        raise ValueError(f"images without reference captions: {empty} (first 5 shown)")

    # coco-caption scorers take {id: [tokenised sentence, ...]} with one hypothesis per id
    ids = sorted(predictions)
    tokenizer = resolve_tokenizer(tokenizer)
    both = tokenize_captions({**{("res", i): [predictions[i]] for i in ids},
                              **{("gts", i): list(references[i]) for i in ids}}, tokenizer)
    res = {i: both[("res", i)] for i in ids}
    gts = {i: both[("gts", i)] for i in ids}

    out: dict[str, float | None] = {}
    if any(m.startswith("BLEU") for m in wanted):
        from pycocoevalcap.bleu.bleu import Bleu

        bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
        for n in range(4):
            out[f"BLEU-{n + 1}"] = 100.0 * float(bleu[n])
    if "METEOR" in wanted:
        out["METEOR"] = _meteor(gts, res, meteor_timeout_s) if meteor else None
    if "ROUGE-L" in wanted:
        from pycocoevalcap.rouge.rouge import Rouge

        out["ROUGE-L"] = 100.0 * float(Rouge().compute_score(gts, res)[0])
    if "CIDEr-D" in wanted:
        from pycocoevalcap.cider.cider import Cider

        out["CIDEr-D"] = 100.0 * float(Cider().compute_score(gts, res)[0])
    return {m: out[m] for m in wanted}


def caption_diversity(predictions: dict[Any, str]) -> dict[str, int | float | None]:
    """How varied the predicted captions are, on their lower-cased whitespace tokens (the decoded words as
    predictions store them, ``<unk>`` included).

    Returns ``vocabulary``: the number of distinct words over all captions, and ``distinct_captions``: the
    number of distinct captions over the number of captions (0-1; None without captions). An empty caption
    is a caption (the empty string) with no words.
    """
    captions = [tuple(caption.lower().split()) for caption in predictions.values()]
    return {
        "vocabulary": len({word for words in captions for word in words}),
        "distinct_captions": len(set(captions)) / len(captions) if captions else None,
    }


def _meteor(gts: dict[str, list[str]], res: dict[str, list[str]], timeout_s: float) -> float | None:
    """METEOR 1.5 through pycocoevalcap's Java wrapper; None (with a warning) if it cannot run."""
    scored = _meteor_scores(gts, res, timeout_s)
    return None if scored is None else 100.0 * scored[0]


def meteor_segments(gts: dict[str, list[str]], res: dict[str, list[str]], timeout_s: float = 600.0
                    ) -> list[float] | None:
    """METEOR 1.5's per-photo (segment) scores (0-1), in ``res``'s key order; None (with a warning) if it cannot
    run. Their mean is close to the corpus figure, not equal to it (the corpus figure pools the matches)."""
    scored = _meteor_scores(gts, res, timeout_s)
    return None if scored is None else scored[1]


def _meteor_scores(gts: dict[str, list[str]], res: dict[str, list[str]], timeout_s: float
                   ) -> tuple[float, list[float]] | None:
    """(corpus METEOR, per-photo scores), both 0-1, or None with a warning."""
    if shutil.which("java") is None:
        warnings.warn("METEOR unavailable: no `java` on PATH (install a JRE to report it)", stacklevel=4)
        return None
    from pycocoevalcap.meteor.meteor import Meteor

    scorer = None
    timer = None
    try:
        scorer = Meteor()
        # a wedged JVM would block readline forever: killing it turns the hang into an error
        timer = threading.Timer(timeout_s, scorer.meteor_p.kill)
        timer.start()
        score, segments = scorer.compute_score(gts, res)
        return float(score), [float(x) for x in segments]
    except (OSError, ValueError, RuntimeError) as err:
        warnings.warn(f"METEOR failed, reported as None: {type(err).__name__}: {err}", stacklevel=4)
        return None
    finally:
        if timer is not None:
            timer.cancel()
        if scorer is not None:
            # the wrapper keeps its lock if compute_score raised, and its __del__ would then block forever
            if scorer.lock.locked():
                scorer.lock.release()
            scorer.meteor_p.kill()
            scorer.meteor_p.wait()
            try:  # closed here so the wrapper's __del__ finds nothing left to flush into a dead pipe
                scorer.meteor_p.stdin.close()
            except OSError:
                pass


# ---------------------------------------------------------------------------------------
# attention grounding


def as_numpy(x: Any, dtype: Any = np.float64) -> np.ndarray:
    """``x`` (an array-like, or a torch tensor on any device, requiring grad or not) as a numpy array of ``dtype``."""
    if hasattr(x, "detach"):  # torch tensor, possibly on an accelerator or requiring grad
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=dtype)


def cells_read(locations: Sequence[int], n_locations: int) -> np.ndarray:
    """(n_words, L) one-hot rows of the grid cells hard attention read (argmax/sample decoding): what
    grounding scores for such a decode, since the word saw that cell only, not the distribution alpha."""
    read = np.zeros((len(locations), n_locations), dtype=np.float32)
    read[np.arange(len(locations)), np.asarray(locations, dtype=np.int64)] = 1.0
    return read


# A word's softmax counts as saturated when its largest weight exceeds this: the scores' spread has grown so large
# that the distribution is one-hot in all but name, and its gradient vanishes (Vaswani et al. 2017, Sec. 3.2.1)
SATURATED_ALPHA = 0.99


def attention_sharpness(alphas: Iterable[Any]) -> dict[str, float | None]:
    """How peaked attention is, over every generated word: ``alpha_max`` is the mean of max_i α_ti
    (uniform attention gives 1/L), ``alpha_entropy`` the mean of H(α_t) / log L (uniform gives 1,
    one-hot 0), and ``alpha_saturated`` the share of words whose max_i α_ti exceeds SATURATED_ALPHA, over words.
    ``alphas`` yields one (n_words, L) array per caption; the result also gives ``locations`` (L). The figures
    are None when there are no words."""
    maxima, entropies, L = [], [], None
    for a in alphas:
        a = as_numpy(a)  # float64
        if a.ndim != 2 or a.shape[0] == 0:
            continue
        L = a.shape[1]
        maxima.append(a.max(axis=1))
        p = np.clip(a, 1e-12, 1.0)
        entropies.append(-(a * np.log(p)).sum(axis=1) / max(np.log(L), 1e-12))
    if not maxima:
        return {"alpha_max": None, "alpha_entropy": None, "alpha_saturated": None, "locations": L}
    maxima = np.concatenate(maxima)
    return {"alpha_max": float(maxima.mean()), "alpha_entropy": float(np.concatenate(entropies).mean()),
            "alpha_saturated": float((maxima > SATURATED_ALPHA).mean()), "locations": L}


def cells_of(alphas: Any, locations: Sequence[int] | None = None) -> np.ndarray:
    """The grid cell each word read: ``locations`` when the decode read one cell per word (hard attention's
    argmax/sample modes), else the arg-max of each word's α (soft attention, expectation decoding).
    alphas (n_words, L) -> (n_words,) ints."""
    if locations is not None:
        return np.asarray(locations, dtype=np.int64)[: as_numpy(alphas).shape[0]]
    return as_numpy(alphas).argmax(axis=1).astype(np.int64)


def attention_movement(cells: Iterable[Sequence[int]]) -> dict[str, float | None]:
    """Whether attention moves from word to word (a collapsed model reads one cell for every word):
    ``cells_per_caption`` is the mean number of distinct cells a caption's words read, and ``cell_changes``
    the share of consecutive word pairs, over all captions, whose cell differs. ``cells`` yields each
    caption's cell per word (cells_of). Both None when there are no words (cell_changes also without pairs)."""
    distinct, changes, pairs = [], 0, 0
    for c in cells:
        c = np.asarray(c, dtype=np.int64)
        if c.size == 0:
            continue
        distinct.append(len(np.unique(c)))
        changes += int((c[1:] != c[:-1]).sum())
        pairs += c.size - 1
    return {"cells_per_caption": float(np.mean(distinct)) if distinct else None,
            "cell_changes": changes / pairs if pairs else None}


# --------------------------------------------------------------------------- the mirror check

# Words that name no thing in the photo: what the mirror check leaves out (with "left"/"right", which the
# mirrored photo's caption exchanges)
FUNCTION_WORDS = frozenset(
    "a an the is are was be being of in on at to into onto with without and or while his her their its it "
    "he she they them this that there by for from near over under up down through some one two three four "
    "several another other each as out off next behind front top side <unk> left right".split())


def _first_uses(words: Sequence[str]) -> dict[str, int]:
    """Each content word of a caption -> the index of its first use."""
    uses: dict[str, int] = {}
    for i, w in enumerate(words):
        if w not in FUNCTION_WORDS and w not in uses:
            uses[w] = i
    return uses


def _map_overlaps(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """Histogram intersections of the mirrored photo's map b (H, W) with the original's map a mirrored
    (a[:, ::-1]) and unmirrored, and of a with its own mirror image (1: a left-right symmetric map)."""
    flipped = a[:, ::-1]
    return float(np.minimum(b, flipped).sum()), float(np.minimum(b, a).sum()), float(np.minimum(a, flipped).sum())


def mirror_following(pairs: Iterable[tuple], grid_hw: tuple[int, int], symmetric: float = 0.9
                     ) -> dict[str, float | int | None]:
    """Whether attention follows the photo when the photo is mirrored left-right (content, not position).

    ``pairs`` yields per image (words, alphas, cells) of the original photo's caption and the same of its
    mirror's: words (n,), alphas (n, L) with L = H*W row-major, cells (n,) the cell each word read (cells_of:
    the read cell of one-cell decoding, else α's arg-max) or None. Every content word that both captions use
    (first use in each; FUNCTION_WORDS left out) is compared: the mirrored photo's map b against the
    original's map a flipped (a[:, ::-1]: what attention grounded in the object gives) and unflipped (what a
    per-word position code gives).

    Returns ``mirror_words`` (shared content words), ``mirror_follow`` (the share of them, leaving out words
    whose map a is nearly symmetric, intersection with its mirror > ``symmetric``, whose b overlaps the
    flipped map more than the unflipped one), ``mirror_informative`` (how many words that share counts),
    ``mirror_overlap_flipped`` / ``mirror_overlap_unflipped`` (mean intersections over the shared words),
    and, when cells are given, ``mirror_columns`` (shared words whose original cell is off the centre
    column), ``columns_mirror`` (the share of those whose cell's column c became W-1-c) and ``columns_stay``
    (the share whose column stayed c). Values are None without words to count.
    """
    H, W = grid_hw
    flipped, unflipped, follows, columns, mirror, stay = [], [], [], 0, 0, 0
    for words_a, alphas_a, locs_a, words_b, alphas_b, locs_b in pairs:
        uses_a, uses_b = _first_uses(words_a), _first_uses(words_b)
        a_maps, b_maps = as_numpy(alphas_a).reshape(-1, H, W), as_numpy(alphas_b).reshape(-1, H, W)
        for word in uses_a.keys() & uses_b.keys():
            i, j = uses_a[word], uses_b[word]
            over_flipped, over_unflipped, self_mirror = _map_overlaps(a_maps[i], b_maps[j])
            flipped.append(over_flipped)
            unflipped.append(over_unflipped)
            if self_mirror <= symmetric:
                follows.append(over_flipped > over_unflipped)
            if locs_a is not None and locs_b is not None:
                col_a, col_b = int(locs_a[i]) % W, int(locs_b[j]) % W
                if 2 * col_a != W - 1:  # the centre column mirrors onto itself: neither
                    columns += 1
                    mirror += col_b == W - 1 - col_a
                    stay += col_b == col_a
    def mean(values: list) -> float | None:
        return float(np.mean(values)) if values else None

    return {"mirror_words": len(flipped), "mirror_informative": len(follows), "mirror_follow": mean(follows),
            "mirror_overlap_flipped": mean(flipped), "mirror_overlap_unflipped": mean(unflipped),
            "mirror_columns": columns, "columns_mirror": mirror / columns if columns else None,
            "columns_stay": stay / columns if columns else None}
