"""``mmreplay export`` / ``mmreplay import`` and ``describe`` of every dataset format."""

from __future__ import annotations

import numpy as np

import mmreplay as mr
from mmreplay.cli import main
from mmreplay.datasets import describe


def _store(path):
    s = mr.ReplayStore.create(path, capacity=200, obs_shape=(4,), obs_dtype="float32", stack=2, n_step=2)
    rng = np.random.default_rng(0)
    for e in range(4):
        s.reset(rng.random(4, dtype=np.float32))
        for t in range(10 + e):
            s.step(t % 3, float(t), rng.random(4, dtype=np.float32), t == 9 + e, False)
    s.close()
    return str(path)


def test_export_import_and_describe_from_the_command_line(tmp_path, capsys):
    src = _store(tmp_path / "s")
    assert main(["--quiet", "export", src, str(tmp_path / "d.zarr")]) == 0
    assert main(["export", src, str(tmp_path / "d.hdf5"), "--format", "hdf5", "--next-observations", "--quiet"]) == 0
    assert main(["export", src, str(tmp_path / "root"), "--format", "minari", "--dataset-id", "t/x-v0",
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.count("exported") == 3 and "4 episodes, 46 steps" in out
    for i, dataset in enumerate([tmp_path / "d.zarr", tmp_path / "d.hdf5", tmp_path / "root" / "t" / "x-v0"]):
        lines = describe(dataset)
        text = "\n".join(lines)
        assert "episodes    4" in text and "steps       46" in text and "returns" in text and "(4,) float32" in text
        assert main(["import", str(dataset), str(tmp_path / f"back{i}"), "--n-step", "1", "--quiet"]) == 0
        with mr.ReplayStore.open(tmp_path / f"back{i}", mode="r") as back:
            assert back.id_range == (0, 46) and back.schema.n_step == 1 and back.schema.stack == 2
    out = capsys.readouterr().out
    assert out.count("imported") == 3 and "46 (ids 0..45)" in out


def test_command_line_errors_are_reported(tmp_path, capsys):
    assert main(["import", str(tmp_path / "nothing"), str(tmp_path / "s"), "--quiet"]) == 1
    assert "no such file or directory" in capsys.readouterr().err
    src = _store(tmp_path / "s0")
    assert main(["export", src, str(tmp_path / "root"), "--format", "minari", "--quiet"]) == 1
    assert "dataset_id" in capsys.readouterr().err
