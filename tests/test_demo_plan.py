"""`captioner demo` (what `make demo` runs) says before it starts what it will do and about how long each part takes
(issue 72): the plan follows the config and the flags, and it is printed before anything runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from captioner.commands import demo
from captioner.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def _shapes(tmp_path: Path, *overrides: str):
    """The demo's own config (shapes.yaml) with its data in an empty folder: nothing drawn yet."""
    return load_config(demo.DEFAULT_CONFIG, [f"data.root={tmp_path / 'shapes'}", "train.run_dir=runs/demo", *overrides])


def test_the_plan_names_each_part_with_its_time_in_order(tmp_path):
    lines = demo.plan(_shapes(tmp_path), photos=True, reuse=False, meteor=True, n_captions=6)
    text = "\n".join(lines)
    steps = re.findall(r"\[(\d)/4\]", text)
    assert steps == sorted(steps) and steps[0] == "0" and "4" in steps
    assert "caption 5 photographs" in text and "3,400 images" in text and "12 epochs of 3,000 images" in text
    assert "caption 6 test images" in text and "METEOR" in text
    assert all(re.search(r"~\d+ (s|min)$", line) for line in lines[1:-1])  # every part has its time
    # 12 epochs at 36 s (docs/results.md's shapes row) are the longest part: about 7 of the 10 minutes
    assert "~7 min" in next(line for line in lines if "epochs" in line)
    assert lines[-1].startswith("  about 10 min in all")


def test_the_plan_follows_the_flags_and_what_is_there_already(tmp_path):
    (tmp_path / "shapes").mkdir()
    (tmp_path / "shapes" / "dataset_shapes.json").write_text("{}")  # drawn by an earlier run
    drawn = "\n".join(demo.plan(_shapes(tmp_path), photos=False, reuse=False, meteor=False, n_captions=2))
    assert "photographs" not in drawn and "METEOR" not in drawn and "caption 2 test images" in drawn
    assert "extract the grids of the shapes data (3,400 images) unless cached" in drawn and "draw" not in drawn
    reused = "\n".join(demo.plan(_shapes(tmp_path), photos=True, reuse=True, meteor=True, n_captions=6))
    assert "reuse the finished training in runs/demo" in reused and "epochs" not in reused
    capped = demo.plan(_shapes(tmp_path, "train.time_budget_s=60"), photos=False, reuse=False, meteor=False,
                       n_captions=6)
    assert any("at most 60 s" in line and line.endswith("~60 s") for line in capped)


def test_a_config_of_other_data_says_its_training_time_is_not_known(tmp_path):
    lines = demo.plan(load_config("my_photos"), photos=True, reuse=False, meteor=True, n_captions=6)
    assert any("30 epochs (time: depends on the data)" in line for line in lines)
    assert "besides training" in lines[-1]


def test_the_readme_quotes_the_plans_total():
    """The README's set-up section says about how long `make demo` takes: the plan's own total for the default."""
    readme = (ROOT / "README.md").read_text()
    said = re.search(r"about (\d+) minutes on two cores", readme)
    assert said, "the README does not say how long `make demo` takes"
    cfg = load_config(demo.DEFAULT_CONFIG, ["data.root=/nonexistent/shapes"])
    total = demo.plan(cfg, photos=True, reuse=False, meteor=True, n_captions=6)[-1]
    assert total.startswith(f"  about {said.group(1)} min in all"), total


class _Stop(Exception):
    pass


def test_the_demo_prints_its_plan_before_anything_runs(tmp_path, monkeypatch, capsys):
    def first_part(_out_dir):
        raise _Stop  # the photographs are the demo's first part

    monkeypatch.setattr(demo, "caption_photos", first_part)
    with pytest.raises(_Stop):
        demo.main(["--run-dir", str(tmp_path / "run"), "--set", f"data.root={tmp_path / 'shapes'}"])
    out = capsys.readouterr().out
    assert out.startswith("captioner demo: what it does") and "[0/4] caption 5 photographs" in out
    assert not (tmp_path / "shapes").exists() and not (tmp_path / "run" / "last.pt").exists()
