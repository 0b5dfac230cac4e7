"""``mmreplay demo``: the whole story runs, on the core dependencies alone and with a real env."""

from __future__ import annotations

import importlib.util
import os

from mmreplay import demo
from mmreplay.cli import main


def run(tmp_path, capsys, *args):
    code = main(["--quiet", "demo", str(tmp_path / "d"), *args])
    return code, capsys.readouterr()


def check_story(tmp_path, text):
    root = tmp_path / "d"
    assert f"files in {root}" in text
    assert "the resumed store hands out the same next batches as the original: True" in text
    for name in ("store", "snapshot", "resumed"):
        assert (root / name / "manifest.json").exists(), name
    if importlib.util.find_spec("PIL") is not None:
        assert (root / "sample.png").stat().st_size > 1000 and (root / "stats.png").exists()
    assert "sampleable" in text and "returns" in text
    assert "4. exported" in text and (root / "dataset.zarr").is_dir()


def test_demo_on_generated_episodes(tmp_path, capsys):
    code, cap = run(tmp_path, capsys, "--env", "synthetic", "--steps", "1500", "--capacity", "1000")
    assert code == 0, cap.err
    assert "generated Atari-like episodes" in cap.out and "1. recorded 1500 transitions" in cap.out
    check_story(tmp_path, cap.out)


def test_demo_with_the_default_env(tmp_path, capsys):
    """Atari with ale-py, CartPole with gymnasium alone, generated episodes with neither."""
    code, cap = run(tmp_path, capsys, "--steps", "600")
    assert code == 0, cap.err
    expected = {"atari": "ALE/Pong-v5", "cartpole": "CartPole-v1", "synthetic": "generated"}[demo.pick_env("auto")]
    assert expected in cap.out
    check_story(tmp_path, cap.out)


def test_demo_names_a_missing_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(demo, "_have", lambda module: False)
    assert demo.pick_env("auto") == "synthetic"
    code, cap = run(tmp_path, capsys, "--env", "atari")
    assert code == 1 and "pip install 'mmreplay[atari]'" in cap.err
    assert not os.path.exists(tmp_path / "d" / "store")


def test_demo_on_the_core_dependencies_alone(tmp_path, capsys, monkeypatch):
    import sys

    for module in ("gymnasium", "ale_py", "PIL", "torch"):
        monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    code, cap = run(tmp_path, capsys, "--steps", "800")
    assert code == 0, cap.err
    assert "generated Atari-like episodes" in cap.out and "pictures skipped" in cap.out
    assert "mmreplay[image]" in cap.out
    check_story(tmp_path, cap.out.replace("pictures skipped", ""))
