"""Decode a split and score it: ``evaluate_model``, which `captioner evaluate` (captioner/commands/evaluate.py),
the demo and the tests run, and ``format_table``, its report. ``decode_batches`` / ``decode_reads`` are the one
decode loop behind it and training's per-epoch validation (captioner/training/validation.py): both pick and report
checkpoints by what this loop decodes, so they decode the same words with the same ``DecodeOptions``.

Caption metrics are pycocoevalcap's (BLEU-1..4, METEOR, ROUGE-L, CIDEr-D) on the raw
reference captions, reported on the 0-100 scale with the split, beam width and
decoding mode beside them. Attention grounding (captioner/evaluation/regions.py: the shapes boxes, COCO masks)
is reported beside them when the data set knows object regions, and the box figures on Flickr30k Entities
(``box_grounding``, evaluation/grounding.py) with ``entities``.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch
from tqdm import tqdm

from captioner.data.datasets import MIRROR_SUFFIX, pad_batch
from captioner.data.images import check_jpeg_quality
from captioner.decoding.options import DecodeOptions
from captioner.evaluation.grounding import BoxGrounding, format_grounding
from captioner.evaluation.metrics import (
    attention_movement,
    attention_sharpness,
    caption_diversity,
    caption_scores,
    cells_of,
    cells_read,
    mirror_following,
    resolve_tokenizer,
)
from captioner.evaluation.regions import word_shares
from captioner.evaluation.score import score_rows
from captioner.evaluation.word_classes import WordClassTally, format_word_classes
from captioner.models.attention import ONE_CELL_MODES
from captioner.models.ensemble import describe_ensemble


class _Grounding:
    """Attention grounding over a split, averaged over words: every referring word of every caption counts
    once. Its grounding sources (evaluation/regions.py): the shapes records' objects, and with ``instances`` COCO's
    instance masks; a record is scored by the first source whose regions name one of its words.

    A word that names an object kind of the data set (any record's object name) but no object of its
    image scores 0. In hard attention's argmax/sample decoding a word read one cell (``locations``):
    that cell is scored, not the distribution it was drawn from.
    """

    def __init__(self, records: Sequence, grid_hw: tuple[int, int], instances: str | None) -> None:
        from captioner.names import GROUNDING_SOURCES

        self.sources = [GROUNDING_SOURCES.get("shapes").for_records(records)]
        if instances:
            self.sources.append(GROUNDING_SOURCES.get("coco")(instances))
        self.grid_hw = grid_hw
        self.shares: list[float] = []
        self.images = 0  # images with at least one referring word

    def add(self, record: Any, words: list[str], alphas: np.ndarray, locations: list[int] | None) -> None:
        if locations is not None:
            alphas = cells_read(locations[: len(words)], alphas.shape[1])  # (n_words, L)
        for source in self.sources:
            regions = source.word_regions(record, words)
            if any(region is not None for region in regions):
                shares = word_shares(regions, np.asarray(alphas)[: len(words)], self.grid_hw)
                self.images += bool(shares)
                self.shares += shares
                return

    @property
    def mean(self) -> float | None:
        return float(np.mean(self.shares)) if self.shares else None


def _grid_batches(model, records: Sequence, batch_size: int, cache: Any, bar: Any, jpeg_quality: int | None = None,
                  like_cache: bool = False) -> Iterator[tuple[Sequence, torch.Tensor]]:
    """(records, prepared grid (B, L, D)) per batch: from the feature cache when given, else the images,
    each re-encoded as a JPEG of ``jpeg_quality`` first when that is given. ``like_cache``: images are encoded to
    the rows the cache would hold, rounded to its float16, before the rest of the model (what the mirror check
    needs when the originals came from the cache: one preparation for both sides)."""
    from captioner.data.images import load_image, reencode_jpeg

    def image(record):
        loaded = load_image(record.path)
        return loaded if jpeg_quality is None else reencode_jpeg(loaded, jpeg_quality)

    for start in range(0, len(records), batch_size):
        batch = records[start : start + batch_size]
        if cache is not None:
            inputs = torch.from_numpy(cache.get_batch([r.image_id for r in batch]))  # (B, L, D_backbone) fp16
        else:  # a mirrored copy (data.datasets.mirrored_records) is flipped after the transform, as in training
            inputs = torch.stack([_flipped(model.transform(image(r)), getattr(r, "mirrored", False))
                                  for r in batch])  # (B, 3, S, S)
        inputs = inputs.to(model.device).float()  # cached rows cross as float16, widened there (exact)
        if cache is None and like_cache:
            rows = model.encoder.cache_features(inputs).half().float()  # (B, l, C): what the cache would serve
            yield batch, model.prepare_rows(rows)
        else:
            yield batch, model.grid_from(inputs, images=cache is None)
        bar.update(len(batch))


def _flipped(image: torch.Tensor, mirrored: bool) -> torch.Tensor:
    return image.flip(-1) if mirrored else image


@torch.no_grad()
def _check_reencoding(jpeg_quality: int | None, cache: Any) -> None:
    """A re-encoding request is a valid JPEG quality, and never meets the cache (its grids are the originals')."""
    if jpeg_quality is not None:
        check_jpeg_quality(jpeg_quality)
        if cache is not None:
            raise ValueError(f"jpeg_quality={jpeg_quality} re-encodes the images, but the feature cache holds the "
                             f"grids of the original files: pass cache=None")


# evaluate_model's per-photo keys: the captions, and the box figures of each photo's caption (write_results'
# "boxes"); left out of the printed and stored summaries
PER_PHOTO_BOXES = "box_photos"
PER_PHOTO = ("predictions", PER_PHOTO_BOXES)


def summary(result: dict) -> dict:
    """An evaluation's figures without its per-photo entries (PER_PHOTO)."""
    return {k: v for k, v in result.items() if k not in PER_PHOTO}


def evaluate_model(
    model,
    records: Sequence,
    options: DecodeOptions | None = None,
    tokenizer: str = "auto",
    batch_size: int = 32,
    cache=None,
    meteor: bool = True,
    metrics: Sequence[str] | None = None,
    progress: bool = True,
    instances: str | None = None,
    jpeg_quality: int | None = None,
    mirror_check: bool = False,
    entities: Any = None,
) -> dict:
    """Decode ``records`` (ImageRecords) and score them.

    Grids come from ``cache`` (a FeatureCache of backbone grids) when given, else from the
    images through the model's encoder. ``jpeg_quality`` (1..95) re-encodes every image as a JPEG of
    that quality before the encoder sees it (then no cache: its grids came from the original files).

    Returns a dict with ``scores`` (0-100, None where a metric is unavailable), the captions'
    ``vocabulary`` and ``distinct_captions`` share (metrics.caption_diversity), ``grounding`` (averaged
    over referring words; None when no record has object regions), the attention's sharpness
    (``alpha_max``, ``alpha_entropy``: see metrics.attention_sharpness), the ``predictions`` per image id,
    the tokenizer the scores used and the decoding settings (``options``, default the model's: its config's
    eval section; ``jpeg_quality`` is None when the images were not re-encoded).
    ``mirror_check`` also captions every photo mirrored left-right (encoded from the image) and adds
    metrics.mirror_following's figures: whether attention follows the objects or stays where it was.
    ``entities`` (data.entities.Entities of these photos) adds ``boxes``: the grounding figures on Flickr30k
    Entities boxes of the generated captions and of the annotated references read teacher-forced
    (evaluation/grounding.py).
    """
    _check_reencoding(jpeg_quality, cache)
    model.eval()
    grounding = _Grounding(records, model.grid_hw, instances)
    options = options or model.decode_options  # generate checks them against the model
    tokenizer = resolve_tokenizer(tokenizer)
    bar = tqdm(total=len(records), desc=f"decode (beam {options.beam})", unit="img", disable=not progress,
               leave=False)
    predictions, reads = decode_reads(model, _grid_batches(model, records, batch_size, cache, bar, jpeg_quality),
                                      options, grounding)
    bar.close()
    boxes = None
    if entities is not None:
        boxes = box_grounding(model, records, reads, options, entities, batch_size, cache, progress)
    mirror = {}
    if mirror_check:
        mirror = mirror_figures(model, records, reads, options, batch_size, progress, jpeg_quality,
                                cached_originals=cache is not None)
    references = {r.image_id: list(r.raw) for r in records}
    scores = caption_scores(predictions, references, meteor=meteor, tokenizer=tokenizer,
                            **({"metrics": metrics} if metrics else {}))
    return {
        "scores": scores,
        "tokenizer": tokenizer,
        **caption_diversity(predictions),
        **attention_sharpness([alphas for _, alphas, _ in reads.values()]),
        **attention_movement([cells for _, _, cells in reads.values()]),
        **mirror,
        "grounding": grounding.mean,
        "grounding_words": len(grounding.shares),
        "grounding_words_images": grounding.images,
        **({"boxes": boxes, PER_PHOTO_BOXES: boxes.pop(PER_PHOTO_BOXES)} if boxes is not None else {}),
        "n_images": len(records),
        "grids": "feature cache" if cache is not None else "images",
        "jpeg_quality": jpeg_quality,
        "beam_size": options.beam,
        "max_length": options.max_length,
        "length_penalty": options.length_penalty,
        "forbid_unk": options.forbid_unk,
        "block_trigrams": options.block_trigrams,
        "beam_groups": options.beam_groups,
        "diversity": options.diversity,
        "attention_mode": options.attention_mode,
        "predictions": predictions,
    }


@torch.no_grad()
def decode_batches(model, batches: Iterable[tuple[Sequence, torch.Tensor]], options: DecodeOptions
                   ) -> Iterator[tuple[Any, Any, list[str]]]:
    """Decode (records, grid (B, L, D)) batches with an ``api.ImageCaptioner``: yields (record, best
    hypothesis, words) per image, in float32 for validation and evaluate alike (training's mixed precision stops
    at the teacher-forced loss: best.pt is picked on the captions evaluate reports). ``<unk>`` is kept unless
    ``options`` forbid it."""
    for records, grid in batches:
        hyps = model.generate(grid, options)
        for record, per_image in zip(records, hyps):
            best = per_image[0]
            yield record, best, model.words(best)


def decode_reads(model, batches: Iterator, options: DecodeOptions, grounding: _Grounding | None = None
                 ) -> tuple[dict[str, str], dict[str, tuple]]:
    """Decode (records, grid) batches with ``options`` (decode_batches): the caption per image id, and per image id
    with attention maps its (words, alphas (n_words, L), cells (n_words,): cells_of). What evaluate_model, the mirror
    check and training's per-epoch validation decode with."""
    predictions: dict[str, str] = {}
    reads: dict[str, tuple] = {}
    for record, best, words in decode_batches(model, batches, options):
        predictions[record.image_id] = " ".join(words)
        if best.alphas is None:
            continue
        alphas = best.alphas[: len(words)].float().cpu().numpy()  # (n_words, L)
        reads[record.image_id] = (words, alphas, cells_of(alphas, best.locations))
        if grounding is not None:
            grounding.add(record, words, alphas, best.locations)
    return predictions, reads


def teacher_forced_mode(mode: str) -> str:
    """How the references are read teacher-forced for the box figures: as the model decodes, except that a sampled
    read becomes the arg-max cell (the figures should not depend on a draw)."""
    return "argmax" if mode == "sample" else mode


def box_grounding(model, records: Sequence, reads: dict[str, tuple], options: DecodeOptions, entities: Any,
                  batch_size: int, cache: Any = None, progress: bool = False, metrics: Sequence[str] | None = None,
                  teacher_forced: bool = True) -> dict:
    """The box figures (evaluation/grounding.py) of the decoded captions ``reads`` (image id -> (words, alphas,
    cells)) and, with ``teacher_forced``, of every annotated reference of ``records``' photos read teacher-forced by
    ``model``: what `captioner evaluate --entities` and training's validation (the pointing ``metrics`` of the
    greedy captions only) both report."""
    mode = teacher_forced_mode(options.attention_mode)
    grounding = BoxGrounding(entities, model.grid_hw, one_cell=mode in ONE_CELL_MODES, metrics=metrics)
    classes = WordClassTally()  # which words, by class, and how each class attends (evaluation/word_classes.py)
    for image_id, (words, alphas, cells) in reads.items():
        grounding.add_generated(image_id, words, alphas, cells if options.attention_mode in ONE_CELL_MODES else None)
        if (photo := entities.get(image_id)) is not None and len(words):
            classes.add(photo, words, alphas)
    annotated = [r for r in records if entities.get(r.image_id) is not None] if teacher_forced else []
    if hasattr(model, "decoder") and annotated:  # an ensemble has no one teacher-forced map
        bar = tqdm(total=len(annotated), desc="read annotated references", unit="img", disable=not progress,
                   leave=False)
        max_length = model.config.data.max_length
        with torch.no_grad():
            for batch, grid in _grid_batches(model, annotated, batch_size, cache, bar):
                photos, rows, captions = [], [], []
                for b, record in enumerate(batch):
                    photo = entities.get(record.image_id)
                    for k, sentence in enumerate(photo.sentences):
                        photos.append((photo, k))
                        rows.append(b)
                        captions.append(model.vocab.encode(sentence.tokens, max_length=max_length))
                if not captions:
                    continue
                padded = pad_batch(grid, captions, rows, pad_id=model.vocab.pad_id)
                grid_rows = grid.index_select(0, padded.indices.to(grid.device))  # (N, L, D)
                out = model(grid_rows, padded.captions.to(grid.device), padded.lengths.to(grid.device),
                            attention_mode=mode)
                alphas = out.alphas.float().cpu().numpy()  # (N, T-1, L): row t predicts token t
                for (photo, k), a in zip(photos, alphas):
                    grounding.add_teacher_forced(photo, k, a, max_length=max_length)
        bar.close()
    return {**grounding.figures(), "word_classes": classes.figures(), PER_PHOTO_BOXES: grounding.per_photo}


def mirror_figures(model, records: Sequence, reads: dict[str, tuple], options: DecodeOptions, batch_size: int,
                   progress: bool = False, jpeg_quality: int | None = None, cached_originals: bool = False) -> dict:
    """Caption the left-right mirror of every photo (from its image: flipped after the transform, as training's
    data.mirror copies) with the same settings, and compare its attention with the original's
    (metrics.mirror_following). ``reads``: image id -> (words, alphas, cells) of the original photos'
    captions; ``options``: how they were decoded (the per-epoch validation's are greedy). ``cached_originals``: the
    originals' grids came from the float16 feature cache, so the mirrored photos' are rounded the same way (else a
    cell read by arg-max could move for the rounding alone)."""
    from captioner.data.datasets import mirrored_records

    if not reads:
        raise ValueError("mirror_check: this model's decoding gives no attention maps to compare")
    mirrored = mirrored_records([r for r in records if r.image_id in reads])
    bar = tqdm(total=len(mirrored), desc="decode mirrored photos", unit="img", disable=not progress, leave=False)
    batches = _grid_batches(model, mirrored, batch_size, None, bar, jpeg_quality, like_cache=cached_originals)
    _, mirrored_reads = decode_reads(model, batches, options)
    bar.close()
    pairs = [(*reads[key.removesuffix(MIRROR_SUFFIX)], *value) for key, value in mirrored_reads.items()]
    return mirror_following(pairs, model.grid_hw)


def cached_grids(model, records: Sequence, data: Any = None) -> Any:
    """The feature cache of the model's frozen backbone when it holds every record's grid (the same
    fp16 grids training validated on, and no CNN to run), else None: encode the images. ``data``: the data
    section the records were read by (default the model's; ``evaluate --data-root`` gives another root)."""
    from captioner.data.features import cache_dir_for, open_complete_cache

    data = model.config.data if data is None else data
    if not data.use_cache:
        return None
    fingerprint = model.encoder.cache_fingerprint()
    return open_complete_cache(cache_dir_for(data, fingerprint), records, fingerprint)


def format_table(result: dict, split: str) -> str:
    head = (f"split={split}  images={result['n_images']}  beam={result['beam_size']}  "
            f"length_penalty={result['length_penalty']:g}  max_length={result['max_length']}  "
            f"decoding={result['attention_mode']}  grids from {result['grids']}"
            + ("  <unk> forbidden" if result.get("forbid_unk") else "")
            + ("  repeated trigrams blocked" if result.get("block_trigrams") else "")
            + (f"  inputs re-encoded as JPEG quality {result['jpeg_quality']}" if result.get("jpeg_quality") else ""))
    ensemble = result.get("ensemble")  # set by `captioner evaluate` for several checkpoints
    rows = [head] + ([describe_ensemble(**ensemble)] if ensemble else []) + score_rows(result, head)
    rows.append(f"vocabulary: {result['vocabulary']} distinct words")
    rows.append(f"distinct captions: {100 * result['distinct_captions']:.1f} %")
    g = result["grounding"]
    rows.append(f"{'grounding':<10} {'n/a (no regions)' if g is None else f'{100 * g:6.2f}'}"
                + ("" if g is None else "  (% of a referring word's attention inside its object)"))
    if result.get("alpha_max") is not None:
        rows.append(f"{'alpha max':<10} {result['alpha_max']:6.3f}  (mean over words of max_i alpha_i; "
                    f"uniform = {1 / result['locations']:.3f})")
        rows.append(f"{'alpha ent':<10} {result['alpha_entropy']:6.3f}  (mean normalised entropy H(alpha) / "
                    f"log L; uniform = 1)")
    if result.get("cells_per_caption") is not None:
        read = "the cell read" if result["attention_mode"] in ONE_CELL_MODES else "arg-max alpha's cell"
        rows.append(f"{'cells':<10} {result['cells_per_caption']:6.2f}  (distinct grid cells per caption; {read})")
        if result.get("cell_changes") is not None:
            rows.append(f"{'moves':<10} {100 * result['cell_changes']:6.1f}  (% of consecutive words whose cell "
                        f"changes)")
    if result.get("boxes"):
        rows += format_grounding(result["boxes"])
        if result["boxes"].get("word_classes"):
            rows += format_word_classes(result["boxes"]["word_classes"])
    return "\n".join(rows + _mirror_rows(result))


def _pct(value: float | None) -> str:
    return "   n/a" if value is None else f"{100 * value:6.1f}"


def _mirror_rows(result: dict) -> list[str]:
    """format_table's mirror-check lines (none when the check did not run)."""
    if "mirror_words" not in result:
        return []
    return [
        f"{'mirror':<10} {_pct(result['mirror_follow'])}  (% of {result['mirror_informative']} content words, of "
        f"{result['mirror_words']} both captions use, whose alpha on the mirrored photo overlaps the original's "
        f"flipped more than unflipped)",
        f"{'overlap':<10} {result['mirror_overlap_flipped'] or 0:6.3f} flipped, "
        f"{result['mirror_overlap_unflipped'] or 0:.3f} unflipped  (mean histogram intersection)",
        f"{'columns':<10} {_pct(result['columns_mirror'])} mirror, {_pct(result['columns_stay'])} stay  (% of "
        f"{result['mirror_columns']} words off the centre column; the cell read, or alpha's arg-max)",
    ]
