"""mmreplay.sb3.ReplayBuffer: every sampled transition is one that was added, as SB3 and CleanRL add them."""

from __future__ import annotations

import hashlib
import os
import pickle
import signal
import subprocess
import sys
import time
import warnings
from collections import Counter

import numpy as np
import pytest

from tests._support import internals
from tests._support.atari_data import GAMES, episodes
from tests._support.helpers import require

GAMMA = 0.9


# -- streams as SB3 / CleanRL feed them -----------------------------------------------------------------
class Segment:
    """One episode of one env: frames (T+1, ...), actions, rewards, and how it ended."""

    def __init__(self, frames, actions, rewards, end):
        self.frames, self.actions, self.rewards, self.end = frames, actions, rewards, end

    @property
    def T(self):
        return len(self.actions)


def atari_segments(env, count, rng):
    """Episodes of the recorded games, most cut short (truncated), a few tiny ones, some whole (terminated)."""
    eps = list(episodes(GAMES[env % len(GAMES)]))
    out = []
    for j in range(count):
        e = eps[(j + env) % len(eps)]
        lo = 40 + 6 * j  # each segment its own stretch of frames
        while out and lo < 200:
            # CleanRL's loop tells a truncation only by the next episode's first stack differing from the last
            # next_obs: skip static stretches (game intros) where a reset would look like the last frame
            prev = out[-1]
            if not (e.frames[lo] == prev.frames[max(prev.T - 3, 0):]).all():
                break
            lo += 7
        if j % 4 == 3 and env % 4 == 1:  # breakout episodes end by game over: keep one whole
            out.append(Segment(e.frames[lo:], e.actions[lo:], e.rewards[lo:], "terminated"))
            continue
        T = [1, 2, 3][j % 3] if j % 5 == 0 else int(rng.integers(4, 40))
        end = "terminated" if j % 3 == 1 else "truncated"  # a cut episode may also end as a game over would
        out.append(Segment(e.frames[lo:lo + T + 1], e.actions[lo:lo + T], e.rewards[lo:lo + T], end))
    return out


def flat_segments(env, count, rng):
    out = []
    for j in range(count):
        T = int(rng.integers(1, 30))
        frames = rng.normal(size=(T + 1, 3)).astype(np.float32)
        out.append(Segment(frames, rng.uniform(-2, 2, size=(T, 1)).astype(np.float32),
                           rng.normal(size=T).astype(np.float32), "terminated" if j % 2 else "truncated"))
    return out


def stack_of(seg, t, k, pad, axis):
    """The wrapper's observation at step t: frames t-k+1..t, padded before the episode's first frame."""
    if k == 1:
        return seg.frames[t]
    fr = [seg.frames[i] if i >= 0 else (seg.frames[0] if pad == "first" else np.zeros_like(seg.frames[0]))
          for i in range(t - k + 1, t + 1)]
    return np.stack(fr, axis=0 if axis == "first" else -1)


def digest(*arrays):
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype, a.shape)).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def row_key(obs, action, next_obs, done, reward, discount):
    return digest(obs, np.asarray(action, np.float64).reshape(-1), next_obs, np.float32(done), np.float32(reward),
                  np.float32(-1 if discount is None else discount))


def expected_rows(seg, fed, k, pad, axis, n, gamma, timeout_is_end, known_end):
    """Rows of the first ``fed`` steps of ``seg`` that are complete, and those that may still be pending."""
    sure, maybe = Counter(), Counter()
    act = seg.actions.reshape(seg.T, -1)
    for t in range(fed):
        ended = fed == seg.T
        m = min(n, seg.T - t) if ended else min(n, fed - t)
        term = ended and t + m == seg.T and (seg.end == "terminated" or timeout_is_end)
        reward = np.float32(sum(gamma ** i * float(seg.rewards[t + i]) for i in range(m)))
        disc = None if n == 1 else (0.0 if term else gamma ** m)
        key = row_key(stack_of(seg, t, k, pad, axis), act[t], stack_of(seg, t + m, k, pad, axis), term, reward,
                      disc)
        complete = (t + n <= fed) or (ended and known_end)
        (sure if complete else maybe)[key] += 1
    return sure, maybe


def feed(buf, streams, k, pad, axis, style, steps, n, gamma):
    """Drive ``buf`` like SB3's collect_rollouts (``style="sb3"``) or CleanRL's loop (``"cleanrl"``).

    Returns the rows that must be sampleable and those that may be (windows still open at the end).
    """
    n_envs = len(streams)
    pos = [(0, 0)] * n_envs  # (segment, step) of each env
    fed = [[0] * len(s) for s in streams]
    for _ in range(steps):
        obs, nxt, acts, rews, dones, infos = [], [], [], [], [], []
        finals = np.full(n_envs, None, object)
        for e, segs in enumerate(streams):
            j, t = pos[e]
            seg = segs[j]
            last = t + 1 == seg.T
            obs.append(stack_of(seg, t, k, pad, axis))
            nxt.append(stack_of(seg, t + 1, k, pad, axis))  # the real final observation on the last step
            if style == "cleanrl" and last and seg.end == "terminated" and j + 1 < len(segs):
                # Gymnasium 0.29 resets inside step(): next_obs is the next episode's first stack, the final
                # one is in infos["final_observation"] (CleanRL replaces next_obs by it on truncations only)
                finals[e] = nxt[-1]
                nxt[-1] = stack_of(segs[j + 1], 0, k, pad, axis)
            acts.append(seg.actions[t])
            rews.append(seg.rewards[t])
            if style == "sb3":
                dones.append(last)
                infos.append({"TimeLimit.truncated": last and seg.end == "truncated"})
            else:  # CleanRL: done = terminations only
                dones.append(last and seg.end == "terminated")
                infos.append({})
            fed[e][j] = t + 1
            pos[e] = (j + 1, 0) if last else (j, t + 1)
        if style == "cleanrl":  # a Gymnasium vector env's infos: one dict of arrays (not one entry per env)
            infos = {k: v for key in ("lives", "episode_frame_number", "frame_number")
                     for k, v in ((key, np.zeros(n_envs, np.int64)), (f"_{key}", np.ones(n_envs, bool)))}
            if any(f is not None for f in finals):
                infos.update(final_observation=finals, _final_observation=np.array([f is not None for f in finals]))
        buf.add(np.stack(obs), np.stack(nxt), np.stack(acts), np.array(rews), np.array(dones), infos)
    sure, maybe = Counter(), Counter()
    for e, segs in enumerate(streams):
        for j, seg in enumerate(segs):
            if fed[e][j]:
                # CleanRL: a truncation shows only when the env's next episode starts
                known = style == "sb3" or seg.end == "terminated" or (j + 1 < len(segs) and fed[e][j + 1] > 0)
                s, m = expected_rows(seg, fed[e][j], k, pad, axis, n, gamma, style == "sb3"
                                     and not buf.handle_timeout_termination, known)
                sure += s
                maybe += m
    return sure, maybe


def sample_keys(samples, n):
    keys = []
    for i in range(samples.observations.shape[0]):
        disc = None if samples.discounts is None else samples.discounts[i, 0].numpy()
        keys.append(row_key(samples.observations[i].numpy(), samples.actions[i].numpy(),
                            samples.next_observations[i].numpy(), samples.dones[i, 0].numpy(),
                            samples.rewards[i, 0].numpy(), disc))
    return keys


def all_rows(buf):
    """Every sampleable row, through the same conversion sample() uses."""
    store = buf.store
    ids = store.sampleable_ids()
    return sample_keys(internals.sb3_samples(buf, store.gather(ids)), buf.n_steps)


def check_buffer(buf, sure, maybe):
    got = Counter(all_rows(buf))  # counted: a few transitions repeat (static frames, same action)
    assert not sure - got, f"{sum((sure - got).values())} added transitions are not sampleable"
    assert not got - (sure + maybe), f"{sum((got - sure - maybe).values())} rows were never added"
    assert sum(sure.values()) > 100
    s = buf.sample(64)
    assert s.observations.shape == (64, *buf.obs_shape) and s.rewards.shape == (64, 1) and s.dones.shape == (64, 1)
    assert s.observations.dtype == buf.to_torch(np.zeros(1, buf.observation_space.dtype)).dtype
    assert set(sample_keys(s, buf.n_steps)) <= set(sure + maybe)
    assert (s.discounts is None) == (buf.n_steps == 1)
    # the GPU path's conversion (DeviceFeed's tensors to SB3's samples), run here on CPU tensors: tensor for
    # tensor what the host path makes of the same rows
    import torch

    batch = internals.sb3_device_feed(buf).next(64)
    d = internals.sb3_device_samples(buf, batch)
    want = internals.sb3_samples(buf, buf.store.gather(batch.index.numpy()))
    for got_t, want_t in zip(d, want, strict=True):
        if want_t is None:
            assert got_t is None
            continue
        assert got_t.dtype == want_t.dtype and got_t.shape == want_t.shape
        assert torch.equal(got_t, want_t)
    internals.sb3_drop_feed(buf)


# -- stacked Atari frames --------------------------------------------------------------------------------
@pytest.mark.parametrize("n_envs, n, pad, axis, style", [
    (1, 1, "zeros", "first", "sb3"),
    (4, 3, "zeros", "first", "sb3"),
    (4, 1, "zeros", "last", "sb3"),
    (1, 3, "first", "first", "cleanrl"),
    (4, 3, "first", "first", "cleanrl"),
])
def test_atari_stacks_round_trip(sb3, spaces, tmp_path, n_envs, n, pad, axis, style):
    k = 4
    shape = (k, 84, 84) if axis == "first" else (84, 84, k)
    rng = np.random.default_rng(n_envs * 10 + n)
    streams = [atari_segments(e, 12, rng) for e in range(n_envs)]
    buf = sb3.ReplayBuffer(10_000, spaces.Box(0, 255, shape, np.uint8), spaces.Discrete(6), device="cpu",
                           n_envs=n_envs, handle_timeout_termination=style == "sb3", n_steps=n, gamma=GAMMA,
                           path=tmp_path / "s", chunk_size=256)
    try:
        steps = min(sum(s.T for s in segs) for segs in streams) - 3
        sure, maybe = feed(buf, streams, k, pad, axis, style, steps, n, GAMMA)
        assert buf.store.schema.stack == k and buf.store.schema.obs_shape == (84, 84)
        assert buf.store.schema.pad == pad  # read from the first episode's stack
        assert buf.size() == steps
        check_buffer(buf, sure, maybe)
        # every distance from an episode start, padding included, was rebuilt and compared above
        starts = [t for segs in streams for s in segs for t in range(min(s.T, k))]
        assert set(range(k)) <= set(starts)
    finally:
        buf.close()


@pytest.mark.parametrize("n_envs, style", [(1, "sb3"), (3, "cleanrl")])
def test_adds_written_in_blocks_are_sampleable_at_once(sb3, spaces, tmp_path, monkeypatch, n_envs, style):
    """add() keeps a block of steps per env and writes it to the store in one extend(): blocks of 3 rows here,
    so they end mid-episode, at episode ends and when an env's next obs starts a new episode. Whatever reads
    the store (sample, buffer.store) sees every add made before it."""
    internals.sb3_block_rows(monkeypatch, 3)
    rng = np.random.default_rng(7)
    streams = [atari_segments(e, 6, rng) for e in range(n_envs)]
    buf = sb3.ReplayBuffer(5000, spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(6), device="cpu",
                           n_envs=n_envs, n_steps=2, gamma=GAMMA, handle_timeout_termination=style == "sb3",
                           path=tmp_path / "s", chunk_size=48)
    with _closing(buf):
        steps = min(sum(s.T for s in segs) for segs in streams) - 3
        sure, maybe = feed(buf, streams, 4, "zeros", "first", style, steps, 2, GAMMA)
        assert buf.store.id_range == (0, steps * n_envs)  # every add is in the store once it is read
        check_buffer(buf, sure, maybe)
    # one add at a time: the next sample() draws from a store that holds it
    box = spaces.Box(-1e9, 1e9, (2,), np.float32)
    flat = sb3.ReplayBuffer(100, box, box, device="cpu", path=tmp_path / "f")
    with _closing(flat):
        o = np.zeros((1, 2), np.float32)
        for i in range(7):
            flat.add(o + i, o + i + 1, o, np.array([float(i)]), np.array([i == 4]), [{}])
            assert flat.sample(256).rewards.max().item() == i
        assert len(flat.store) == 7 and len(flat.store.episodes()) == 2


def test_cuda_samples_are_the_host_paths(sb3, spaces, tmp_path):
    """On a CUDA device ``sample()`` takes the device feed: its tensors are on the GPU and equal, tensor for
    tensor, what the host path makes of the same rows."""
    torch = require("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (none here): check_buffer runs the same conversion on CPU tensors")
    rng = np.random.default_rng(3)
    streams = [atari_segments(e, 6, rng) for e in range(2)]
    buf = sb3.ReplayBuffer(10_000, spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(6), device="cuda",
                           n_envs=2, n_steps=3, gamma=GAMMA, path=tmp_path / "s", chunk_size=256)
    with _closing(buf):
        steps = min(sum(s.T for s in segs) for segs in streams) - 3
        sure, maybe = feed(buf, streams, 4, "zeros", "first", "sb3", steps, 3, GAMMA)
        for _ in range(5):
            s = buf.sample(64)
            assert all(t.device.type == "cuda" for t in s if t is not None)
            host = type(s)(*(None if t is None else t.cpu() for t in s))
            assert set(sample_keys(host, 3)) <= set(sure + maybe)
        batch = internals.sb3_device_feed(buf).next(64)
        got = internals.sb3_device_samples(buf, batch)
        want = internals.sb3_samples(buf, buf.store.gather(batch.index.cpu().numpy()))
        for got_t, want_t in zip(got, want, strict=True):
            assert (got_t is None) == (want_t is None)
            if want_t is not None:
                assert got_t.dtype == want_t.dtype and got_t.shape == want_t.shape
                assert torch.equal(got_t.cpu(), want_t.cpu())


def test_timeouts_as_terminations_without_handling(sb3, spaces, tmp_path):
    rng = np.random.default_rng(5)
    streams = [atari_segments(0, 8, rng)]
    buf = sb3.ReplayBuffer(5000, spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(6), device="cpu",
                           handle_timeout_termination=False, n_steps=2, gamma=GAMMA, path=tmp_path / "s")
    with _closing(buf):
        sure, maybe = feed(buf, streams, 4, "zeros", "first", "sb3", sum(s.T for s in streams[0]), 2, GAMMA)
        check_buffer(buf, sure, maybe)


def test_termination_with_the_next_episodes_stack_as_next_obs(sb3, spaces, tmp_path):
    # CleanRL on Gymnasium 0.29 without infos["final_observation"]: the termination is kept and next_obs's
    # newest frame stored as the final one (no target reads it: dones=1)
    seg = next(iter(episodes("pong")))
    a = Segment(seg.frames[:10], seg.actions[:9], seg.rewards[:9], "terminated")
    b = Segment(seg.frames[60:70], seg.actions[60:69], seg.rewards[60:69], "truncated")
    buf = sb3.ReplayBuffer(100, spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(6), device="cpu",
                           handle_timeout_termination=False, pad="first", path=tmp_path / "s")
    with _closing(buf):
        for t in range(a.T):
            last = t + 1 == a.T
            nxt = stack_of(b, 0, 4, "first", "first") if last else stack_of(a, t + 1, 4, "first", "first")
            buf.add(stack_of(a, t, 4, "first", "first")[None], nxt[None], np.array([a.actions[t]]),
                    np.array([a.rewards[t]]), np.array([last]), {"lives": np.array([3])})
        buf.add(stack_of(b, 0, 4, "first", "first")[None], stack_of(b, 1, 4, "first", "first")[None],
                np.array([b.actions[0]]), np.array([b.rewards[0]]), np.array([False]), {})
        assert buf.store.id_range == (0, a.T + 1)
        got = buf.sample(64)
        ends = got.dones[:, 0].numpy() == 1
        assert ends.any()
        for nxt in got.next_observations[ends].numpy():
            assert np.array_equal(nxt[:3], a.frames[a.T - 3:a.T]) and np.array_equal(nxt[3], b.frames[0])


@pytest.mark.parametrize("pad, style", [("zeros", "sb3"), ("first", "cleanrl")])
def test_short_add_path_stores_what_the_general_one_does(sb3, spaces, tmp_path, monkeypatch, pad, style):
    """add() of one env whose episode goes on takes a short path (_add_step); the same adds through the
    general path alone leave the same store: the same transitions, ids, episodes and pending stacks."""
    internals.sb3_block_rows(monkeypatch, 5)
    rng = np.random.default_rng(3)
    streams = [atari_segments(1, 8, rng)]
    steps = sum(s.T for s in streams[0]) - 2
    bufs, short = [], []
    for fast in (True, False):
        buf = sb3.ReplayBuffer(5000, spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(6), device="cpu",
                               n_steps=2, gamma=GAMMA, handle_timeout_termination=style == "sb3",
                               path=tmp_path / f"s{fast}", chunk_size=64)
        internals.sb3_short_adds(monkeypatch, buf, fast, short)
        feed(buf, streams, 4, pad, "first", style, steps, 2, GAMMA)
        bufs.append(buf)
    assert short.count(True) > steps // 2 and len(short) == steps  # (the general path's buffer never asks)
    try:
        a, b = (x.store for x in bufs)
        assert a.id_range == b.id_range == (0, steps) and len(a.episodes()) == len(b.episodes())
        ids = a.sampleable_ids()
        assert np.array_equal(ids, b.sampleable_ids()) and ids.size > 100
        ga, gb = a.gather(ids), b.gather(ids)
        for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "discount"):
            assert np.array_equal(getattr(ga, name), getattr(gb, name)), name
        assert internals.sb3_last_next_obs(bufs[0]) == internals.sb3_last_next_obs(bufs[1])
    finally:
        for buf in bufs:
            buf.close(commit=False)


class _closing:
    def __init__(self, buf):
        self.buf = buf

    def __enter__(self):
        return self.buf

    def __exit__(self, *exc):
        self.buf.close(commit=False)


def test_bad_stacks_are_refused_and_write_nothing(sb3, spaces, tmp_path):
    seg = next(iter(episodes("pong")))
    s = Segment(seg.frames[:20], seg.actions[:19], seg.rewards[:19], "truncated")
    box = spaces.Box(0, 255, (4, 84, 84), np.uint8)
    buf = sb3.ReplayBuffer(100, box, spaces.Discrete(6), device="cpu", path=tmp_path / "a", pad="zeros")
    with _closing(buf):
        first = stack_of(s, 0, 4, "first", "first")  # padded with copies: not what pad="zeros" stores
        with pytest.raises(ValueError, match="pad='first'"):
            buf.add(first[None], stack_of(s, 1, 4, "first", "first")[None], np.array([0]), np.array([0.0]),
                    np.array([False]), [{}])
        skip = np.stack([s.frames[i] for i in (0, 2, 4, 6)])  # every other frame: not consecutive
        skip_next = np.stack([s.frames[i] for i in (2, 4, 6, 8)])
        buf.add(stack_of(s, 0, 4, "zeros", "first")[None], stack_of(s, 1, 4, "zeros", "first")[None],
                np.array([1]), np.array([1.0]), np.array([False]), [{}])
        with pytest.raises(ValueError, match="frame_stack=1"):
            buf.add(stack_of(s, 1, 4, "zeros", "first")[None], skip_next[None], np.array([0]), np.array([0.0]),
                    np.array([False]), [{}])
        with pytest.raises(ValueError, match="frame_stack=1"):  # a new episode whose stack is not a start
            buf.add(skip[None], skip_next[None], np.array([0]), np.array([0.0]), np.array([False]), [{}])
        with pytest.raises(ValueError, match=r"expected \(1, 4, 84, 84\)"):
            buf.add(first[None, :3], first[None, :3], np.array([0]), np.array([0.0]), np.array([False]), [{}])
        with pytest.raises(ValueError):  # an action the action dtype cannot take
            buf.add(stack_of(s, 1, 4, "zeros", "first")[None], stack_of(s, 2, 4, "zeros", "first")[None],
                    np.array(["left"]), np.array([0.0]), np.array([False]), [{}])
        with pytest.raises(ValueError, match="finite"):  # (refused at add(), not when its block is written)
            buf.add(stack_of(s, 1, 4, "zeros", "first")[None], stack_of(s, 2, 4, "zeros", "first")[None],
                    np.array([0]), np.array([np.inf]), np.array([False]), [{}])
        with pytest.raises(ValueError, match="handle_timeout_termination=False"):  # timeouts need SB3's list
            buf.add(stack_of(s, 1, 4, "zeros", "first")[None], stack_of(s, 2, 4, "zeros", "first")[None],
                    np.array([0]), np.array([0.0]), np.array([False]), {"lives": np.array([3])})
        assert internals.sb3_pending_counts(buf) == [1]  # the accepted add waits in its block, the refused ones are not in it
        assert buf.store.id_range == (0, 1) and buf.size() == 1  # the refused calls wrote nothing
        buf.add(stack_of(s, 1, 4, "zeros", "first")[None], stack_of(s, 2, 4, "zeros", "first")[None],
                np.array([2]), np.array([2.0]), np.array([False]), [{}])  # the episode goes on after them
        assert buf.store.id_range == (0, 2) and len(buf.store.episodes()) == 1
    whole = sb3.ReplayBuffer(100, box, spaces.Discrete(6), device="cpu", path=tmp_path / "b", frame_stack=1)
    with _closing(whole):
        whole.add(skip[None], skip_next[None], np.array([0]), np.array([0.0]), np.array([True]), [{}])
        got = whole.sample(1)
        assert np.array_equal(got.observations[0].numpy(), skip)
        assert np.array_equal(got.next_observations[0].numpy(), skip_next)


# -- flat observations, continuous actions ---------------------------------------------------------------
@pytest.mark.parametrize("n_envs, n, style", [(1, 1, "sb3"), (4, 3, "sb3"), (2, 2, "cleanrl")])
def test_flat_box_round_trip(sb3, spaces, tmp_path, n_envs, n, style):
    rng = np.random.default_rng(n_envs)
    streams = [flat_segments(e, 30, rng) for e in range(n_envs)]
    buf = sb3.ReplayBuffer(10_000, spaces.Box(-10, 10, (3,), np.float32), spaces.Box(-2, 2, (1,), np.float32),
                           device="cpu", n_envs=n_envs, n_steps=n, gamma=GAMMA,
                           handle_timeout_termination=style == "sb3")
    try:
        steps = min(sum(s.T for s in segs) for segs in streams) - 2
        sure, maybe = feed(buf, streams, 1, "zeros", "first", style, steps, n, GAMMA)
        check_buffer(buf, sure, maybe)
        assert buf.sample(8).actions.dtype == __import__("torch").float32
    finally:
        path = buf.store.path
        buf.close()
        assert not os.path.exists(path)  # the temporary store is removed


def test_vecnormalize_like_sb3(sb3, spaces, tmp_path):
    gym = require("gymnasium")
    require("torch")
    from stable_baselines3.common.buffers import ReplayBuffer as SB3Buffer
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    norm = VecNormalize(DummyVecEnv([lambda: gym.make("Pendulum-v1")]), gamma=0.9)
    norm.seed(0)
    norm.reset()
    for _ in range(50):  # running statistics that are not the identity
        norm.step(np.array([[0.5]], np.float32))
    obs_space, act_space = norm.observation_space, norm.action_space
    mine = sb3.ReplayBuffer(100, obs_space, act_space, device="cpu", path=tmp_path / "s")
    theirs = SB3Buffer(100, obs_space, act_space, device="cpu")
    o = np.array([[0.3, -0.2, 1.5]], np.float32)
    for b in (mine, theirs):
        b.add(o, o + 1, np.array([[0.5]]), np.array([2.0]), np.array([True]), [{}])
    for x, y in zip(mine.sample(4)[:5], theirs.sample(4)[:5], strict=True):  # without VecNormalize too
        assert x.dtype == y.dtype and x.shape == y.shape
    a, b = mine.sample(4, env=norm), theirs.sample(4, env=norm)
    assert not np.allclose(a.observations.numpy(), o)  # normalized
    for x, y in zip(a[:5], b[:5], strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.array_equal(x.numpy(), y.numpy())
    mine.close()


def test_cpu_samples_stay_as_drawn(sb3, spaces, tmp_path):
    """CPU samples wrap the batch's arrays without a copy: later samples never write into a sample still held
    (the store's reader reuses an output buffer only once nothing references it)."""
    torch = require("torch")
    seg = next(iter(episodes("pong")))
    box = spaces.Box(0, 255, (4, 84, 84), np.uint8)
    buf = sb3.ReplayBuffer(1000, box, spaces.Discrete(6), device="cpu", path=tmp_path / "s", pad="zeros")
    with _closing(buf):
        for t in range(60):
            buf.add(stack_of(seg, t, 4, "zeros", "first")[None], stack_of(seg, t + 1, 4, "zeros", "first")[None],
                    np.array([t % 6]), np.array([float(t)]), np.array([False]), [{}])
        held = [buf.sample(32) for _ in range(4)]
        copies = [[t.clone() for t in s[:5]] for s in held]
        for _ in range(20):
            buf.sample(32)
        for s, c in zip(held, copies, strict=True):
            for t, u in zip(s[:5], c, strict=True):
                assert torch.equal(t, u)


# -- SB3 algorithms --------------------------------------------------------------------------------------
def _side_env(gym, spaces):
    """A 36x36 image env (NatureCNN's smallest) whose lit half says which action pays."""

    class Side(gym.Env):
        observation_space = spaces.Box(0, 255, (36, 36, 1), np.uint8)
        action_space = spaces.Discrete(2)

        def _obs(self):
            img = np.zeros((36, 36, 1), np.uint8)
            img[:, self.side * 18:(self.side + 1) * 18] = 255
            return img

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.side, self.t = int(self.np_random.integers(2)), 0
            return self._obs(), {}

        def step(self, action):
            reward = 1.0 if int(action) == self.side else 0.0
            self.t += 1
            self.side = int(self.np_random.integers(2))
            return self._obs(), reward, False, self.t >= 10, {}

    return Side


def test_dqn_cnn_learns(sb3, spaces, tmp_path):
    gym = require("gymnasium")
    th = require("torch")
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
    from stable_baselines3.common.vec_env import VecFrameStack

    class Small(BaseFeaturesExtractor):  # a CnnPolicy with a small conv net: the test stays a few seconds
        def __init__(self, space):
            super().__init__(space, 16)
            self.net = th.nn.Sequential(th.nn.Conv2d(space.shape[0], 8, 6, stride=6), th.nn.ReLU(),
                                        th.nn.Flatten(), th.nn.Linear(8 * 6 * 6, 16), th.nn.ReLU())

        def forward(self, x):
            return self.net(x)

    th.set_num_threads(1)
    env = VecFrameStack(make_vec_env(_side_env(gym, spaces), n_envs=1, seed=0), 4)
    model = DQN("CnnPolicy", env, buffer_size=2000, learning_starts=200, train_freq=4, batch_size=32,
                exploration_fraction=0.3, target_update_interval=100, learning_rate=5e-4, gamma=0.0, seed=0,
                replay_buffer_class=sb3.ReplayBuffer, replay_buffer_kwargs=dict(path=tmp_path / "s"),
                policy_kwargs=dict(net_arch=[], features_extractor_class=Small))
    assert isinstance(model.replay_buffer, sb3.ReplayBuffer)
    model.learn(2000)
    buf = model.replay_buffer
    assert buf.store.schema.stack == 4 and buf.store.schema.obs_shape == (36, 36)  # one frame per step stored
    env2 = _side_env(gym, spaces)()
    from stable_baselines3.common.vec_env import DummyVecEnv
    test = VecFrameStack(DummyVecEnv([lambda: env2]), 4)
    obs, right = test.reset(), 0
    for _ in range(100):
        side = env2.side
        action, _ = model.predict(obs, deterministic=True)
        right += int(action[0] == side)
        obs, *_ = test.step(action)
    assert right >= 80  # chance is 50
    buf.close()


def test_sac_runs_on_it(sb3, tmp_path):
    require("torch")
    from stable_baselines3 import SAC

    model = SAC("MlpPolicy", "Pendulum-v1", buffer_size=1000, learning_starts=50, batch_size=16, seed=0,
                replay_buffer_class=sb3.ReplayBuffer, replay_buffer_kwargs=dict(n_steps=3, gamma=0.99),
                policy_kwargs=dict(net_arch=[16]))
    model.learn(150)
    s = model.replay_buffer.sample(8)
    assert s.actions.shape == (8, 1) and s.discounts is not None and s.discounts.shape == (8, 1)
    assert model.replay_buffer.store.id_range[1] == 150
    model.replay_buffer.close()


def test_save_and_load_resume_exactly(sb3, spaces, tmp_path):
    require("torch")
    import torch as th
    from stable_baselines3 import SAC

    model = SAC("MlpPolicy", "Pendulum-v1", buffer_size=1000, learning_starts=20, batch_size=16, seed=0,
                replay_buffer_class=sb3.ReplayBuffer, replay_buffer_kwargs=dict(path=tmp_path / "store"),
                policy_kwargs=dict(net_arch=[16]))
    model.learn(100)
    model.save(tmp_path / "model.zip")
    model.save_replay_buffer(tmp_path / "buffer.pkl")
    assert os.path.getsize(tmp_path / "buffer.pkl") < 20_000  # the location and state, never the frames
    buf = model.replay_buffer
    then = [buf.sample(16) for _ in range(3)]  # the sampling that follows the pickle
    state = (buf.pos, buf.full, buf.store.id_range)
    model.learn(30, reset_num_timesteps=False)  # moves on past the checkpoint, then the run "dies"
    loaded = SAC.load(tmp_path / "model.zip", env=model.get_env())
    loaded.load_replay_buffer(tmp_path / "buffer.pkl")  # in the same process: takes the store over
    again = loaded.replay_buffer
    assert buf.store.closed  # the old buffer let go of it
    assert (again.pos, again.full, again.store.id_range) == state
    for a, b in zip(then, (again.sample(16) for _ in range(3)), strict=True):
        for x, y in zip(a[:5], b[:5], strict=True):
            assert th.equal(x, y)
    loaded.learn(20, reset_num_timesteps=False)  # and training continues on it
    assert again.store.id_range[1] == state[2][1] + 20
    again.close(commit=False)


def test_a_buffer_collected_while_another_registers_its_store_does_not_hang(sb3, spaces, tmp_path, monkeypatch):
    """A buffer dropped in a reference cycle is closed by its finalizer at a later garbage collection, which
    can start at any allocation: here one made while a new buffer registers its store, holding the lock
    that closing takes too."""
    import gc
    import threading

    import mmreplay as mr

    box = spaces.Box(-1, 1, (2,), np.float32)
    old = sb3.ReplayBuffer(100, box, box, device="cpu", path=tmp_path / "old")
    old.add(np.zeros((1, 2), np.float32), np.ones((1, 2), np.float32), np.zeros((1, 2), np.float32),
            np.array([1.0]), np.array([False]), [{}])
    store = old.store
    old.cycle = old  # unreachable once dropped, but only a collection frees it
    gc.collect()
    gc.disable()
    try:
        del old
        found = internals.sb3_collect_when_registering(monkeypatch)
        made = []
        thread = threading.Thread(target=lambda: made.append(
            sb3.ReplayBuffer(100, box, box, device="cpu", path=tmp_path / "new")), daemon=True)
        thread.start()
        thread.join(120)  # (a hang detector)
    finally:
        gc.enable()
    assert not thread.is_alive(), "a finalizer run inside the registration waited for the lock held there"
    assert found and found[0] > 0 and store.closed  # the collection ran there and closed the dropped buffer
    made[0].close()
    with mr.ReplayStore.open(tmp_path / "old", mode="r") as st:
        assert st.id_range == (0, 1)  # closed as close() would: what it held committed


@pytest.mark.parametrize("n_envs", [1, 2])
def test_observations_of_the_right_size_but_another_shape_are_refused(sb3, spaces, tmp_path, n_envs):
    """Channels-last frames given to a channels-first space (a VecTransposeImage left out) have the right
    number of values: SB3's buffer refuses them (they do not broadcast), and so does this one, writing
    nothing; the observation without its env axis (one env) is taken, as SB3 takes it."""
    space = spaces.Box(0, 255, (3, 10, 14), np.uint8)
    act = spaces.Discrete(4)
    buf = sb3.ReplayBuffer(100, space, act, device="cpu", n_envs=n_envs, path=tmp_path / "s")
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256, (n_envs, 3, 10, 14), dtype=np.uint8)
    nxt = rng.integers(0, 256, (n_envs, 3, 10, 14), dtype=np.uint8)
    a, r, d = np.zeros(n_envs, np.int64), np.ones(n_envs, np.float32), np.zeros(n_envs, bool)
    infos = [{}] * n_envs
    for bad in (obs.transpose(0, 2, 3, 1), obs.reshape(n_envs, 3 * 10 * 14)):
        with pytest.raises(ValueError, match=rf"obs has shape .*expected \({n_envs}, 3, 10, 14\)"):
            buf.add(bad, nxt, a, r, d, infos)
    with pytest.raises(ValueError, match="next_obs has shape"):
        buf.add(obs, nxt.transpose(0, 2, 3, 1), a, r, d, infos)
    assert buf.size() == 0
    buf.add(obs, nxt, a, r, d, infos)
    if n_envs == 1:
        buf.add(nxt[0], obs[0], a, r, d, infos)  # (no env axis)
    assert buf.size() == (2 if n_envs == 1 else 1)
    got = internals.sb3_samples(buf, buf.store.gather(buf.store.sampleable_ids()))
    assert np.array_equal(got.observations.numpy()[:n_envs], obs)
    buf.close()


def test_every_env_keeps_its_recent_steps(sb3, spaces, tmp_path):
    """Adds of several envs, long enough for the store to retire its oldest rows, with nothing sampled (as
    before ``learning_starts``): each env keeps about its share of the newest steps, as SB3's buffer keeps
    the last ``buffer_size // n_envs`` of each (the envs' pending blocks are written one after the other, so
    a block's rows get later ids than the other envs' rows of the same steps: kept short against the
    capacity, they cannot make the oldest ids an env's newest steps)."""
    n, capacity, steps = 4, 200, 2000
    box = spaces.Box(-1, 1, (3,), np.float32)
    buf = sb3.ReplayBuffer(capacity, box, spaces.Discrete(2), device="cpu", n_envs=n, path=tmp_path / "s",
                           chunk_size=16)
    o = np.zeros((n, 3), np.float32)
    for t in range(steps):  # (the reward names the env and the step)
        buf.add(o + t, o + t + 1, np.zeros(n, np.int64), (np.arange(n) + 10 * t).astype(np.float32),
                np.zeros(n, bool), [{}] * n)
    st = buf.store
    code = st.gather(st.sampleable_ids()).reward.astype(np.int64)
    env, step = code % 10, code // 10
    share = capacity // n
    assert len(code) >= capacity - n
    for i in range(n):
        kept = np.sort(step[env == i])
        assert kept.size >= share * 3 // 4, (i, kept.size)
        assert kept[-1] == steps - 1 and np.array_equal(kept, np.arange(kept[0], steps))  # its newest, none skipped
    buf.close()


@pytest.mark.parametrize("buffer_size,adds", [(100, 1500), (4800, 6000)])
def test_the_sampled_window_stays_near_buffer_size(sb3, spaces, tmp_path, buffer_size, adds):
    """SB3 samples from the last ``buffer_size`` transitions; the store keeps at least that many and up to
    two chunks more, its chunk (without a ``chunk_size``) held to 1/16 of ``buffer_size``, at least 256 rows:
    small observations no longer make the window many times larger (100: 7,773 kept, with chunks of at least
    ~1 MiB of frames)."""
    box = spaces.Box(-1, 1, (4,), np.float32)
    buf = sb3.ReplayBuffer(buffer_size, box, spaces.Discrete(2), device="cpu", path=tmp_path / "s")
    o = np.zeros((1, 4), np.float32)
    for t in range(adds):
        buf.add(o + t, o + t + 1, np.array([1]), np.array([float(t)]), np.array([t % 97 == 96]), [{}])
    kept = buf.store.gather(buf.store.sampleable_ids()).reward
    chunk = max(256, buffer_size // 16)
    assert buffer_size <= len(buf.store) <= buffer_size + 2 * chunk + 1
    assert kept.max() == adds - 1 and kept.min() >= adds - buffer_size - 2 * chunk - 1
    buf.close(commit=False)


def test_loading_a_stale_pickle_leaves_the_live_buffer_alone(sb3, spaces, tmp_path):
    """``load_replay_buffer`` of an older pickle of the buffer this process still holds raises, and the live
    buffer goes on with its adds (it used to be closed first, its adds since the last pickle dropped)."""
    import mmreplay as mr

    box = spaces.Box(-1, 1, (2,), np.float32)
    buf = sb3.ReplayBuffer(100, box, box, device="cpu", path=tmp_path / "s")
    o = np.zeros((1, 2), np.float32)
    for i in range(9):
        if i == 3:
            blob = pickle.dumps(buf)  # the pickle loaded by mistake below
        if i == 6:
            pickle.dumps(buf)  # a newer one: the store is committed after the first
        buf.add(o + i, o + i + 1, o, np.array([1.0]), np.array([False]), [{}])
    with pytest.raises(ValueError, match="committed after this buffer was pickled"):
        pickle.loads(blob)
    assert not buf.store.closed and buf.size() == 9
    buf.add(o + 9, o + 10, o, np.array([1.0]), np.array([False]), [{}])
    buf.close(commit=True)
    with mr.ReplayStore.open(tmp_path / "s", mode="r") as st:
        assert st.id_range == (0, 10)


def test_close_keeps_the_paired_commit(sb3, spaces, tmp_path):
    import mmreplay as mr

    box = spaces.Box(-1, 1, (2,), np.float32)
    buf = sb3.ReplayBuffer(100, box, box, device="cpu", path=tmp_path / "s")
    o = np.zeros((1, 2), np.float32)
    for i in range(5):
        buf.add(o + i, o + i + 1, o, np.array([1.0]), np.array([False]), [{}])
    blob = pickle.dumps(buf)
    for i in range(5, 8):
        buf.add(o + i, o + i + 1, o, np.array([1.0]), np.array([False]), [{}])
    with pytest.warns(UserWarning, match="3 add"):
        buf.close()
    assert buf.store.closed  # (the 3 adds, never written, stay dropped)
    with mr.ReplayStore.open(tmp_path / "s", mode="r") as st:
        assert st.id_range == (0, 5)
    again = pickle.loads(blob)
    assert again.pos == 5 and again.store.id_range == (0, 5)
    again.add(o + 5, o + 6, o, np.array([1.0]), np.array([True]), [{}])  # continues the open episode
    assert len(again.store) == 6 and len(again.store.episodes()) == 1  # one episode across the reopen
    again.close(commit=True)  # keeps them: the old pickle no longer matches the store
    with pytest.raises(ValueError, match="committed after this buffer was pickled"):
        pickle.loads(blob)
    never = sb3.ReplayBuffer(100, box, box, device="cpu", path=tmp_path / "t")
    never.add(o, o + 1, o, np.array([1.0]), np.array([False]), [{}])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        never.close()  # never pickled: commits what it holds
    with mr.ReplayStore.open(tmp_path / "t", mode="r") as st:
        assert st.id_range == (0, 1)


CHILD = r"""
import pickle, sys
import numpy as np
from gymnasium import spaces
import mmreplay.sb3 as sb3
box = spaces.Box(-1e9, 1e9, (2,), np.float32)
buf = sb3.ReplayBuffer(10_000, box, box, device="cpu", path=sys.argv[1], n_steps=2, gamma=0.5)
o = np.zeros((1, 2), np.float32)
i = 0
while True:
    buf.add(o + i, o + i + 1, o - i, np.array([float(i)]), np.array([i % 37 == 36]), [{}])
    i += 1
    if i == 300:
        with open(sys.argv[2], "wb") as f:
            pickle.dump(buf, f)
        print("P", flush=True)
"""


def test_kill_9_reopens_at_the_last_pickle(sb3, tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "s"), str(tmp_path / "b.pkl")],
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "P"
    time.sleep(0.3)  # it goes on adding past the pickle
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with open(tmp_path / "b.pkl", "rb") as f:
        buf = pickle.load(f)
    assert buf.pos == 300 and buf.store.id_range == (0, 300)
    rows = internals.sb3_samples(buf, buf.store.gather(buf.store.sampleable_ids()))
    i = rows.observations[:, 0].numpy().astype(np.int64)
    m = np.where(i % 37 == 36, 1, 2)  # the window is cut by the episode's end
    assert np.array_equal(np.sort(i), np.arange(299))  # the last transition's 2-step window waits for an add
    assert np.array_equal(rows.next_observations[:, 0].numpy(), i + m)
    assert np.allclose(rows.rewards[:, 0].numpy(), np.where(m == 1, i, i + 0.5 * (i + 1)))
    assert np.array_equal(rows.dones[:, 0].numpy(), (i % 37 >= 35).astype(np.float32))
    assert np.array_equal(rows.actions[:, 0].numpy(), -i)
    buf.add(np.full((1, 2), 300, np.float32), np.full((1, 2), 301, np.float32), np.zeros((1, 2)),
            np.array([300.0]), np.array([False]), [{}])
    assert len(buf.store) == 300
    buf.close(commit=False)


def test_reset_mid_episode_goes_on_with_stacks(sb3, spaces, tmp_path):
    """``reset()`` empties the buffer while the env keeps stepping (SB3 takes the next add as usual): with
    stacked frames the next stack still holds frames added before the reset, and it is stored whole."""
    space = spaces.Box(0, 255, (4, 10, 14), np.uint8)
    buf = sb3.ReplayBuffer(100, space, spaces.Discrete(3), device="cpu", path=tmp_path / "s")
    frames = np.random.default_rng(0).integers(0, 256, (40, 10, 14), dtype=np.uint8)

    def stack(t):  # the newest four frames up to t, zeros before the episode's first
        return np.stack([frames[i] if i >= 0 else np.zeros((10, 14), np.uint8) for i in range(t - 3, t + 1)])[None]

    added = []
    for t in range(30):
        if t == 20:
            buf.reset()
            added.clear()
        buf.add(stack(t), stack(t + 1), np.array([t % 3]), np.array([float(t)]), np.array([False]), [{}])
        added.append(t)
    assert buf.size() == 10
    got = internals.sb3_samples(buf, buf.store.gather(buf.store.sampleable_ids()))
    assert got.rewards[:, 0].tolist() == [float(t) for t in added]
    for row, t in enumerate(added):
        assert np.array_equal(got.observations[row].numpy(), stack(t)[0])
        assert np.array_equal(got.next_observations[row].numpy(), stack(t + 1)[0])
    buf.close(commit=False)


def test_a_copy_is_refused_and_the_buffer_goes_on(sb3, spaces, tmp_path):
    """``copy.copy``/``copy.deepcopy`` would go through pickling, whose load closes the buffer this process
    holds on the same store: refused with a clear error, and the buffer goes on."""
    import copy

    box = spaces.Box(-1, 1, (2,), np.float32)
    buf = sb3.ReplayBuffer(100, box, box, device="cpu", path=tmp_path / "s")
    o = np.zeros((1, 2), np.float32)
    buf.add(o, o + 1, o, np.array([1.0]), np.array([False]), [{}])
    for fn in (copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="cannot be copied.*ReplayStore.open"):
            fn(buf)
    assert not buf.store.closed
    buf.add(o + 1, o + 2, o, np.array([1.0]), np.array([False]), [{}])
    assert buf.size() == 2
    buf.close(commit=False)


def test_dones_cut_and_reset_empty(sb3, spaces, tmp_path):
    box = spaces.Box(-1e6, 1e6, (2,), np.float32)
    buf = sb3.ReplayBuffer(100, box, box, device="cpu", path=tmp_path / "s", optimize_memory_usage=True)
    o = np.zeros((1, 2), np.float32)
    for i in range(3):
        buf.add(o + i, o + i + 1, o, np.array([1.0]), np.array([False]), [{}])
    buf.dones[buf.pos - 1] = True  # what SB3's learn() writes before it resets the env
    buf.add(o + 3, o + 4, o, np.array([1.0]), np.array([True]), [{}])  # obs continues, yet a new episode starts
    table = buf.store.episodes()
    assert len(table) == 2 and bool(table.truncated[0])  # the first episode was cut, truncated
    assert len(buf.store) == 4 and buf.size() == 4
    buf.reset()
    assert buf.size() == 0 and len(buf.store) == 0  # nothing added before reset() is sampled again
    with pytest.raises(ValueError):
        buf.sample(1)
    buf.add(o + 9, o + 10, o, np.array([1.0]), np.array([True]), [{}])
    assert buf.sample(4).observations[:, 0].unique().tolist() == [9.0]
    buf.close(commit=False)
