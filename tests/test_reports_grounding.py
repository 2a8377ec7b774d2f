"""docs/grounding.md's tables (captioner/reports/grounding.py): the rule for a new default (issue 71, point 3, fixed
before its runs) and the probe table."""

from __future__ import annotations

from captioner.reports import grounding as grounding_runs


def _row(cider: float, meteor: float, pointing: float, centre: float, inside: float) -> dict:
    return {"scores": {"BLEU-4": 22.0, "METEOR": meteor, "CIDEr-D": cider},
            "boxes": {"generated": {"pointing": pointing, "centre_pointing": centre, "inside": inside}},
            "train_commands": ["captioner train --config c.yaml"], "evaluate_command": "captioner evaluate",
            "train_wall_s": 1016.0}


DEFAULT = _row(57.36, 20.5, 0.654, 0.654, 0.612)


def test_the_rule_names_each_miss_and_by_how_much():
    # pointing 75.0 against 64.4: +10.6, 1.4 short of +12; inside 0.664, 0.036 short; CIDEr-D 1.32 below (> 1.0);
    # METEOR 0.1 below: within 0.3
    verdict = grounding_runs.rule_verdict(_row(56.04, 20.4, 0.750, 0.644, 0.664), DEFAULT)
    assert verdict == ("misses: pointing +10.6 (needs +12: 1.4 short); inside 0.664 (needs 0.70: 0.036 short); "
                       "CIDEr-D -1.32 (at most -1)")
    assert grounding_runs.rule_verdict(_row(56.40, 20.2, 0.770, 0.644, 0.70), DEFAULT) == "qualifies"
    assert grounding_runs.rule_verdict(_row(57.0, 20.1, 0.80, 0.64, 0.75), DEFAULT) == \
        "misses: METEOR -0.40 (at most -0.3)"


def test_the_probe_table_gives_a_dash_where_a_figure_was_not_measured_and_the_interval_where_it_was():
    probe = _row(56.04, 20.4, 0.750, 0.644, 0.664)
    probe["vs_default"] = {"CIDEr-D": {"difference": -1.32, "low": -3.1, "high": 0.41},
                           "pointing - centre": {"difference": 9.9, "low": 6.5, "high": 13.2}}
    text = grounding_runs.format_probes({"shipped_soft": DEFAULT, "probe_ft_w10": probe})
    lines = text.splitlines()
    row = next(line for line in lines if line.startswith("| probe: the default then 2 SCST epochs (as its second"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:5] == ["22.0 / 20.4 / 56.04", "-1.32 [-3.10, +0.41]", "+10.6 (75.0, 64.4 %) [+9.9 [+6.5, +13.2]]",
                          "0.664"]
    assert cells[5:12] == ["-"] * 7 and cells[-1] == "16 min 56 s" and cells[-2].startswith("misses: pointing +10.6")
    default_row = next(line for line in lines if line.startswith("| shipped `flickr8k_soft`"))
    assert "| the default |" in default_row
