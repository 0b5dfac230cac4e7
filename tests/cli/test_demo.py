"""``mmreplay demo``: the whole story runs, on the core dependencies alone and with a real env."""

from __future__ import annotations

import importlib.util
import os
import tempfile

from mmreplay.cli import demo
from mmreplay.cli.main import main


def run(tmp_path, capsys, *args):
    code = main(["--quiet", "demo", str(tmp_path / "d"), *args])
    return code, capsys.readouterr()


def check_story(tmp_path, text):
    root = tmp_path / "d"
    assert f"files in  {root} (kept afterwards)" in text and f"kept {root}" in text
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
    plan, story = cap.out.split("1. recorded", 1)
    assert "pictures  skipped: Pillow is not installed (pip install 'mmreplay[image]' adds them)" in plan
    assert "'mmreplay[gym]' adds CartPole" in plan  # said before anything is recorded
    assert not (tmp_path / "d" / "sample.png").exists()
    check_story(tmp_path, cap.out.replace("pictures skipped", ""))


def test_demo_says_up_front_what_it_draws(tmp_path, capsys):
    code, cap = run(tmp_path, capsys, "--env", "synthetic", "--steps", "300")
    assert code == 0, cap.err
    plan = cap.out.split("1. recorded", 1)[0]
    assert "env       generated Atari-like episodes" in plan
    have_pil = importlib.util.find_spec("PIL") is not None
    assert ("drawn with Pillow (the [image] extra)" in plan) == have_pil
    assert ("5. pictures: " in cap.out) == have_pil


def _temp_dirs(root):
    return sorted(p.name for p in root.iterdir() if p.name.startswith("mmreplay-demo-"))


def test_demo_without_a_path_removes_its_temporary_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert main(["--quiet", "demo", "--env", "synthetic", "--steps", "300"]) == 0
    text = capsys.readouterr().out
    assert _temp_dirs(tmp_path) == []
    where = text.split("files in  ", 1)[1].split(" ", 1)[0]
    assert where.startswith(str(tmp_path / "mmreplay-demo-")) and "removed at the end" in text
    assert f"removed {where} (" in text and "--keep" in text
    assert "next: mmreplay info" not in text  # nothing left to look at

    assert main(["--quiet", "demo", "--env", "synthetic", "--steps", "300", "--keep"]) == 0
    text = capsys.readouterr().out
    (kept,) = _temp_dirs(tmp_path)
    assert f"kept {tmp_path / kept} (" in text and f"rm -r {tmp_path / kept}" in text
    assert (tmp_path / kept / "store" / "manifest.json").exists()


def test_a_failed_demo_removes_its_temporary_directory_too(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def broken_export(*args, **kwargs):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(demo, "export", broken_export)
    assert main(["--quiet", "demo", "--env", "synthetic", "--steps", "300"]) == 1
    cap = capsys.readouterr()
    assert "disk full (simulated)" in cap.err and "removed" in cap.out
    assert _temp_dirs(tmp_path) == []


def test_demo_refuses_too_few_steps(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert main(["--quiet", "demo", "--steps", "10"]) == 1
    assert "--steps: expected at least 100" in capsys.readouterr().err
    assert _temp_dirs(tmp_path) == []


def test_demo_refuses_a_path_that_holds_a_demo_before_recording(tmp_path, capsys):
    """A second run into the same PATH is refused in command-line terms, naming path and what to give, and
    leaves the first run's files as they were; so is a file."""
    import numpy as np

    import mmreplay as mr

    with mr.ReplayStore.create(tmp_path / "d" / "store", capacity=100, obs_shape=(2,)) as s:  # a first run's store
        s.reset(np.zeros(2, np.uint8))
    code, cap = run(tmp_path, capsys, "--env", "synthetic", "--steps", "100")
    assert code == 1 and "1. recorded" not in cap.out
    err = cap.err.strip()
    assert f"path {tmp_path / 'd'}: already holds the files of a demo (store)" in err
    assert "give a new or empty directory" in err and f"rm -r {tmp_path / 'd'}" in err
    assert "ReplayStore" not in err and "create()" not in err
    assert sorted(os.listdir(tmp_path / "d")) == ["store"]
    (tmp_path / "f").write_text("")
    assert main(["--quiet", "demo", str(tmp_path / "f"), "--env", "synthetic", "--steps", "100"]) == 1
    assert f"path {tmp_path / 'f'}: not a directory" in capsys.readouterr().err
