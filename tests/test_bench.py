"""scripts/bench.py at tiny sizes: every key is present and positive, the FLOP count matches the model.

Timings themselves are not asserted (the machine is shared); only that the functions run and report.
"""
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def load_bench():
    spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts" / "bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench"] = module  # dataclasses and pickling look the module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def one_thread():
    """Run the test on one intra-op thread (the bench functions are also passed 1), then restore."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield 1
    torch.set_num_threads(threads)


def test_caption_train_flops_counts_every_matmul_once():
    bench = load_bench()
    from captioner.models.decoders.show_attend_tell_fast import FastShowAttendTellDecoder

    V, D, E, H, A, L, S = 50, 24, 16, 20, 12, 9, 5
    dec = FastShowAttendTellDecoder(V, D, embed_dim=E, hidden_dim=H, attention_dim=A)
    per_image = 2 * (2 * D * H) + L * 2 * D * A  # f_init,h + f_init,c, keys projected once
    per_step = (2 * H * A + L * 2 * A  # query projection, v over L locations
                + 2 * H * 1  # scalar gate f_beta
                + 2 * (E + D + H) * 4 * H  # LSTM
                + 2 * H * E + 2 * D * E + 2 * E * V  # L_h, L_z, L_o
                + 2 * L * D)  # soft context
    assert bench.caption_train_flops(dec, L, S) == 3 * (per_image + S * per_step)
    assert bench.caption_train_flops(dec, L, S, soft=False) == 3 * (per_image + S * (per_step - 2 * L * D))


def test_train_worker_reports_positive_numbers(one_thread):
    bench = load_bench()
    alone = bench._train_worker("R7", ["soft"], quick=True, device="cpu", threads=one_thread, amp=False)["soft"]
    for key in ("train_caps_per_s", "train_step_s", "train_useful_gflop_per_caption", "peak_rss_mb",
                "train_frac_of_matmul_paired", "matmul_gflops_alongside"):
        assert alone[key] > 0, key
    # the paired fraction is a median of per-step ratios: near the ratio of the medians, not another quantity
    of_medians = alone["train_useful_gflop_per_caption"] * alone["train_caps_per_s"] / alone["matmul_gflops_alongside"]
    assert 0.5 < alone["train_frac_of_matmul_paired"] / of_medians < 2.0
    pair = bench._train_worker("R7", ["soft", "hard"], quick=True, device="cpu", threads=one_thread, amp=False)
    assert pair["hard"]["train_caps_per_s"] > 0 and pair["hard"]["hard_soft_time_ratio"] > 0
    assert "peak_rss_mb" not in pair["hard"]  # two models in one process: not one configuration's RSS
    versus = bench._train_worker("F8K", ["soft", "baseline"], quick=True, device="cpu", threads=one_thread, amp=False)
    assert versus["baseline"]["train_caps_per_s"] > 0 and versus["soft"]["train_speedup_vs_baseline"] > 0
    assert "train_useful_gflop_per_caption" not in versus["baseline"]  # counted for this project's model only


def test_decode_and_matmul_report_positive_numbers(one_thread):
    bench = load_bench()
    out = bench.bench_decode_one("R14", quick=True, threads=one_thread)
    decodes = ("greedy", "beam3", "beam5")
    assert set(out) == ({f"{d}_img_per_s" for d in decodes} | {f"baseline_{d}_img_per_s" for d in decodes}
                        | {f"{d}_speedup_vs_baseline" for d in decodes})
    assert all(v > 0 for v in out.values())
    assert set(bench.bench_decode_one("R14", quick=True, threads=one_thread, beams=(1,), with_baseline=False)) \
        == {"greedy_img_per_s"}
    assert bench.bench_matmul(threads=one_thread, repeats=1)["matmul_gflops"] > 0


def test_useful_flops_fraction_is_derived_from_the_same_run():
    bench = load_bench()
    results = {"matmul_gflops": 100.0, "R7": {"train_caps_per_s": 20.0, "train_useful_gflop_per_caption": 2.0}}
    bench.add_useful_flops(results)
    assert results["R7"]["train_useful_gflops"] == 40.0 and results["R7"]["train_frac_of_matmul"] == 0.4


def test_unknown_bench_or_config_names_the_valid_ones():
    bench = load_bench()
    with pytest.raises(ValueError, match="train"):
        bench.run_benches(["trian"], quick=True)
    with pytest.raises(ValueError, match="R14"):
        bench._sizes("R28", quick=False)
    with pytest.raises(ValueError, match="R14"):
        bench.run_benches(["decode"], quick=True, configs=["R28"])


@pytest.mark.slow
def test_cli_quick_json_has_every_figure_of_the_configuration_asked_for(one_thread, capsys):
    # main() in this process; its training workers are still `scripts/bench.py --train-worker` processes, three
    # per configuration, each starting torch (seconds apiece). --configs R7: the one checked here (R14 differs only in
    # its grid and feature width; F8K's worker runs in test_train_worker_reports_positive_numbers; at --quick sizes its
    # decode is R7's).
    bench = load_bench()
    assert bench.main(["--quick", "--json", "--only", "train,decode", "--configs", "R7", "--threads", "1"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert results["matmul_gflops"] > 0
    assert "R7" in results and not {"R14", "F8K"} & set(results)  # --configs: those asked for, no other
    r7 = results["R7"]
    for key in ("train_caps_per_s", "peak_rss_mb", "train_useful_gflops", "train_frac_of_matmul",
                "greedy_img_per_s", "beam3_img_per_s", "beam5_img_per_s"):
        assert r7[key] > 0, key
    hard = results["R7_hard"]
    assert hard["train_caps_per_s"] > 0 and hard["hard_soft_time_ratio"] > 0
    assert r7["train_speedup_vs_baseline"] > 0 and r7["beam5_speedup_vs_baseline"] > 0
    assert results["R7_baseline"]["train_caps_per_s"] > 0


def test_scst_bench_reports_the_reward_share(one_thread):
    row = load_bench().bench_scst(quick=True, threads=one_thread)["scst"]
    for key in ("scst_step_s", "scst_reward_s", "xe_step_s_same_captions", "scst_reward_build_s"):
        assert row[key] > 0, key
    assert 0 < row["scst_reward_share"] < 1
    assert row["scst_xe_time_ratio"] == pytest.approx(row["scst_step_s"] / row["xe_step_s_same_captions"])


# ---------------------------------------------------------------------------------------
# the fast paths the benchmark measures must decode exactly what the plain paths decode


@pytest.mark.parametrize("kind,scorer", [("soft", "additive"), ("soft", "dot"), ("hard", "bilinear"),
                                         ("key_value", "additive"), ("multi_head", "scaled_dot")])
def test_beam_search_with_per_image_memory_equals_expanded_memory(kind, scorer, one_thread):
    from captioner.decoding.options import DecodeOptions
    from captioner.decoding.search import beam_search
    from captioner.models.decoders.show_attend_tell_fast import FastShowAttendTellDecoder

    torch.manual_seed(0)
    dec = FastShowAttendTellDecoder(30, 12, embed_dim=16, hidden_dim=20, attention_dim=16, scorer=scorer,
                                attention=kind, heads=4 if kind == "multi_head" else 1).eval()
    with torch.no_grad():
        dec.out.bias[2] += 2.0  # <end> likelier: images finish at different steps and leave the batch
    grid = torch.randn(8, 6, 12)
    calls = []
    mode = "argmax" if kind == "hard" else "expectation"

    def step(tokens, state):
        calls.append(tokens.shape[0])
        log_probs, alpha, _, state = dec.step_with_location(tokens, state, attention_mode=mode)
        return log_probs, alpha, state

    with torch.no_grad():
        common = dict(batch_size=8, start_id=1, end_id=2)
        options = DecodeOptions(beam=3, n_best=2, max_length=8)
        plain = beam_search(step, dec.init_state(grid), options, **common)
        shared = beam_search(step, dec.init_state(grid), options, expand=dec.expand_state, **common)
    assert len(set(calls)) > 1, calls  # some images stopped early: per-image tensors were dropped too
    for a, b in zip(plain, shared):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert all(abs(x.score - y.score) < 1e-5 for x, y in zip(a, b))
        assert all(torch.allclose(x.alphas, y.alphas, atol=1e-6) for x, y in zip(a, b))
    state = dec.expand_state(dec.init_state(grid), 3)
    memory_rows = {s.shape[0] for s in state[2:]}
    assert memory_rows == {8}  # one row per image: every attention reads it for a group of beams


def test_the_ensemble_bench_reports_both_speeds(one_thread):
    """scripts/bench_ensemble.py at tiny sizes: one model and an ensemble of two decode, both rates positive."""
    spec = importlib.util.spec_from_file_location("bench_ensemble", ROOT / "scripts" / "bench_ensemble.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.bench_ensemble("F8K", members=2, beam=3, repeats=1, quick=True, threads=one_thread)
    assert result["members"] == 2 and result["beam"] == 3
    for key in ("single_captions_per_s", "ensemble_captions_per_s", "ensemble_time_ratio"):
        assert result[key] > 0, key
