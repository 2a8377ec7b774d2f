"""What the commands share of their arguments: value types that refuse out-of-range numbers, so argparse's
message names the flag, the decoding flags of `captioner caption`, `evaluate` and `serve`, and the scoring
flags of `captioner evaluate` and `score` (``add_scoring_flags``).

``parser.add_argument("--beam", type=int_at_least(1))`` turns ``--beam 0`` into
``error: argument --beam: must be >= 1, got 0`` (exit status 2) instead of a silent fallback or a slice
that drops images. Every command's numeric options use these.

``add_decode_flags`` gives a command the decoding flags, each defaulting to None: "not given", so
``decode_options`` merges into the command's own options (the model's config, its eval section, in the same way
for the three commands) only the flags given: the one place a command's flags meet its options. <unk> is the one
setting whose default is the command's, and the command says it by the options it starts from: captions for
people (caption, serve) start from ``model.caption_options`` (``DecodeOptions.for_people``: never <unk> unless
``--allow-unk``); evaluate from ``model.decode_options`` (<unk> kept unless ``--forbid-unk``: its scores then
match training's).
"""

from __future__ import annotations

import argparse
import math
from typing import Any, Callable

from captioner.decoding.options import DecodeOptionError, DecodeOptions
from captioner.evaluation.metrics import TOKENIZERS
from captioner.names import DECODING_MODES
from captioner.runtime import DEVICE_HELP, describe_device, resolve_device


def int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: an integer in [low, high] (no upper bound when ``high`` is None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bounds = f">= {low}" if high is None else f"in {low}..{high}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {value}")
        return value

    parse.__name__ = "integer"  # argparse's fallback message says "invalid integer value"
    return parse


def float_at_least(low: float) -> Callable[[str], float]:
    """An argparse ``type``: a finite float >= low."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or value < low:
            raise argparse.ArgumentTypeError(f"must be a finite number >= {low:g}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


def add_decode_flags(parser: argparse.ArgumentParser, n_best: bool = True, for_people: bool = True) -> None:
    """--beam, --n-best (when ``n_best``), --attention-mode, --max-length, --length-penalty,
    --block-trigrams / --no-block-trigrams, --beam-groups and --diversity (diverse beam search): every one unset
    (None) unless given; and the <unk> flag that turns the command's default around, also unset unless given:
    --allow-unk where its captions are ``for_people`` (its options start from ``DecodeOptions.for_people``), else
    --forbid-unk."""
    parser.add_argument("--beam", type=int_at_least(1), default=None,
                        help="beam width, 1 = greedy (default: the model's eval.beam_size)")
    if n_best:
        parser.add_argument("--n-best", type=int_at_least(1), default=None,
                            help="hypotheses kept per image, <= --beam")
    parser.add_argument("--attention-mode", choices=DECODING_MODES, default=None,
                        help="how attention reads while decoding: expectation (soft), or one cell per word, "
                             "argmax or sample (default: the model's eval.attention_mode)")
    parser.add_argument("--max-length", type=int_at_least(1), default=None,
                        help="most words per caption (default: the model's eval.max_length, or data.max_length)")
    parser.add_argument("--length-penalty", type=float_at_least(0.0), default=None,
                        help="beam ranking: score / length ** P (default: the model's eval.length_penalty)")
    parser.add_argument("--block-trigrams", action=argparse.BooleanOptionalAction, default=None,
                        help="never let a caption repeat a trigram (default: the model's eval.block_trigrams)")
    parser.add_argument("--beam-groups", type=int_at_least(1), default=None,
                        help="diverse beam search: the beams choose in this many groups (it divides --beam), "
                             "with --diversity (default 1: plain beam search)")
    parser.add_argument("--diversity", type=float_at_least(0.0), default=None,
                        help="diverse beam search's lambda: a group's penalty per beam of an earlier group that "
                             "chose the same word at that step (needs --beam-groups > 1)")
    if for_people:
        parser.add_argument("--allow-unk", dest="forbid_unk", action="store_false", default=None,
                            help="let captions contain <unk> (by default the search never chooses it)")
    else:
        parser.add_argument("--forbid-unk", action="store_true", default=None,
                            help="never choose <unk> while decoding (as `captioner caption` does); reported in "
                                 "the output")


def add_scoring_flags(parser: argparse.ArgumentParser) -> None:
    """--tokenizer and --no-meteor: how `captioner evaluate` and `captioner score` score captions."""
    parser.add_argument("--tokenizer", choices=("auto", *TOKENIZERS), default="auto",
                        help="tokenizer for scoring: ptb (coco-caption, needs Java), treebank (nltk, no Java), "
                             "simple; auto = ptb when Java is present, else treebank")
    parser.add_argument("--no-meteor", action="store_true", help="skip METEOR (it starts a Java process)")


def decode_options(parser: argparse.ArgumentParser, args: argparse.Namespace,
                   merge: Callable[..., DecodeOptions]) -> DecodeOptions:
    """The command's options with every decoding flag of ``add_decode_flags`` that was given: ``merge(**flags)``,
    the command's own options' ``replace_given`` (``model.caption_options.replace_given`` for captions for
    people, ``model.decode_options.replace_given`` for scores; the page's: serving.server.page_options). A bad
    combination (--n-best above --beam) exits through ``parser.error`` naming the flags."""
    flags = {"beam": args.beam, "n_best": getattr(args, "n_best", None), "attention_mode": args.attention_mode,
             "max_length": args.max_length, "length_penalty": args.length_penalty,
             "block_trigrams": args.block_trigrams, "forbid_unk": args.forbid_unk,
             "beam_groups": args.beam_groups, "diversity": args.diversity}
    try:
        return merge(**{k: v for k, v in flags.items() if v is not None})
    except DecodeOptionError as err:
        parser.error(f"argument --{err.setting.replace('_', '-')}: {err.detail}")


def add_device_flag(parser: argparse.ArgumentParser) -> None:
    """``--device``, default auto (CUDA when present), as every command has it (runtime.resolve_device)."""
    parser.add_argument("--device", default="auto", help=DEVICE_HELP)


def chosen_device(command: str, requested: str) -> Any:
    """The device ``--device`` names (runtime.resolve_device; DeviceError, a ValueError, names the flag), said on
    stderr so a run on the CPU of a machine with a GPU, or the other way round, is never silent. The one resolution
    of a command's device: the torch.device returned goes down to ``api.load_captioner``, which takes it as it is."""
    import sys

    device = resolve_device(requested, "--device")
    print(f"captioner {command}: {describe_device(device, requested)}", file=sys.stderr)
    return device


def use_tf32(model: Any) -> None:
    """On CUDA, TF32 as the model's config says (eval.tf32, default on)."""
    if model.device.type == "cuda":
        from captioner.runtime import enable_tf32

        enable_tf32(model.config.eval.tf32)
