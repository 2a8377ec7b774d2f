"""The model cards' figure tables, generated from records (issue 72): captioner/pretrained/{flickr8k_soft,
flickr8k_hard,flickr8k_grounded}/README.md.

The shipped file's own figures are its config.json ``scores`` (``captioner evaluate`` of that int8 file, written by
``captioner export --scores``, which also writes the card's metadata block from them); the float16 and float32 rows
and the models a card compares with are those runs' records (docs/grounding/rows, docs/results/records). Only the
tables between the markers are generated: the metadata block and the fingerprint section stay export's, and export
keeps the rest of a card's text (store.hub.write_card), so a re-export leaves these tables to ``--write``.
"""

from __future__ import annotations

from pathlib import Path

from captioner.reports.history import B5
from captioner.reports.sections import Section
from captioner.reports.tables import Cell, Record, Records, Row, figure, num, pct, scores, table


def card(model: str) -> str:
    return f"captioner/pretrained/{model}/README.md"


def beside(lead: Cell, *baselines: Cell) -> Cell:
    """A figure with its baselines in brackets: "80.7 % (64.0 %)", "0.799 (0.367, 0.558)"."""
    def cell(record: Record) -> str | None:
        texts = [c(record) for c in (lead, *baselines)]
        return None if None in texts else f"{texts[0]} ({', '.join(texts[1:])})"  # type: ignore[arg-type]
    return cell


def soft_scores(root: Path) -> str:
    """The soft card's scores: the averaged checkpoint, each file shipped since, and the model it replaced."""
    r = Records(root)
    rows = [Row("fp32 (the averaged checkpoint)", r["results/soft_scst_more_averaged"]),
            Row("fp16 (the file shipped until 2026-12-05)", r["grounding:shipped_soft"]),
            Row("**int8 (this file)**", r["card:flickr8k_soft"]),
            Row("the previous `flickr8k_soft` (fp16)", r["results/soft_scst"])]
    return table("weights", scores(*B5, digits=2), rows)


def hard_scores(root: Path) -> str:
    """The hard card's scores beside its float16 file's, the soft default's and the hard model it replaced."""
    r = Records(root)
    columns = [*scores(*B5), ("words", num("vocabulary", 0)), ("distinct captions", pct("distinct_captions"))]
    rows = [Row("**flickr8k_hard (this file, int8)**", r["card:flickr8k_hard"]),
            Row("flickr8k_hard in float16", r["grounding:hard_pointing"]),
            Row("`flickr8k_soft` (soft decoding)", r["grounding:shipped_soft"]),
            Row("the previous `flickr8k_hard` (from the unsupervised soft model, int8)",
                r["cards/flickr8k_hard_int8_previous"])]
    return table("model", columns, rows)


def hard_boxes(root: Path) -> str:
    """Where each model's read cell (soft: α's arg-max) lands on the words Flickr30k Entities boxes."""
    r = Records(root)
    g, t = "boxes.generated", "boxes.teacher_forced"
    columns = [("its captions: read cell in the boxes (centre cell)",
                beside(pct(f"{g}.pointing"), pct(f"{g}.centre_pointing"))),
               ("weight in the boxes (uniform, mean map)",
                beside(num(f"{g}.inside", 3), num(f"{g}.uniform", 3), num(f"{g}.mean_map", 3))),
               ("teacher-forced head nouns: in the boxes (centre cell)",
                beside(pct(f"{t}.pointing"), pct(f"{t}.centre_pointing")))]
    rows = [Row("**flickr8k_hard (int8)**", r["card:flickr8k_hard"], bold=(columns[0][0],)),
            Row("`flickr8k_soft`", r["grounding:shipped_soft"]),
            # the previous model's box figures are its float16 file's (its int8 file was evaluated without boxes)
            Row("the previous `flickr8k_hard`", r["grounding:shipped_hard"])]
    return table("model", columns, rows)


def hard_mirror(root: Path) -> str:
    """How the hard card's models move their attention, and whether it follows a mirrored photo."""
    r = Records(root)
    columns = [("cells / caption", num("cells_per_caption", 2)), ("cell changes", pct("cell_changes")),
               ("α entropy", num("alpha_entropy", 3)), ("α follows the flip", pct("mirror_follow")),
               ("read columns mirror", pct("columns_mirror")), ("stay", pct("columns_stay"))]
    rows = [Row("**flickr8k_hard (int8)**", r["card:flickr8k_hard"]),
            Row("flickr8k_hard in float16", r["cards/flickr8k_hard_float16_mirror"]),
            Row("`flickr8k_soft` (α's arg-max cell)", r["grounding:shipped_soft"]),
            Row("the previous `flickr8k_hard`", r["cards/flickr8k_hard_int8_previous"])]
    return table("model", columns, rows)


def grounded_scores(root: Path) -> str:
    r = Records(root)
    # the float16 file's figures: its run's record (the checkpoint it was exported from), to the digits shown
    rows = [Row("**int8 (this file)**", r["card:flickr8k_grounded"]),
            Row("float16 (shipped until 2026-12-05)", r["grounding:soft_grounded_scst"])]
    return table("weights", scores("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D"), rows)


def grounded_boxes(root: Path) -> str:
    """Where flickr8k_grounded looks: its own captions' boxed words and the references' boxed phrases, each with
    the same words' baselines (and the float16 file's figures beside the int8 file's)."""
    r = Records(root)
    int8, fp16 = r["card:flickr8k_grounded"], r["grounding:soft_grounded_scst"]
    g, t = "boxes.generated", "boxes.teacher_forced"

    def share(record: Record, key: str) -> str:
        return pct(key)(record) or ""

    def weight(record: Record, key: str) -> str:
        return num(key, 3)(record) or ""

    peak, inside = "peak cell in the boxes", "attention inside the boxes"
    rows = [Row(f"{figure(int8, f'{g}.words'):,} boxed words of its own captions", None,
                (peak, f"**{share(int8, f'{g}.pointing')}** (float16: {share(fp16, f'{g}.pointing')} of "
                       f"{figure(fp16, f'{g}.words'):,})",
                 f"centre cell {share(int8, f'{g}.centre_pointing')}; own mean map "
                 f"{share(int8, f'{g}.mean_map_pointing')}")),
            Row("", None, (inside, f"{weight(int8, f'{g}.inside')} (float16: {weight(fp16, f'{g}.inside')})",
                           f"uniform map {weight(int8, f'{g}.uniform')}; own mean map "
                           f"{weight(int8, f'{g}.mean_map')}")),
            Row(f"{figure(int8, f'{t}.words'):,} boxed phrases of the references, read teacher-forced", None,
                (peak, share(int8, f"{t}.pointing"), f"centre cell {share(int8, f'{t}.centre_pointing')}")),
            Row("", None, (inside, weight(int8, f"{t}.inside"), f"uniform map {weight(int8, f'{t}.uniform')}"))]
    return table("words", [("figure", None), ("this model", None), ("the same words' baseline", None)], rows)


TABLES = [
    Section("card-soft-scores", card("flickr8k_soft"), soft_scores),
    Section("card-hard-scores", card("flickr8k_hard"), hard_scores),
    Section("card-hard-boxes", card("flickr8k_hard"), hard_boxes),
    Section("card-hard-mirror", card("flickr8k_hard"), hard_mirror),
    Section("card-grounded-scores", card("flickr8k_grounded"), grounded_scores),
    Section("card-grounded-boxes", card("flickr8k_grounded"), grounded_boxes),
]
