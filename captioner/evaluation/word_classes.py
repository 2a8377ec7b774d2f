"""Which words a captioner says, by class, and how each class attends: the probe of why pointing costs captions
(a sharp map may feed the LSTM the object alone, and the words about the scene lose their context).

A generated word's class comes from its photo's Flickr30k Entities references (data/entities.py), by lemma:

- ``object``: the head noun of a boxed phrase of some reference, not of type scene ("man", "dog", "shirt");
- ``scene``: the head noun of a phrase of type scene ("grass", "beach", "street"), boxed or not;
- ``other``: every other word (verbs, attributes, function words, and nouns no reference names).

A lemma that heads both kinds of phrase counts as an object. Per class, over the generated captions:

- ``words_per_caption``: how many of a caption's words fall in the class;
- ``entropy``: the mean H(α) / log L of those words' maps (1: uniform, 0: one cell);
- ``alpha_max``: the mean largest weight of those maps;
- ``looked``: the mean weight of those maps on the photo's cells (1 but for the visual sentinel, whose slot takes
  the rest: how much the words of the class looked at the photo);
- ``recall`` (object and scene): of the photo's class lemmas that at least ``CONSENSUS`` of its references name
  (what the annotators agree is there), the share the caption names.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from captioner.data.entities import EntityImage, lemma

CLASSES = ("object", "scene", "other")
CONSENSUS = 2  # references that must name a lemma for the recall to ask for it


def photo_lexicon(photo: EntityImage) -> tuple[dict[str, str], dict[str, int]]:
    """(lemma -> "object" or "scene", lemma -> how many references name it as such a head) of one photo."""
    kinds: dict[str, str] = {}
    named: dict[str, int] = {}
    for sentence in photo.sentences:
        seen = set()
        for phrase in sentence.phrases:
            key = lemma(sentence.tokens[phrase.head])
            if phrase.row == "scene":
                kind = "scene"
            elif photo.phrase_boxes(phrase):
                kind = "object"
            else:
                continue  # a non-scene phrase without a box (nobndbox, notvisual): no class of its own
            if kinds.get(key) != "object":  # an object wins over a scene
                kinds[key] = kind
            seen.add(key)
        for key in seen:
            named[key] = named.get(key, 0) + 1
    return kinds, named


class WordClassTally:
    """The figures of the module docstring, filled one generated caption at a time (``add``)."""

    def __init__(self) -> None:
        self.captions = 0
        self.words = {c: 0 for c in CLASSES}
        self.entropy = {c: 0.0 for c in CLASSES}
        self.alpha_max = {c: 0.0 for c in CLASSES}
        self.looked = {c: 0.0 for c in CLASSES}
        self.asked = {c: 0 for c in CLASSES[:2]}
        self.named = {c: 0 for c in CLASSES[:2]}

    def add(self, photo: EntityImage, words: Sequence[str], alphas: Any) -> None:
        """One generated caption of ``photo``: its ``words`` and their maps ``alphas`` (n_words, L)."""
        kinds, named = photo_lexicon(photo)
        a = np.asarray(alphas, dtype=np.float64)[: len(words)]
        L = a.shape[1]
        entropy = -(a * np.log(np.clip(a, 1e-12, 1.0))).sum(1) / max(np.log(L), 1e-12)  # (n,)
        lemmas = [lemma(w) for w in words]
        for i, key in enumerate(lemmas):
            kind = kinds.get(key, "other")
            self.words[kind] += 1
            self.entropy[kind] += float(entropy[i])
            self.alpha_max[kind] += float(a[i].max())
            self.looked[kind] += float(a[i].sum())
        said = set(lemmas)
        for key, count in named.items():
            if count >= CONSENSUS:
                self.asked[kinds[key]] += 1
                self.named[kinds[key]] += key in said
        self.captions += 1

    def figures(self) -> dict[str, dict[str, float | None]]:
        out = {}
        for c in CLASSES:
            n = self.words[c]
            out[c] = {"words": n, "words_per_caption": n / self.captions if self.captions else None,
                      "entropy": self.entropy[c] / n if n else None, "alpha_max": self.alpha_max[c] / n if n else None,
                      "looked": self.looked[c] / n if n else None}
            if c in self.asked:
                out[c]["recall"] = self.named[c] / self.asked[c] if self.asked[c] else None
                out[c]["asked"] = self.asked[c]
        return out


def format_word_classes(figures: dict[str, dict[str, float | None]]) -> list[str]:
    """The lines of an evaluation table."""
    rows = [f"{'word class':<16}{'words':>7} {'/caption':>9} {'entropy':>8} {'α max':>6} {'recall':>7}"]
    for c in CLASSES:
        f = figures[c]

        def num(value: float | None, spec: str) -> str:
            return "-" if value is None else format(value, spec)

        rows.append(f"{c:<16}{f['words']:>7} {num(f['words_per_caption'], '9.2f')} {num(f['entropy'], '8.3f')} "
                    f"{num(f['alpha_max'], '6.3f')} {num(f.get('recall'), '7.3f') if 'recall' in f else '':>7}")
    return rows
