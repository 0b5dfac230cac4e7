"""Every error of the ``mmreplay`` command names the flag or argument, says what was expected and what to do,
and shows no Python or C internals; a closed pipe ends quietly. Each case runs the real command."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

import mmreplay as mr
from tests._support.helpers import require

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What must never reach a user: Python tracebacks and errno tuples, HDF5's C error text, the API's names.
INTERNALS = re.compile(r"Traceback|\[Errno|errno =|Unable to synchronously|index\[\d+\]|file descriptor")


def _command() -> list[str]:
    """The installed ``mmreplay`` console script beside this interpreter, else ``python -m mmreplay``."""
    script = os.path.join(os.path.dirname(sys.executable), "mmreplay")
    return [script] if os.access(script, os.X_OK) else [sys.executable, "-m", "mmreplay"]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))


def mmreplay(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*_command(), *map(str, args)], capture_output=True, text=True, env=_env(), cwd=cwd,
                          timeout=300)


def refused(*args: str, names: str, cwd: str | None = None) -> str:
    """Run a command that must fail: exit 1, one ``mmreplay CMD: error:`` line naming ``names``, no internals."""
    done = mmreplay(*args, cwd=cwd)
    err = done.stderr
    assert done.returncode == 1, (args, done.stdout, err)
    assert err.startswith(f"mmreplay {args[0]}: error: ") and err.count("\n") == 1, err
    assert names in err, (names, err)
    assert not INTERNALS.search(err), err
    return err


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A store of two 10-step episodes (n-step 3: the last ids are not sampleable yet), an empty store, and
    the store exported as a zarr dataset."""
    root = tmp_path_factory.mktemp("cli")
    s = mr.ReplayStore.create(root / "s", capacity=100, obs_shape=(8, 8), stack=2, n_step=3)
    for _ in range(2):  # the second reset() cuts the first episode
        s.reset(np.zeros((8, 8), np.uint8))
        for t in range(10):
            s.step(t % 3, 1.0, np.full((8, 8), t, np.uint8), False, False)
    s.close()  # the second episode is still running: its last n_step - 1 ids are not sampleable yet
    mr.ReplayStore.create(root / "empty", capacity=100, obs_shape=(8, 8)).close()
    from mmreplay.datasets import export

    export(str(root / "s"), str(root / "d.zarr"), format="zarr")
    return root


def test_import_of_a_directory_as_hdf5_names_src_and_format(stores):
    err = refused("import", stores / "d.zarr", stores / "new", "--format", "hdf5", names="--format hdf5")
    assert "src " in err and "leave --format out" in err
    err = refused("import", stores / "s" / "manifest.json", stores / "new", "--format", "d4rl", names="not an HDF5")
    assert not (stores / "new").exists()


def test_import_into_an_existing_store_says_import_once(stores):
    err = refused("import", stores / "d.zarr", stores / "s", names=f"path {stores / 's'} already exists")
    assert err.count("import") == 2 and "give a new path" in err  # "mmreplay import:" and "import never ..."


def test_import_of_a_missing_source_names_src(stores):
    refused("import", stores / "nothing.hdf5", stores / "new", names="src ")


def test_show_ids_are_named_as_the_flag(stores):
    require("PIL")
    out = stores / "x.png"
    err = refused("show", stores / "s", "--out", out, "--ids", "0", "999999", names="--ids 999999")
    assert "retained ids are 0..19" in err and "leave --ids out" in err
    refused("show", stores / "s", "--out", out, "--ids", "-1", names="--ids -1")
    err = refused("show", stores / "s", "--out", out, "--ids", "19", names="--ids 19 is not sampleable")
    assert not out.exists()
    done = mmreplay("show", stores / "s", "--out", out, "--ids", "0", "3")
    assert done.returncode == 0 and out.is_file() and "ids 0, 3" in done.stdout


@pytest.mark.parametrize("command", ["show", "stats"])
def test_an_unwritable_out_is_named_before_any_work(stores, command):
    require("PIL")
    missing = stores / "no-such-dir" / "x.png"
    err = refused(command, stores / "s", "--out", missing, names=f"--out {missing}")
    assert "does not exist" in err and not missing.parent.exists()
    err = refused(command, stores / "s", "--out", stores, names=f"--out {stores}")
    assert "is a directory" in err


@pytest.mark.parametrize("command", ["info", "verify", "show", "stats", "export"])
def test_a_missing_store_is_named(stores, command):
    args = [command, stores / "nothing"] + ([stores / "o.zarr"] if command == "export" else [])
    refused(*args, names=f"{stores / 'nothing'}: no such")


def test_export_options_are_named_as_flags(stores):
    out = stores / "o.hdf5"
    err = refused("export", stores / "s", out, "--format", "hdf5", "--compression", "bogus", names="--compression bogus")
    assert "expected one of gzip, lzf, none" in err
    refused("export", stores / "s", out, "--format", "hdf5", "--level", "12", names="--level 12")
    assert not out.exists()


def test_bench_refuses_a_capacity_whose_figures_mean_nothing():
    err = refused("bench", "--capacity", "10", names="--capacity 10")
    assert "at least 10,000" in err
    from mmreplay.bench import MIN_CAPACITY

    assert MIN_CAPACITY == 10_000


def test_info_of_an_empty_store_has_no_negative_id(stores):
    done = mmreplay("info", stores / "empty")
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("ids"))
    assert "none retained (next id 0)" in line and "..-1" not in done.stdout
    line = next(x for x in mmreplay("info", stores / "s").stdout.splitlines() if x.startswith("ids"))
    assert "0..19 retained (20)" in line


def test_a_closed_pipe_ends_quietly_with_the_status_of_sigpipe(stores):
    """``mmreplay info S | head -1``: the reader is gone before the command writes."""
    proc = subprocess.Popen([*_command(), "info", str(stores / "s")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=_env())
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 128 + signal.SIGPIPE and err == b""
    proc.stderr.close()
    if shutil.which("sh") and shutil.which("head"):  # as a shell runs it
        cmd = " ".join(_command())
        done = subprocess.run(["sh", "-c", f'{cmd} info "$1" | head -c 1 >/dev/null', "sh", str(stores / "s")],
                              capture_output=True, text=True, env=_env(), timeout=300)
        assert done.returncode == 0 and done.stderr == ""


@pytest.mark.parametrize("command", ["verify", "show", "stats", "info"])
def test_path_is_described(command):
    done = mmreplay(command, "--help")
    text = " ".join(done.stdout.split())
    assert done.returncode == 0 and "path a store or snapshot" in text
    if command == "show":
        assert "Draw transitions of a store as a PNG" in text
