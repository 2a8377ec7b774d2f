"""scripts/same_floats.py, the before/after check of a refactor: what counts as a difference."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("same_floats", REPO / "scripts" / "same_floats.py")
same_floats = importlib.util.module_from_spec(spec)
spec.loader.exec_module(same_floats)


def test_any_float_that_moves_is_a_difference_and_times_are_not():
    before = {"epoch": 1, "train_loss": 3.25, "CIDEr-D": 41.0, "time_s": 300.1, "items_per_s": 95.0,
              "per_word": [{"alpha_max": 0.5}]}
    after = {**before, "time_s": 290.0, "items_per_s": 99.0}
    assert same_floats._differences(before, after) == []
    moved = {**after, "train_loss": 3.2500000000000004, "per_word": [{"alpha_max": 0.51}]}
    assert same_floats._differences(before, moved) == [".per_word[0].alpha_max: 0.5 -> 0.51",
                                                       ".train_loss: 3.25 -> 3.2500000000000004"]


def test_a_figure_only_one_side_reports_counts_unless_neither_measured_it():
    assert same_floats._differences({"baseline": None, "lr": 1e-3}, {"lr": 1e-3}) == []
    assert same_floats._differences({"baseline": -29.5, "lr": 1e-3}, {"lr": 1e-3}) == [".baseline: only before"]
    assert same_floats._differences({"lr": 1e-3}, {"lr": 1e-3, "xe": 2.0}) == [".xe: only after"]


def test_the_bench_compares_every_rate_bench_py_reports():
    result = {"matmul_gflops": 150.0, "configs": {"F8K": {"train_caps_per_s": 95.5, "decode_images_per_s": 90,
                                                           "train_s": 3.0}}}
    assert same_floats._rates(result) == {".configs.F8K.train_caps_per_s": 95.5,
                                          ".configs.F8K.decode_images_per_s": 90.0}
