"""``mmreplay info`` / ``bench`` from the command line: what they print is the store's committed state."""

from __future__ import annotations

import numpy as np
import pytest

import mmreplay as mr
from mmreplay.cli.main import main


def _prioritized_store(path, beta_after):
    s = mr.ReplayStore.create(path, capacity=100, obs_shape=(2,), obs_dtype="float32",
                              prioritized=mr.Prioritized(alpha=0.6, beta=0.4))
    s.reset(np.zeros(2, np.float32))
    for t in range(10):
        s.step(0, 1.0, np.full(2, t, np.float32), t == 9, False)
    s.update_priorities(np.arange(10), np.linspace(0.5, 3.0, 10))
    s.beta = beta_after
    s.close()  # commits
    return str(path)


def test_info_shows_the_committed_beta_not_the_create_time_one(tmp_path, capsys):
    path = _prioritized_store(tmp_path / "s", 0.994)
    assert main(["info", path]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("prioritized"))
    assert "beta 0.994 (committed; 0.4 at create)" in line and "alpha 0.6" in line
    assert "max priority 3" in line
    with mr.ReplayStore.open(path, mode="r+") as s:  # a later commit changes what info says
        s.beta = 1.0
    assert main(["info", path]) == 0
    assert "beta 1 (committed; 0.4 at create)" in capsys.readouterr().out


def test_info_on_a_uniform_store(tmp_path, capsys):
    with mr.ReplayStore.create(tmp_path / "u", capacity=10, obs_shape=(2,)) as s:
        s.reset(np.zeros(2, np.uint8))
        s.step(0, 0.0, np.ones(2, np.uint8), True, False)
    assert main(["info", str(tmp_path / "u")]) == 0
    assert "prioritized - (uniform sampling)" in capsys.readouterr().out


def test_info_says_how_frames_are_stored(tmp_path, capsys):
    frames = np.zeros((84, 84), np.uint8)
    for name, compression in (("lz4", "auto"), ("raw", None)):
        with mr.ReplayStore.create(tmp_path / name, capacity=2000, obs_shape=(84, 84), chunk_size=256,
                                   compression=compression) as s:
            s.reset(frames)
            for t in range(700):  # two full chunks sealed, the third open
                frames[t % 84, :] = t % 251
                s.step(0, 0.0, frames, False, False)
        assert main(["info", str(tmp_path / name)]) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("frames"))
        if compression is None:
            assert line.endswith("raw (compression=None)")
        else:
            assert "lz4: 2 of 2 sealed chunks compressed" in line
            assert float(line.rsplit(", ", 1)[1].split("x")[0]) > 10  # near-constant frames shrink a lot


def test_bench_capacity_has_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "--capacity CAPACITY store capacity in transitions (default: 20000)" in text


def test_bench_never_touches_an_existing_store_at_path(tmp_path, capsys):
    """``bench --path DIR`` creates DIR/store and deletes it afterwards: a store already there is refused and
    left as it was."""
    s = mr.ReplayStore.create(tmp_path / "store", capacity=100, obs_shape=(4,), obs_dtype="float32")
    s.reset(np.zeros(4, np.float32))
    for t in range(20):
        s.step(0, 1.0, np.full(4, t, np.float32), False, False)
    s.close()
    assert main(["--quiet", "bench", "--path", str(tmp_path), "--capacity", "10000"]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'store'} already exists" in err and "--path" in err
    with mr.ReplayStore.open(tmp_path / "store", mode="r") as back:
        assert back.id_range == (0, 20)


def test_bench_names_a_path_that_is_not_a_directory(tmp_path, capsys):
    (tmp_path / "f").write_text("")
    for given in (tmp_path / "f", tmp_path / "f" / "sub"):
        assert main(["--quiet", "bench", "--path", str(given), "--capacity", "10000"]) == 1
        err = capsys.readouterr().err
        assert f"--path {given}: " in err and "give a directory for the benchmark's scratch files" in err
        assert "Not a directory" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]
