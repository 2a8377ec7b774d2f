"""docs/training-options.md's tables (captioner/reports/options.py): the rows' figures as the page shows them."""

from __future__ import annotations

from captioner.reports import options as option_runs


def _row(cider: float, pointing: float, wall: float, trained: bool = True) -> dict:
    return {"scores": {"BLEU-4": 20.04, "METEOR": 20.38, "ROUGE-L": 45.3, "CIDEr-D": cider},
            "boxes": {"generated": {"pointing": pointing, "centre_pointing": 0.65, "inside": 0.55, "uniform": 0.372,
                                    "mean_map": 0.414}},
            "cells_per_caption": 6.45, "cell_changes": 0.764, "alpha_max": 0.162,
            "mirror_follow": 0.976, "columns_mirror": 0.536, "columns_stay": 0.094, "train_wall_s": wall,
            "train_commands": ["captioner train --config c.yaml"] if trained else [],
            "evaluate_command": "captioner evaluate --checkpoint m.pt"}


def test_each_option_row_states_its_cider_against_the_control_and_its_box_figures():
    rows = {"xe_control": _row(50.64, 0.563, 2915.0), "label_smoothing_0.1": _row(52.0, 0.60, 2400.0)}
    text = option_runs.format_report(rows, shipped=None)
    smoothing = next(line for line in text.splitlines() if line.startswith("| label smoothing 0.1 |"))
    assert "| 52.00 (+1.36) |" in smoothing
    assert "| 60.0 % (65.0 %) / 0.550 (0.372, 0.414) | - | 6.45, 76.4 %, 0.162 |" in smoothing  # no IoU figures
    assert smoothing.endswith("| 40 min 0 s |")
    control = next(line for line in text.splitlines() if line.startswith("| `xe_control`"))
    assert "| 50.64 |" in control  # the control is not compared with itself
    assert "whole recipe" not in text  # Up-Down's recipe table waits for its row


def test_up_down_is_compared_with_the_shipped_soft_model_once_its_recipe_is_done():
    rows = {"updown": _row(55.86, 0.70, 9000.0)}
    text = option_runs.format_report(rows, shipped=_row(57.36, 0.654, 0.0, trained=False))
    recipe = text.split("whole recipe", 1)[1]
    assert "| 57.36 | " in recipe and "| shipped |" in recipe
    assert "| 55.86 (-1.50) |" in recipe


def test_up_downs_probes_each_state_their_factor_the_greedy_epoch_and_the_words():
    """The collapse probes: one SCST epoch each, the greedy validation CIDEr-D after it and the training reward (from
    the row's last_stage_epochs), beam 3, the words and distinct captions; the cross-entropy stage first (its last
    epoch's greedy figure); '-' for a row written before the epochs were kept."""
    xe = {**_row(48.67, 0.504, 3177.0), "vocabulary": 232, "distinct_captions": 0.837,
          "last_stage_epochs": [{"epoch": 7, "CIDEr-D": 42.1}, {"epoch": 8, "CIDEr-D": 43.94}]}
    probe = {**_row(40.84, 0.55, 410.0), "vocabulary": 104, "distinct_captions": 0.399,
             "last_stage_epochs": [{"epoch": 1, "CIDEr-D": 40.04, "train_reward": 0.6123}]}
    old = _row(47.0, 0.55, 400.0)  # a row written before the epochs were kept
    old.update(vocabulary=150, distinct_captions=0.6)
    text = option_runs.format_report({"updown_xe": xe, "updown_probe_base": probe, "updown_probe_lr": old}, None)
    table = text.split("| Up-Down, one SCST epoch", 1)[1].splitlines()
    assert table[2] == ("| the cross-entropy stage (`updown_xe`), where they start | 43.9 | - | 20.0 / 20.4 / 48.67 | "
                        "232 | 83.7 % | - |")
    assert table[3] == ("| as `flickr8k_updown_scst` (lr 1e-4, no XE term, mean baseline) | 40.0 | 0.612 | "
                        "20.0 / 20.4 / 40.84 | 104 | 39.9 % | 6 min 50 s |")
    assert table[4].startswith("| lr 5e-5 | - | - | 20.0 / 20.4 / 47.00 | 150 | 60.0 % |")
    assert "Up-Down, one SCST epoch" not in option_runs.format_report({"updown_xe": xe}, None)


def test_the_iou_figures_stand_beside_the_whole_photos_and_the_centre_cells():
    row = _row(52.0, 0.60, 2400.0)
    figures = {"accuracy": 0.194, "f1_all": 0.056, "f1_loc": 0.301}
    row["boxes"]["localization"] = {
        "teacher_forced": {"accuracy": 0.265, "accuracy_words": 0.347},
        "generated": {"f1_all": 0.067, "f1_loc": None},  # None: no class both named and annotated
        "baselines": {"whole_photo": figures, "centre_cell": {"accuracy": 0.003, "f1_all": 0.0, "f1_loc": 0.002}}}
    line = next(line for line in option_runs.format_report({"scheduled_sampling": row}, None).splitlines()
                if line.startswith("| scheduled sampling"))
    # no "vocabulary" in the figures: a row from before issue 71, marked as the project's earlier F1 variant
    assert "| 26.5 % (19.4 / 0.3 %) / 6.7 % (5.6 / 0.0 %) / - (30.1 / 0.2 %) † |" in line
