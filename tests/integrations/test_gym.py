"""Gymnasium integration: stores shaped from envs, recorders equal to hand-written loops, Atari frames."""

from __future__ import annotations

import os

import numpy as np
import pytest

import mmreplay as mr
from tests._support.helpers import Pair, assert_same, require
from tests._support.model import ModelStore


@pytest.fixture(scope="module")
def gym():
    return require("gymnasium")


@pytest.fixture(scope="module")
def mg(gym):
    import mmreplay.gym as mg

    return mg


def drive(env, sinks, steps, seed, n_envs=None, reset_at=()):
    """Random actions from a seeded generator; the env's outputs also go to ``sinks`` (reset/step by hand)."""
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    for s in sinks:
        s.reset(obs)
    for i in range(steps):
        action = rng.integers(env.action_space.n) if n_envs is None else rng.integers(2, size=n_envs)
        obs, reward, terminated, truncated, _ = env.step(action)
        for s in sinks:
            s.step(action, reward, obs, terminated, truncated)
        if n_envs is None and (terminated or truncated or i in reset_at):
            obs, _ = env.reset()  # at reset_at: mid-episode, which ends the episode as truncated
            for s in sinks:
                s.reset(obs)


def test_from_env_infers_the_layout(gym, mg, tmp_path):
    env = gym.make("CartPole-v1")
    with mr.ReplayStore.from_env(env, tmp_path / "one", capacity=1000, n_step=2) as s:
        sch = s.schema
        assert (sch.obs_shape, sch.obs_dtype, sch.action_shape, sch.action_dtype) == ((4,), np.float32, (), np.int64)
        assert (sch.num_envs, sch.vector, sch.n_step) == (1, False, 2)
        assert s.metadata["env_id"] == "CartPole-v1"
    envs = gym.make_vec("CartPole-v1", num_envs=3)
    with mg.store_from_env(envs, tmp_path / "vec", capacity=1000, metadata={"run": 7}) as s:
        assert (s.schema.num_envs, s.schema.vector, s.schema.obs_shape) == (3, True, (4,))
        assert s.metadata == {"run": 7, "env_id": "CartPole-v1",
                              "action_space": {"type": "Discrete", "dtype": "int64", "start": 0, "n": 2}}
    box = gym.make("Pendulum-v1")
    with mr.ReplayStore.from_env(box, tmp_path / "box", capacity=100) as s:
        assert (s.schema.action_shape, s.schema.action_dtype) == ((1,), np.float32)


def _odd_env(gym, obs_space, act_space):
    class Odd(gym.Env):
        observation_space = obs_space
        action_space = act_space

    return Odd()


def test_unsupported_spaces_are_named(gym, mg, tmp_path):
    sp = gym.spaces
    box = sp.Box(-1, 1, (3,))
    with pytest.raises(TypeError, match="action space.*MultiDiscrete") as err:
        mg.store_from_env(_odd_env(gym, box, sp.MultiDiscrete([2, 3])), tmp_path / "a", capacity=10)
    assert "FlattenObservation" not in str(err.value)  # an observation wrapper: no help for actions
    assert "action_shape=(2,), action_dtype='int64'" in str(err.value)
    with pytest.raises(TypeError, match="observation space.*Dict") as err:
        mg.store_from_env(_odd_env(gym, sp.Dict({"x": box}), sp.Discrete(2)), tmp_path / "b", capacity=10)
    assert "FlattenObservation" in str(err.value)
    with pytest.raises(TypeError, match="action space.*Dict") as err:
        mg.store_from_env(_odd_env(gym, box, sp.Dict({"x": box, "y": sp.Discrete(4)})), tmp_path / "b", capacity=10)
    assert "FlattenObservation" not in str(err.value) and "action_shape=(7,)" in str(err.value)
    with pytest.raises(TypeError, match="gymnasium.Env"):
        mg.store_from_env(object(), tmp_path / "c", capacity=10)
    with pytest.raises(ValueError, match="obs_shape=.*conflicts"):
        mg.store_from_env(gym.make("CartPole-v1"), tmp_path / "d", capacity=10, obs_shape=(5,))


def test_the_action_space_hints_work(gym, tmp_path):
    """A store made as the MultiDiscrete / Dict hints say takes those actions, and returns them."""
    sp = gym.spaces
    multi, nested = sp.MultiDiscrete([2, 3]), sp.Dict({"x": sp.Box(-1, 1, (3,)), "y": sp.Discrete(4)})
    multi.seed(0)
    nested.seed(0)
    s = mr.ReplayStore.create(tmp_path / "m", capacity=10, obs_shape=(3,), obs_dtype="float32",
                              action_shape=(2,), action_dtype="int64")
    n = mr.ReplayStore.create(tmp_path / "n", capacity=10, obs_shape=(3,), obs_dtype="float32",
                              action_shape=(7,), action_dtype="float32")
    for store in (s, n):
        store.reset(np.zeros(3, np.float32))
    a, b = multi.sample(), nested.sample()
    s.step(a, 1.0, np.ones(3, np.float32), True, False)
    n.step(sp.flatten(nested, b), 1.0, np.ones(3, np.float32), True, False)
    assert np.array_equal(s.gather([0]).action[0], a)
    back = sp.unflatten(nested, n.gather([0]).action[0])
    assert np.allclose(back["x"], b["x"]) and back["y"] == b["y"]
    s.close()
    n.close()


def test_recorder_equals_a_hand_loop_on_cartpole(gym, mg, tmp_path):
    kw = dict(capacity=600, obs_shape=(4,), obs_dtype="float32", stack=3, n_step=3, gamma=0.9, chunk_size=256)
    rec_store = mr.ReplayStore.from_env(gym.make("CartPole-v1"), tmp_path / "rec", capacity=600, stack=3, n_step=3,
                                        gamma=0.9, chunk_size=256)
    drive(mg.RecordToStore(gym.make("CartPole-v1"), rec_store), [], 1500, seed=3, reset_at=(1390, 1450))
    hand = mr.ReplayStore.create(tmp_path / "hand", **kw)
    model = ModelStore(**kw)
    drive(gym.make("CartPole-v1"), [hand, model], 1500, seed=3, reset_at=(1390, 1450))
    assert rec_store.id_range[0] > 0, "nothing was evicted"
    assert_same(Pair(rec_store, model))
    ids = np.arange(*hand.id_range)
    ids = ids[np.isin(ids, model.sampleable_ids())]
    a, b = rec_store.gather(ids), hand.gather(ids)
    for name in ("obs", "next_obs", "action", "reward", "discount", "terminated", "truncated", "index"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    table = rec_store.episodes()
    assert table.truncated.any() and table.terminated.any()  # the mid-episode reset, and CartPole's falls
    rec_store.close()
    hand.close()


def test_vector_recorder_equals_the_model(gym, mg, tmp_path):
    envs = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync")
    store = mr.ReplayStore.from_env(envs, tmp_path / "v", capacity=3000, stack=2, n_step=2, gamma=0.95)
    drive(mg.RecordVectorToStore(envs, store), [], 400, seed=5, n_envs=3)
    model = ModelStore(capacity=3000, obs_shape=(4,), obs_dtype="float32", stack=2, n_step=2, gamma=0.95,
                       num_envs=3)
    drive(gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync"), [model], 400, seed=5, n_envs=3)
    assert store.episodes().ended.sum() >= 30  # many autoresets happened
    assert_same(Pair(store, model))
    store.close()


def test_other_autoreset_modes_are_refused_by_hand_loops(gym, mg, tmp_path):
    from gymnasium.vector import AutoresetMode

    for mode in (AutoresetMode.SAME_STEP, AutoresetMode.DISABLED):
        envs = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync",
                            vector_kwargs={"autoreset_mode": mode})
        with pytest.raises(ValueError, match=f"{mode.name}.*NEXT_STEP.*RecordVectorToStore.create") as err:
            mg.store_from_env(envs, tmp_path / mode.name, capacity=10)
        assert f"records {mode.name} exactly" in str(err.value)
    ok = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    with mg.store_from_env(ok, tmp_path / "ok", capacity=10) as store:
        rec = mg.RecordVectorToStore(ok, store)
        with pytest.raises(ValueError, match="reset_mask.*DISABLED.*NEXT_STEP"):
            rec.reset(options={"reset_mask": np.array([True, False])})


def _single_transitions(gym, n_envs, seed, actions):
    """What each env of a vector env seeded ``seed`` does, run as single envs: transitions and episode ends."""
    rows, ends = [], 0
    for i in range(n_envs):
        env = gym.make("CartPole-v1")
        obs, _ = env.reset(seed=seed + i)
        for a in actions[:, i]:
            nxt, r, term, trunc, _ = env.step(int(a))
            rows.append((obs.tobytes(), int(a), np.float32(r), nxt.tobytes(), bool(term), bool(trunc and not term)))
            obs = nxt
            if term or trunc:
                ends += 1
                obs, _ = env.reset()
    return sorted(rows), ends


def _stored_transitions(store):
    b = store.gather(store.sampleable_ids())
    return sorted((b.obs[j, -1].tobytes(), int(b.action[j]), b.reward[j], b.next_obs[j, -1].tobytes(),
                   bool(b.terminated[j]), bool(b.truncated[j])) for j in range(len(b)))


@pytest.mark.parametrize("mode", ["SAME_STEP", "DISABLED"])
def test_same_step_and_disabled_autoreset_are_recorded_exactly(gym, mg, tmp_path, mode):
    from gymnasium.vector import AutoresetMode

    n, steps, seed = 3, 300, 7
    actions = np.random.default_rng(0).integers(2, size=(steps, n))
    envs = gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": AutoresetMode[mode]})
    rec = mg.RecordVectorToStore.create(envs, tmp_path / "s", capacity=5000)
    with rec.store as store:
        rec.reset(seed=seed)
        for a in actions:
            _, _, term, trunc, _ = rec.step(a)
            if mode == "DISABLED" and (term | trunc).any():
                with pytest.raises(ValueError, match="reset_mask"):  # a finished env must be reset first
                    rec.step(a)
                rec.reset(options={"reset_mask": np.asarray(term | trunc)})
        want, ends = _single_transitions(gym, n, seed, actions)
        assert ends >= 10
        assert _stored_transitions(store) == want  # every transition, the final observations included
        assert int(store.episodes().ended.sum()) == ends  # one episode per real end, no more


def test_old_gymnasium_is_named_by_version(tmp_path):
    import subprocess
    import sys

    fake = tmp_path / "gymnasium"
    (fake / "vector").mkdir(parents=True)
    (fake / "__init__.py").write_text("__version__ = '0.29.1'\n")
    (fake / "spaces.py").write_text("")
    (fake / "vector" / "__init__.py").write_text("class VectorEnv: pass\nclass VectorWrapper: pass\n")
    path = os.pathsep.join([str(tmp_path), *sys.path])
    out = subprocess.run([sys.executable, "-c", "import mmreplay.gym"], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=path))
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "gymnasium 0.29.1" in last and "gymnasium>=1.1" in last and "mmreplay[gym]" not in last


def test_recorder_checks_the_store(gym, mg, tmp_path):
    env = gym.make("CartPole-v1")
    with mr.ReplayStore.create(tmp_path / "a", capacity=10, obs_shape=(3,), obs_dtype="float32") as s:
        with pytest.raises(ValueError, match="obs_shape"):
            mg.RecordToStore(env, s)
    with mr.ReplayStore.from_env(env, tmp_path / "b", capacity=10, extras={"x": ((), "float32")}) as s:
        with pytest.raises(ValueError, match="extras"):
            mg.RecordToStore(env, s)
        rec = mg.RecordToStore(env, s, extras=lambda info: {"x": np.float32(len(info) + 0.5)})
        rec.reset(seed=0)
        for _ in range(5):
            rec.step(0)
        assert np.array_equal(s.gather(np.arange(5)).extras["x"], np.full(5, 0.5, np.float32))
    with pytest.raises(TypeError, match="RecordVectorToStore"):
        mg.RecordToStore(gym.make_vec("CartPole-v1", num_envs=2), s)


def test_area_resize(mg):
    rng = np.random.default_rng(0)
    assert np.array_equal(mg.area_resize(np.full((210, 160), 77, np.uint8), 84, 84), np.full((84, 84), 77))
    x = rng.integers(0, 256, (8, 12)).astype(np.uint8)
    blocks = x.reshape(4, 2, 4, 3).astype(np.float64).mean(axis=(1, 3))
    assert np.abs(mg.area_resize(x, 4, 4).astype(np.float64) - blocks).max() <= 0.5 + 1e-4
    # 5 input rows onto 2 output rows: each covers 2.5 rows, so row 2 is split between them
    col = np.array([[0], [10], [20], [30], [40]], np.uint8)
    assert mg.area_resize(col, 2, 1).ravel().tolist() == [8, 32]  # (0+10+10)/2.5, (10+30+40)/2.5


def test_atari_frames_skip_and_max_pool(gym, mg):
    class Screen(gym.Env):
        """Frame i is all i*10; a reward of 1 per raw frame; terminates at raw frame 7."""

        observation_space = gym.spaces.Box(0, 255, (6, 6), np.uint8)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.i = 0
            return np.zeros((6, 6), np.uint8), {}

        def step(self, action):
            self.i += 1
            frame = np.full((6, 6), self.i * 10, np.uint8)
            frame[0, 0] = 255 if self.i % 2 else 0  # a flickering pixel: max-pooling keeps it
            return frame, 1.0, self.i == 7, False, {}

    env = mg.AtariFrames(Screen(), frame_skip=3, size=3, noop_max=0)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (3, 3) and obs.dtype == np.uint8
    obs, reward, terminated, _, _ = env.step(1)  # raw frames 1, 2, 3: max of 2 and 3
    assert reward == 3.0 and not terminated
    assert obs[1:, 1:].tolist() == [[30, 30], [30, 30]] and obs[0, 0] == round((255 + 30 * 3) / 4)
    env.step(1)  # raw 4..6
    obs, reward, terminated, _, _ = env.step(1)  # raw 7 ends the episode: one frame only
    assert (reward, terminated) == (1.0, True) and obs[2, 2] == 70


def test_atari_recorder_equals_a_hand_loop(gym, mg, tmp_path):
    require("ale_py")
    env = mg.make_atari("ALE/Pong-v5")
    assert env.observation_space.shape == (84, 84) and env.observation_space.dtype == np.uint8
    kw = dict(capacity=2000, stack=4, n_step=3, gamma=0.99, chunk_size=512)
    store = mr.ReplayStore.from_env(env, tmp_path / "rec", **kw)
    drive(mg.RecordToStore(env, store), [], 300, seed=11, reset_at=(120,))
    model = ModelStore(obs_shape=(84, 84), **kw)
    drive(mg.make_atari("ALE/Pong-v5"), [model], 300, seed=11, reset_at=(120,))
    assert_same(Pair(store, model))
    frames = store.gather(np.arange(200, 210)).obs
    assert frames.std() > 10 and not np.array_equal(frames[0, -1], frames[-1, -1])  # a real, moving screen
    store.close()


def _counting_env(gym, length=4, frames=None):
    """An env whose observation is (episode, step) and whose step info says the episode (its reset info says
    the next one): every frame and every info is identifiable. ``frames``: float frames in [0, 1] instead."""
    from gymnasium import spaces

    class Counting(gym.Env):
        def __init__(self):
            self.observation_space = (spaces.Box(0.0, 1.0, (2,), np.float32) if frames else
                                      spaces.Box(0.0, 1e6, (2,), np.float32))
            self.action_space = spaces.Discrete(2)
            self.ep, self.t = -1, 0

        def _obs(self):
            v = np.array([self.ep, self.t], np.float32)
            return v / 10.0 if frames else v

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.ep, self.t = self.ep + 1, 0
            return self._obs(), {"ep": np.float32(self.ep + 100)}  # (not the step's: a reset's info)

        def step(self, action):
            self.t += 1
            return self._obs(), 1.0, self.t == length, False, {"ep": np.float32(self.ep)}

    return Counting


def test_same_step_extras_of_an_ending_step_come_from_its_final_info(gym, mg, tmp_path):
    """SAME_STEP puts an ended env's step info in ``infos["final_info"]`` (``infos`` holds its next episode's
    reset info there): the extras of that last transition are computed from the step's own info."""
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    env_fn = _counting_env(gym)
    envs = SyncVectorEnv([env_fn, env_fn, env_fn], autoreset_mode=AutoresetMode.SAME_STEP)
    rec = mg.RecordVectorToStore.create(envs, tmp_path / "s", capacity=500, extras={"ep": ((), "float32")},
                                        extras_fn=lambda infos: {"ep": np.asarray(infos["ep"], np.float32)})
    with rec.store as store:
        rec.reset(seed=0)
        for _ in range(14):
            rec.step(np.zeros(3, np.int64))
        b = store.gather(store.sampleable_ids())
        ends = b.terminated.sum()
        assert ends >= 6
        assert np.array_equal(b.extras["ep"], b.obs[:, -1, 0])  # each transition's own episode, ends included


def _q(t):
    """Step ``t``'s frame value (t / 10 as float32) as a quantizing store keeps it."""
    return round(float(np.float32(t / 10)) * 255)


def test_recorders_leave_floating_frames_to_a_quantizing_store(gym, mg, tmp_path):
    """A store made with ``quantize=True`` takes floating frames in [0, 1] and stores round(x * 255); the
    recorders hand them over as they come (a cast to uint8 first stored zeros), and a frame out of range
    raises as ``step()`` does."""
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    env_fn = _counting_env(gym, frames=True)
    env = env_fn()
    with mr.ReplayStore.from_env(env, tmp_path / "a", capacity=100, obs_dtype="uint8", quantize=True) as s:
        rec = mg.RecordToStore(env, s)
        rec.reset(seed=0)
        for _ in range(3):
            rec.step(0)
        b = s.gather(s.sampleable_ids())
        assert b.obs.dtype == np.uint8 and b.next_obs[:, -1, 1].tolist() == [_q(t) for t in (1, 2, 3)]
    for mode in (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP):
        envs = SyncVectorEnv([env_fn, env_fn], autoreset_mode=mode)
        rec = mg.RecordVectorToStore.create(envs, tmp_path / mode.name, capacity=100, obs_dtype="uint8", quantize=True)
        with rec.store as s:
            rec.reset(seed=0)
            for _ in range(6):
                rec.step(np.zeros(2, np.int64))
            b = s.gather(s.sampleable_ids())
            steps = sorted(set(b.next_obs[:, -1, 1].tolist()))
            assert steps == [_q(t) for t in (1, 2, 3, 4)]  # every step's frame, quantized (none truncated to 0)
    far = _counting_env(gym, length=20, frames=True)()
    with mr.ReplayStore.from_env(far, tmp_path / "far", capacity=100, obs_dtype="uint8", quantize=True) as s:
        rec = mg.RecordToStore(far, s)
        rec.reset(seed=0)
        with pytest.raises(ValueError, match=r"quantize=True takes floating frames in \[0, 1\], got .*1\.1"):
            for _ in range(12):  # step 11 gives 1.1
                rec.step(0)
