"""``mmreplay export`` / ``mmreplay import`` and ``describe`` of every dataset format."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

import mmreplay as mr
from mmreplay.cli.main import main
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
    assert "needs --dataset-id" in capsys.readouterr().err


def test_export_onto_an_existing_output_names_the_flag(tmp_path, capsys):
    src = _store(tmp_path / "s")
    for fmt, out, extra in (("zarr", "d.zarr", []), ("hdf5", "d.hdf5", []),
                            ("minari", "root", ["--dataset-id", "t/x-v0"])):
        assert main(["--quiet", "export", src, str(tmp_path / out), "--format", fmt, *extra]) == 0
        capsys.readouterr()
        assert main(["--quiet", "export", src, str(tmp_path / out), "--format", fmt, *extra]) == 1
        err = capsys.readouterr().err
        assert "already exists" in err and "--overwrite" in err and "overwrite=True" not in err, err
        assert main(["--quiet", "export", src, str(tmp_path / out), "--format", fmt, "--overwrite", *extra]) == 0


def test_cli_errors_name_flags_not_python_arguments(tmp_path, capsys):
    src = _store(tmp_path / "s")
    assert main(["--quiet", "export", src, str(tmp_path / "root"), "--format", "minari"]) == 1
    err = capsys.readouterr().err
    assert "--dataset-id" in err and "dataset_id" not in err and "None" not in err
    assert not (tmp_path / "root").exists()
    assert main(["--quiet", "export", src, str(tmp_path / "d.zarr"), "--dataset-id", "t/x-v0"]) == 1
    assert "--dataset-id is for --format minari" in capsys.readouterr().err
    assert main(["--quiet", "export", src, str(tmp_path / "d.zarr"), "--next-observations"]) == 1
    assert "--next-observations is for --format hdf5/d4rl" in capsys.readouterr().err
    assert main(["--quiet", "import", src, str(tmp_path / "copy")]) == 1
    err = capsys.readouterr().err
    assert "is an mmreplay store already" in err and "ReplayStore.open" not in err
    assert main(["--quiet", "export", src, str(tmp_path / "d.zarr")]) == 0
    assert main(["--quiet", "import", str(tmp_path / "d.zarr"), str(tmp_path / "b"), "--suffixes", "1"]) == 1
    assert "--suffixes picks Dopamine checkpoints" in capsys.readouterr().err
    for flag, value in (("--stack", "0"), ("--n-step", "-1"), ("--capacity", "0"), ("--gamma", "1.5")):
        with pytest.raises(SystemExit) as exit_:
            main(["--quiet", "import", str(tmp_path / "d.zarr"), str(tmp_path / "b"), flag, value])
        assert exit_.value.code == 2
        assert f"argument {flag}: expected" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("not a store")
    for command in (["show", str(plain)], ["stats", str(plain)], ["verify", str(plain)],
                    ["export", str(plain), str(tmp_path / "p.zarr")]):
        assert main(["--quiet", *command]) == 1
        err = capsys.readouterr().err
        assert "not an mmreplay store or snapshot (no manifest.json)" in err and "create one with" not in err
    assert main(["--quiet", "info", str(plain)]) == 1
    assert "neither an mmreplay store (no manifest.json) nor a dataset" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["hdf5", "d4rl"])
def test_d4rl_export_says_when_final_observations_are_dropped(tmp_path, capsys, fmt):
    src = _store(tmp_path / "s")
    assert main(["--quiet", "export", src, str(tmp_path / "d.hdf5"), "--format", fmt]) == 0
    err = capsys.readouterr().err
    assert "final observations of 4 episode(s) are not in" in err and "--next-observations" in err
    with h5py.File(tmp_path / "d.hdf5", "r") as f:
        assert "next_observations" not in f and f["observations"].shape[0] == 46  # 50 frames, 4 finals dropped
    assert main(["--quiet", "export", src, str(tmp_path / "n.hdf5"), "--format", fmt, "--next-observations"]) == 0
    assert "final observations" not in capsys.readouterr().err
    with h5py.File(tmp_path / "n.hdf5", "r") as f:
        assert f["next_observations"].shape[0] == 46
    assert main(["--quiet", "export", src, str(tmp_path / "d.zarr")]) == 0
    assert capsys.readouterr().err == ""


def test_export_help_explains_hdf5_and_d4rl(capsys):
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--format hdf5 and --format d4rl are the same thing" in text
    assert "dropped unless you add --next-observations" in text


def test_export_never_replaces_or_writes_into_its_store(tmp_path, capsys, monkeypatch):
    """An output that is the store, holds it (``.`` among them) or lies inside it is refused, with --overwrite
    too: replacing it would delete the store, and a store directory holds its own files only."""
    runs = tmp_path / "runs"
    src = _store(runs / "replay-v0")
    (runs / "notes.txt").write_text("keep")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for out, why in ((src, "is the store it exports"), (str(runs), "holds the store it exports"),
                     (str(tmp_path), "holds the store it exports"),
                     (str(runs / "replay-v0" / "d.zarr"), "lies inside the store it exports")):
        for extra in ([], ["--overwrite"]):
            assert main(["--quiet", "export", src, out, *extra]) == 1
            err = capsys.readouterr().err
            assert f"the output {out} {why}" in err and src in err and "add --overwrite" not in err, err
    monkeypatch.chdir(runs)
    assert main(["--quiet", "export", "replay-v0", ".", "--overwrite"]) == 1
    assert "the output . holds the store it exports" in capsys.readouterr().err
    from mmreplay.datasets import export

    for fmt, out, options in (("zarr", runs, {}), ("hdf5", runs, {}),
                              ("minari", tmp_path, {"dataset_id": "runs/replay-v0"}),
                              ("zarr", runs / "replay-v0" / "d.zarr", {})):
        with pytest.raises(ValueError, match="the store it exports"):
            export(src, str(out), format=fmt, overwrite=True, progress=False, **options)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (runs / "notes.txt").read_text() == "keep"
    with mr.ReplayStore.open(src, mode="r") as back:
        assert back.id_range == (0, 46)


def test_import_refuses_a_symbolic_link_or_a_url_as_the_store(tmp_path, capsys, monkeypatch):
    """A store is a local directory reached through no link: a link to an empty directory, or a URL, is
    refused as ``path``, and nothing is written."""
    from mmreplay.datasets import import_dataset

    src = _store(tmp_path / "s")
    assert main(["--quiet", "export", src, str(tmp_path / "d.zarr")]) == 0
    (tmp_path / "scratch").mkdir()
    (tmp_path / "link").symlink_to("scratch")
    assert main(["--quiet", "import", str(tmp_path / "d.zarr"), str(tmp_path / "link")]) == 1
    err = capsys.readouterr().err
    assert f"path {tmp_path / 'link'} is a symbolic link" in err and str(tmp_path / "scratch") in err
    with pytest.raises(ValueError, match="is a symbolic link"):
        import_dataset(str(tmp_path / "d.zarr"), tmp_path / "link", progress=False)
    assert (tmp_path / "link").is_symlink() and not list((tmp_path / "scratch").iterdir())
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    assert main(["--quiet", "import", str(tmp_path / "d.zarr"), "s3://bucket/store"]) == 1
    assert "path s3://bucket/store is a URL, but a store is a local directory" in capsys.readouterr().err
    with pytest.raises(ValueError, match="a store is a local directory"):
        import_dataset(str(tmp_path / "d.zarr"), "s3://bucket/store", progress=False)
    assert not list(cwd.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cwd", "d.zarr", "link", "s", "scratch"]


def test_import_names_the_flag_the_store_refuses(tmp_path, capsys):
    """A value of --stack, --chunk-size, ... that the store refuses is the flag's fault, not the dataset's."""
    from mmreplay.datasets import import_dataset

    src = _store(tmp_path / "s")
    assert main(["--quiet", "export", src, str(tmp_path / "d.zarr")]) == 0
    for flag, value in (("--stack", "100000"), ("--chunk-size", "100000")):
        assert main(["--quiet", "import", str(tmp_path / "d.zarr"), str(tmp_path / "b"), flag, value]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"mmreplay import: error: {flag} {value} ") and "cannot be stored" not in err, err
    with pytest.raises(ValueError, match=r"stack=100,000 is too large") as refused:
        import_dataset(str(tmp_path / "d.zarr"), tmp_path / "b", stack=100000, progress=False)
    assert "cannot be stored" not in str(refused.value)
    with pytest.raises(SystemExit) as exit_:
        main(["--quiet", "import", str(tmp_path / "d.zarr"), str(tmp_path / "b"), "--seed", "-1"])
    assert exit_.value.code == 2
    assert "argument --seed: expected an integer >= 0, got -1" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()
