"""Evaluation: decode a split with a model and score it.

    split.py     evaluate_model (`captioner evaluate`, the demo), format_table; decode_batches / decode_reads, the
                 decode loop behind it and training's validation; grounding over a split, the mirror check
    metrics.py   caption metrics (pycocoevalcap), diversity, attention grounding, sharpness, movement, mirror figures
    results.py   COCO-format results files
    score.py     score a results file (`captioner score`)
"""
