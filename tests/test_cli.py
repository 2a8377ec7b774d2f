"""The command dispatcher and path expansion of `captioner caption`."""

import subprocess
import sys

from captioner.cli import COMMANDS, expand_image_paths, main


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


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
