"""The command dispatcher (captioner/cli.py) and the path expansion of `captioner caption`
(captioner/commands/caption.py)."""

import subprocess
import sys

from captioner.cli import COMMANDS, main
from captioner.commands.caption import expand_image_paths


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


def test_every_command_is_a_module_of_the_command_line_with_a_main():
    """The CLI layer owns every command (captioner/commands/NAME.py, main(argv) -> int); library modules hold
    none (tests/test_layering.py)."""
    import importlib

    for name, (module, _) in COMMANDS.items():
        assert module == f"captioner.commands.{name}"
        assert callable(importlib.import_module(module).main)


def test_unknown_command_names_valid_ones(capsys):
    assert main(["trian"]) == 2
    err = capsys.readouterr().err
    assert "trian" in err and "train" in err


def test_python_dash_m_works():
    out = subprocess.run([sys.executable, "-m", "captioner", "--version"], capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith("captioner ")


def test_expand_paths_files_globs_dirs(tmp_path):
    (tmp_path / "a.png").write_bytes(b"x")
    (tmp_path / "b.jpg").write_bytes(b"x")
    (tmp_path / "notes.txt").write_text("x")
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "c.jpeg").write_bytes(b"x")
    paths, missing = expand_image_paths([str(tmp_path), str(sub / "*.jpeg"), str(tmp_path / "nope.png")])
    names = [p.name for p in paths]
    assert names == ["a.png", "b.jpg", "c.jpeg"]
    assert missing == [(str(tmp_path / "nope.png"), "no such file")]


def test_caption_block_trigrams_flag_reaches_the_search(smoke_checkpoint, tmp_path, capsys):
    import json

    import numpy as np
    from PIL import Image

    images = []
    for seed in range(3):
        path = tmp_path / f"{seed}.png"
        Image.fromarray(np.random.default_rng(seed).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(path)
        images.append(str(path))

    def captions(*flags):
        capsys.readouterr()
        assert main(["caption", *images, "--checkpoint", str(smoke_checkpoint), "--beam", "2", "--json",
                     *flags]) == 0
        return [r["caption"].split() for r in json.loads(capsys.readouterr().out)["results"]]

    def repeats(words):
        grams = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
        return len(set(grams)) < len(grams)

    assert any(repeats(words) for words in captions())  # the untrained smoke model loops
    assert not any(repeats(words) for words in captions("--block-trigrams"))
