"""``show`` and ``stats``: pictures of the right size whose pixels follow the data, padding marked right."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import mmreplay as mr
from mmreplay.cli import viz
from mmreplay.cli.main import main
from mmreplay.synthetic import atari_like_episodes
from tests._support.helpers import require


@pytest.fixture(scope="module")
def pil():
    return require("PIL.Image")


def atari_store(path, seed=0, stack=4, num_envs=1, prioritized=None, episodes=4, capacity=5000, chunk_size=None):
    """Generated 84x84 episodes (never an all-zero frame), one stream or interleaved streams."""
    s = mr.ReplayStore.create(path, capacity=capacity, obs_shape=(84, 84), stack=stack, n_step=3, num_envs=num_envs,
                              prioritized=prioritized, chunk_size=chunk_size)
    eps = list(atari_like_episodes(episodes * num_envs, seed=seed, min_len=15, max_len=60))
    if num_envs == 1:
        for ep in eps:
            s.reset(ep.frames[0])
            for t in range(ep.length):
                s.step(ep.actions[t], ep.rewards[t], ep.frames[t + 1], t == ep.length - 1, False)
        return s
    # vector: each env plays its own episodes back to back (NEXT_STEP autoreset: a start frame, no transition)
    streams = [np.concatenate([ep.frames for ep in eps[e::num_envs]]) for e in range(num_envs)]
    ends = [set((np.cumsum([ep.length + 1 for ep in eps[e::num_envs]]) - 1).tolist()) for e in range(num_envs)]
    n = min(len(x) for x in streams)
    s.reset(np.stack([x[0] for x in streams]))
    for i in range(1, n):
        done = np.array([(i in ends[e]) for e in range(num_envs)])
        s.step(np.full(num_envs, i % 6), np.ones(num_envs), np.stack([x[i] for x in streams]), done,
               np.zeros(num_envs, bool))
    return s


def all_ids(store):
    lo, hi = store.id_range
    ok = []
    for i in range(lo, hi):
        try:
            store.gather([i])
            ok.append(i)
        except mr.NotSampleableError:
            pass
    return np.array(ok, np.int64)


@pytest.mark.parametrize("num_envs,stack,evict", [(1, 4, False), (3, 4, False), (2, 2, False), (3, 4, True)])
def test_padding_is_located_exactly(tmp_path, num_envs, stack, evict):
    """With pad='zeros', padded frames are exactly the all-zero ones (real frames never are)."""
    kw = dict(episodes=12, capacity=300, chunk_size=384) if evict else {}
    s = atari_store(tmp_path / "s", num_envs=num_envs, stack=stack, **kw)
    ids = all_ids(s)
    batch = s.gather(ids)
    obs_pad, next_pad, env, t = viz.stack_padding(s, ids)
    assert np.array_equal(obs_pad, (batch.obs == 0).all(axis=(2, 3)))
    assert np.array_equal(next_pad, (batch.next_obs == 0).all(axis=(2, 3)))
    assert obs_pad.any()
    assert (s.id_range[0] > 0) == evict and (t >= 0).all()  # steps counted from the first observation, retained or not
    assert sorted(set(env.tolist())) == list(range(num_envs))
    s.close()


@pytest.mark.parametrize("evict", [False, True])
def test_rows_of_streams_written_apart_are_located_exactly(tmp_path, evict):
    """Env streams written at their own pace (extend() blocks, reset(obs, env=i) mid-episode, batched steps
    between): ids follow the write order, and each row's env, step and padding are those written (the env and
    step are stored with each transition as extras; with pad='zeros' the padded frames are the all-zero ones)."""
    rng = np.random.default_rng(5)
    num_envs = 3
    kw = dict(capacity=300, chunk_size=96) if evict else dict(capacity=10_000)
    s = mr.ReplayStore.create(tmp_path / "s", obs_shape=(2,), obs_dtype="float32", stack=4, n_step=3,
                              num_envs=num_envs, extras={"e": ((), "int32"), "tt": ((), "int32")}, **kw)
    counter = iter(range(1, 10**9))  # frame values: never zero

    def frames(n):
        return np.array([[next(counter), 7] for _ in range(n)], np.float32)

    t = [0] * num_envs
    for e in range(num_envs):
        s.reset(frames(1)[0], env=e)
    for _ in range(400 if evict else 60):
        e, u = int(rng.integers(num_envs)), rng.random()
        if u < 0.15:  # env e's next episode starts mid-episode (the open one is truncated)
            s.reset(frames(1)[0], env=e)
            t[e] = 0
        elif u < 0.3:  # one batched step of every env
            s.step(np.zeros(num_envs, np.int64), np.ones(num_envs), frames(num_envs), np.zeros(num_envs, bool),
                   np.zeros(num_envs, bool), e=np.arange(num_envs, dtype=np.int32), tt=np.array(t, np.int32))
            t = [x + 1 for x in t]
        else:  # a block of env e's steps, ending its episode or not
            n, end = int(rng.integers(1, 12)), rng.random() < 0.3
            done = np.zeros(n, bool)
            done[-1] = end
            s.extend(np.zeros(n, np.int64), np.ones(n), frames(n), done & (u < 0.6), done & (u >= 0.6), env=e,
                     e=np.full(n, e, np.int32), tt=np.arange(t[e], t[e] + n, dtype=np.int32))
            t[e] += n
            if end:
                s.reset(frames(1)[0], env=e)
                t[e] = 0
    ids = s.sampleable_ids()
    b = s.gather(ids)
    obs_pad, next_pad, env, step = viz.stack_padding(s, ids)
    assert np.array_equal(env, b.extras["e"]) and np.array_equal(step, b.extras["tt"])
    assert np.array_equal(obs_pad, (b.obs == 0).all(axis=2))
    assert np.array_equal(next_pad, (b.next_obs == 0).all(axis=2))
    assert obs_pad.any() and next_pad.any() and (s.id_range[0] > 0) == evict
    s.close()


def test_show_picture(pil, tmp_path):
    s = atari_store(tmp_path / "s")
    starts = s.episodes().first_id
    ids = np.array([starts[1], starts[1] + 10, starts[2] + 1])  # t=0 (3 padded frames), t=10, t=1
    img = viz.show_image(s, s.gather(ids))
    tile = 84 + viz.GAP
    assert img.width == 2 * viz.MARGIN + 2 * (4 * tile - viz.GAP) + viz.ARROW
    row_h = (img.height - viz.HEADER) // 3
    assert img.height == viz.HEADER + 3 * row_h and row_h > 84
    px = np.asarray(img)

    def orange(r):
        band = px[viz.HEADER + r * row_h: viz.HEADER + r * row_h + 84]
        return int((band == viz.PAD_COLOR).all(axis=-1).sum())

    assert orange(1) == 0 and orange(2) > 0 and 2 * orange(0) == 3 * orange(2)  # 3 and 2 padded frames outlined
    # the frames themselves are drawn: the first unpadded tile of row 1 is the stored frame
    y, x = viz.HEADER + row_h, viz.MARGIN
    assert np.array_equal(px[y:y + 84, x:x + 84, 0], s.gather(ids[1:2]).obs[0, 0])
    other = viz.show_image(s, s.gather(ids + 1))
    assert other.size == img.size and not np.array_equal(np.asarray(other), px)
    s2 = atari_store(tmp_path / "s2", seed=9)
    changed = viz.show_image(s2, s2.gather(np.array([s2.episodes().first_id[1] + 10] * 3)))
    assert not np.array_equal(np.asarray(changed)[viz.HEADER:], px[viz.HEADER:])
    s.close()
    s2.close()


def test_show_vectors_and_refusals(pil, tmp_path):
    rng = np.random.default_rng(0)
    with mr.ReplayStore.create(tmp_path / "v", capacity=100, obs_shape=(4,), obs_dtype="float32", stack=2) as s:
        s.reset(rng.normal(size=4).astype(np.float32))
        for t in range(20):
            s.step(t % 2, 1.0, rng.normal(size=4).astype(np.float32), False, False)
        img = viz.show_image(s, s.gather(np.array([0, 5])))
        px = np.asarray(img)[viz.HEADER:viz.HEADER + 96]
        assert (px != 255).any(axis=-1).mean() > 0.1  # bars drawn, not a blank canvas
        img2 = viz.show_image(s, s.gather(np.array([7, 5])))
        assert not np.array_equal(np.asarray(img2), np.asarray(img))
    with mr.ReplayStore.create(tmp_path / "w", capacity=100, obs_shape=(100,), obs_dtype="float32") as s:
        s.reset(np.zeros(100, np.float32))
        s.step(0, 1.0, np.ones(100, np.float32), True, False)
        with pytest.raises(ValueError, match="cannot draw observations of shape \\(100,\\)"):
            viz.show_image(s, s.gather([0]))


def test_stats(pil, tmp_path):
    s = atari_store(tmp_path / "u")
    numbers = viz.store_stats(s)
    table = s.episodes()
    assert numbers.returns.tolist() == table.returns[table.complete].tolist()
    assert numbers.sampleable == len(s) and numbers.priorities is None
    text = "\n".join(viz.stats_text(numbers))
    assert f"{len(s):,} sampleable" in text and "uniform" in text
    img = viz.stats_image(numbers)
    assert img.size == viz.STATS_SIZE
    p = atari_store(tmp_path / "p", prioritized=mr.Prioritized())
    ids = np.arange(0, 60)
    p.update_priorities(ids, np.linspace(0.1, 5, ids.size))
    pn = viz.store_stats(p)
    assert pn.priorities is not None and pn.priorities.size == len(p) and pn.priorities.max() == 5
    assert "max ever 5" in "\n".join(viz.stats_text(pn))
    pimg = viz.stats_image(pn)
    assert pimg.size == viz.STATS_SIZE
    a, b = np.asarray(img), np.asarray(pimg)
    h, w = viz.STATS_SIZE[1], viz.STATS_SIZE[0]
    assert not np.array_equal(a[h // 2:, : w // 2], b[h // 2:, : w // 2])  # the priority histogram
    assert (a[40: h // 2, 60: w // 2] != 255).any(axis=-1).sum() > 100  # returns plotted
    s.close()
    p.close()


def test_cli(pil, tmp_path, capsys):
    atari_store(tmp_path / "s").close()
    png = tmp_path / "sample.png"
    assert main(["--quiet", "show", str(tmp_path / "s"), "--out", str(png), "--rows", "3", "--seed", "4"]) == 0
    assert "wrote" in capsys.readouterr().out
    from PIL import Image

    with Image.open(png) as im:
        assert im.width == 2 * viz.MARGIN + 2 * (4 * 84 + 3 * viz.GAP) + viz.ARROW
    assert main(["show", str(tmp_path / "s"), "--out", str(png), "--ids", "0", "999999"]) == 1
    assert "--ids 999999: no such transition" in capsys.readouterr().err
    assert main(["stats", str(tmp_path / "s"), "--out", str(tmp_path / "stats.png")]) == 0
    text = capsys.readouterr().out
    assert "sampleable" in text and "returns" in text and (tmp_path / "stats.png").exists()


@pytest.mark.parametrize("command", ["show", "stats"])
def test_cli_wrong_path(tmp_path, capsys, command):
    missing = tmp_path / "nothing-here"
    assert main([command, str(missing), "--out", str(tmp_path / "x.png")]) != 0
    err = capsys.readouterr().err
    assert f"mmreplay {command}: error:" in err and str(missing) in err
    assert not (tmp_path / "x.png").exists()


def test_without_pillow(tmp_path, capsys, monkeypatch):
    atari_store(tmp_path / "s").close()
    monkeypatch.setitem(sys.modules, "PIL", None)  # makes "import PIL" fail
    assert main(["show", str(tmp_path / "s"), "--out", str(tmp_path / "x.png")]) == 1
    assert "pip install 'mmreplay[image]'" in capsys.readouterr().err
    assert main(["stats", str(tmp_path / "s"), "--out", str(tmp_path / "y.png")]) == 1
    captured = capsys.readouterr()
    assert "sampleable" in captured.out and "mmreplay[image]" in captured.err


def test_numbers_read_as_numbers():
    assert [viz.number(v) for v in (1110, 1110.0, 759.0, -21.0, 5.743, 1234.56, 0.008322, 1e6)] == [
        "1,110", "1,110", "759", "-21", "5.743", "1,234.6", "0.008322", "1,000,000"]
    ticks = viz.nice_ticks(127, 1110, integer=True)
    assert ticks[0] <= 127 and ticks[-1] >= 1110 and 4 <= ticks.size <= 8
    assert np.allclose(np.diff(ticks), ticks[1] - ticks[0]) and ticks[1] - ticks[0] in (100, 200, 250, 500)
    assert viz.tick_labels(np.array([0.0, 500.0, 1000.0, 1500.0])) == ["0", "500", "1,000", "1,500"]
    assert viz.tick_labels(viz.nice_ticks(0.0083, 5.74)) == ["0", "2", "4", "6"]
    assert viz.tick_labels(viz.nice_ticks(-0.3, 0.31)) == ["-0.4", "-0.2", "0.0", "0.2", "0.4"]
    assert viz.nice_ticks(0, 3, integer=True).tolist() == [0, 1, 2, 3]  # never a step below 1 for counts


def _stats(returns, lengths, priorities=None):
    n = int(lengths.sum())
    return viz.StoreStats("/some/store", 100_000, (0, n), n, len(lengths), 0, len(lengths), 0, returns, lengths,
                          priorities, None if priorities is None else float(priorities.max()))


def test_stats_text_prints_lengths_as_integers():
    lengths = np.array([759, 1110, 2048, 127])
    text = "\n".join(viz.stats_text(_stats(np.array([-21.0, 3.5, 1110.0, 0.0]), lengths)))
    assert "lengths       mean 1,011, min 127, median 934.5, max 2,048 transitions" in text
    assert "max 1,110" in text and "e+" not in text and "759.0" not in text


def test_stats_picture_has_axis_titles_a_legend_and_readable_ticks(pil, monkeypatch):
    from PIL import ImageDraw

    drawn: list[str] = []
    text = ImageDraw.ImageDraw.text

    def spy(self, xy, s, *args, **kwargs):
        drawn.append(str(s))
        return text(self, xy, s, *args, **kwargs)

    monkeypatch.setattr(ImageDraw.ImageDraw, "text", spy)
    rng = np.random.default_rng(0)
    lengths = rng.integers(100, 2500, 59)
    img = viz.stats_image(_stats(rng.normal(500, 800, 59), lengths, rng.exponential(2.0, 5000)))
    assert img.size == viz.STATS_SIZE
    for title in ("episode (in start order)", "return", "transitions", "priority (as last set)"):
        assert title in drawn, title
    w = viz.running_window(59)
    assert w == 5 and f"running mean of {w} episodes" in drawn and "each episode (return)" in drawn
    numeric = [s for s in drawn if s.replace(",", "").replace(".", "").lstrip("-").isdigit()]
    assert len(numeric) > 20 and not [s for s in drawn if "e+" in s or "e-" in s]
    assert "2,000" in numeric  # a length tick, thousands separated
    # the lengths panel's ticks are whole numbers
    lengths_ticks = viz.tick_labels(viz.nice_ticks(float(lengths.min()), float(lengths.max()), 5, True))
    assert all("." not in s for s in lengths_ticks) and set(lengths_ticks) <= set(numeric)


def test_running_mean_line_is_drawn_only_with_enough_episodes(pil, monkeypatch):
    from PIL import ImageDraw

    drawn: list[str] = []
    text = ImageDraw.ImageDraw.text
    monkeypatch.setattr(ImageDraw.ImageDraw, "text",
                        lambda self, xy, s, *a, **k: (drawn.append(str(s)), text(self, xy, s, *a, **k))[1])
    viz.stats_image(_stats(np.array([1.0, 2.0, 3.0]), np.array([10, 20, 30])))
    assert "each episode (return)" in drawn and not any(s.startswith("running mean") for s in drawn)


def test_stats_of_an_empty_store_says_none_retained(tmp_path, capsys):
    mr.ReplayStore.create(tmp_path / "e", capacity=100, obs_shape=(2,)).close()
    assert main(["stats", str(tmp_path / "e")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("transitions"))
    assert "none retained (next id 0), 0 sampleable" in line and "..-1" not in line
