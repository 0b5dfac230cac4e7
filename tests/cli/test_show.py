"""``mmreplay show`` without ``--ids``: the rows are chosen from the sampleable ids by ``--seed``, never drawn
through the store's sampler, so a rate-limited store's shared counters and waits are left alone."""

from __future__ import annotations

import numpy as np
import pytest

import mmreplay as mr
from mmreplay.cli.main import main
from tests._support.helpers import require


def _rate_limited(path, min_size):
    s = mr.ReplayStore.create(path, capacity=500, obs_shape=(8, 8), compression=None,
                              rate_limit=mr.RateLimit(samples_per_insert=1.0, min_size=min_size, error_buffer=100,
                                                      timeout=0.5))
    s.reset(np.zeros((8, 8), np.uint8))
    for t in range(100):
        s.step(0, 1.0, np.full((8, 8), t, np.uint8), t % 25 == 24, False)
        if t % 25 == 24:
            s.reset(np.zeros((8, 8), np.uint8))
    s.close()
    return str(path)


def _sampled(path):
    with mr.ReplayStore.open(path, mode="r") as s:
        return s.inspect()["rate_limit"]["sampled"]


@pytest.mark.parametrize("min_size", [10, 400])  # sampling allowed now; not yet (sample() would wait)
def test_show_leaves_the_rate_limit_alone(tmp_path, capsys, min_size):
    require("PIL")
    path = _rate_limited(tmp_path / "s", min_size)
    assert main(["--quiet", "show", path, "--out", str(tmp_path / "x.png"), "--rows", "5"]) == 0, \
        capsys.readouterr().err
    assert "ids " in capsys.readouterr().out and (tmp_path / "x.png").is_file()
    assert _sampled(path) == 0


def test_show_rows_follow_the_seed(tmp_path, capsys):
    require("PIL")
    path = _rate_limited(tmp_path / "s", 10)
    with mr.ReplayStore.open(path, mode="r") as s:
        sampleable = set(s.sampleable_ids().tolist())

    def ids(seed):
        assert main(["--quiet", "show", path, "--out", str(tmp_path / "x.png"), "--rows", "6", "--seed", seed]) == 0
        line = capsys.readouterr().out
        return [int(i) for i in line.split("ids ", 1)[1].split(", ")]

    first = ids("3")
    assert first == ids("3") and len(set(first)) == 6 and set(first) <= sampleable
    assert first != ids("4")
    with pytest.raises(SystemExit) as exit_:
        main(["show", path, "--out", str(tmp_path / "x.png"), "--seed", "-1"])
    assert exit_.value.code == 2
    assert "argument --seed: expected an integer >= 0, got -1" in capsys.readouterr().err


def test_show_refuses_more_rows_than_one_picture_holds(tmp_path, capsys):
    from mmreplay.cli.viz import MAX_ROWS

    path = _rate_limited(tmp_path / "s", 10)
    png = tmp_path / "x.png"
    with pytest.raises(SystemExit) as exit_:
        main(["show", path, "--out", str(png), "--rows", str(MAX_ROWS + 1)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --rows: expected at most {MAX_ROWS}" in err and "one picture" in err
    ids = [str(i) for i in range(MAX_ROWS + 1)]
    assert main(["show", path, "--out", str(png), "--ids", *ids]) == 1
    assert f"--ids: expected at most {MAX_ROWS} ids" in capsys.readouterr().err
    assert not png.exists()
    require("PIL")
    assert main(["--quiet", "show", path, "--out", str(png), "--rows", str(MAX_ROWS)]) == 0, capsys.readouterr().err
