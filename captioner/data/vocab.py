"""Tokenizer and vocabulary: words <-> ids for the decoder's embedding and softmax (Xu et al. 2015, Sec. 3.1.1).

The caption y = (y_1, ..., y_C) is a sequence of 1-of-K encoded words over a vocabulary of size K (here V). This
module owns the mapping. It never downloads anything (no NLTK punkt) and stores vocabularies as JSON, never pickle,
so a checkpoint's vocabulary can be read safely and by eye.

Ids 0-3 are always <pad>, <start>, <end>, <unk>; real words follow, sorted by (-count, word) so the ids of a
vocabulary built from the same captions never depend on the order the captions arrived in.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
SPECIALS = (PAD, START, END, UNK)
FORMAT = "captioner-vocab"
VERSION = 1

# A word is a run of letters/digits, optionally with apostrophe parts ("don't", "o'clock"); any other
# non-space character (punctuation, symbols, "_") is a token of its own. [^\W_] is "letter or digit" in any
# script, so "café" and "straße" stay whole.
_TOKEN_RE = re.compile(r"[^\W_]+(?:'[^\W_]+)*|[^\w\s]|_")
# Curly quotes and primes that people type for an apostrophe; mapped to "'" so "don’t" == "don't".
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "\u2032": "'", "`": "'"})


def tokenize(text: str) -> list[str]:
    """Lower-case ``text`` and split it into words and punctuation tokens.

    >>> tokenize("A dog's ball, on the GRASS.")
    ['a', "dog's", 'ball', ',', 'on', 'the', 'grass', '.']
    """
    if not isinstance(text, str):
        raise TypeError(f"tokenize expects a str, got {type(text).__name__}")
    # NFKC folds compatibility forms (full-width letters, ligatures) so the same word always gets one token.
    text = unicodedata.normalize("NFKC", text).translate(_APOSTROPHES).lower()
    return _TOKEN_RE.findall(text)


class Vocab:
    """Word <-> id mapping with the four special tokens at ids 0-3."""

    def __init__(self, words: list[str], min_count: int = 1) -> None:
        """Args:
        words: every token, index = id; must start with <pad>, <start>, <end>, <unk> and hold no duplicates.
        min_count: the threshold the vocabulary was built with (kept for the record).
        """
        _validate_words(words)
        self.words: list[str] = list(words)
        self.min_count = int(min_count)
        self._ids: dict[str, int] = {word: i for i, word in enumerate(self.words)}

    @classmethod
    def build(cls, token_lists: Iterable[list[str]], min_count: int = 1) -> "Vocab":
        """Keep the words seen at least ``min_count`` times, most frequent first (ties: alphabetical)."""
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        counts: Counter[str] = Counter()
        for tokens in token_lists:
            if isinstance(tokens, str):
                raise TypeError("Vocab.build expects lists of tokens, got a str; call tokenize() first")
            counts.update(tokens)
        for special in SPECIALS:  # specials always sit at ids 0-3, never again among the words
            counts.pop(special, None)
        kept = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
        return cls(list(SPECIALS) + kept, min_count=min_count)

    @property
    def pad_id(self) -> int:
        return 0

    @property
    def start_id(self) -> int:
        return 1

    @property
    def end_id(self) -> int:
        return 2

    @property
    def unk_id(self) -> int:
        return 3

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: object) -> bool:
        return word in self._ids

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self.words == other.words

    def __repr__(self) -> str:
        return f"Vocab({len(self)} words, min_count={self.min_count})"

    def id(self, word: str) -> int:
        """The id of ``word``; <unk>'s id if the word is not in the vocabulary."""
        return self._ids.get(word, self.unk_id)

    def encode(self, tokens: list[str], max_length: int | None = None) -> list[int]:
        """[<start>] + ids + [<end>], keeping at most ``max_length`` words (the end token is always kept)."""
        if max_length is not None:
            if max_length < 0:
                raise ValueError(f"max_length must be >= 0 or None, got {max_length}")
            tokens = tokens[:max_length]
        return [self.start_id] + [self.id(t) for t in tokens] + [self.end_id]

    def decode(self, ids: Iterable[int], keep_unk: bool = False) -> list[str]:
        """Words of ``ids`` up to the first <end>; <pad>, <start> (and <unk> unless ``keep_unk``) are dropped."""
        dropped = {self.pad_id, self.start_id} | (set() if keep_unk else {self.unk_id})
        words = []
        for raw in ids:
            i = int(raw)  # also accepts 0-d tensors and numpy integers
            if i == self.end_id:
                break
            if not 0 <= i < len(self.words):
                raise ValueError(f"id {i} is outside the vocabulary (0..{len(self.words) - 1})")
            if i not in dropped:
                words.append(self.words[i])
        return words

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "words": list(self.words), "min_count": self.min_count}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Vocab":
        """Rebuild a vocabulary from ``to_dict()`` output, checking it is one (clear errors otherwise)."""
        if not isinstance(d, dict):
            raise ValueError(f"a vocabulary must be a dict, got {type(d).__name__}")
        if d.get("format") != FORMAT:
            raise ValueError(f"not a vocabulary: 'format' is {d.get('format')!r}, expected {FORMAT!r}")
        if d.get("version") != VERSION:
            raise ValueError(f"unsupported vocabulary version {d.get('version')!r}; this code reads version {VERSION}")
        missing = [k for k in ("words", "min_count") if k not in d]
        if missing:
            raise ValueError(f"vocabulary dict lacks {missing}; it has {sorted(d)}")
        min_count = d["min_count"]
        if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
            raise ValueError(f"vocabulary 'min_count' must be a positive int, got {min_count!r}")
        return cls(d["words"], min_count=min_count)

    def save(self, path: str | Path) -> None:
        """Write JSON atomically (captioner/atomic.py) so a crash never leaves half a vocabulary."""
        from captioner.atomic import write_text_atomic

        write_text_atomic(path, json.dumps(self.to_dict(), ensure_ascii=False, indent=1))

    @classmethod
    def load(cls, path: str | Path) -> "Vocab":
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"cannot read vocabulary {path}: {err}") from err
        try:
            d = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"vocabulary {path} is not valid JSON: {err}") from err
        try:
            return cls.from_dict(d)
        except ValueError as err:
            raise ValueError(f"vocabulary {path}: {err}") from err


def _validate_words(words: object) -> None:
    if not isinstance(words, (list, tuple)):
        raise ValueError(f"vocabulary 'words' must be a list of str, got {type(words).__name__}")
    bad = [w for w in words if not isinstance(w, str) or not w]
    if bad:
        raise ValueError(f"vocabulary 'words' must be non-empty strings; bad entries: {bad[:5]!r}")
    if list(words[: len(SPECIALS)]) != list(SPECIALS):
        raise ValueError(f"vocabulary must start with {list(SPECIALS)} at ids 0-3, got {list(words[:4])}")
    seen: set[str] = set()
    duplicates = sorted({w for w in words if w in seen or seen.add(w)})
    if duplicates:
        raise ValueError(f"vocabulary has duplicate words: {duplicates[:10]}")
