"""mmreplay.ray on a local Ray cluster: writers, draws across actors, resume after a kill.

One cluster for the module (``ray.init`` costs seconds); the tests stay small.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import mmreplay as mr
from tests._support.helpers import require, wait_until

pytestmark = pytest.mark.ray

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_import_mmreplay_never_imports_ray():
    code = ("import sys, mmreplay, mmreplay.datasets, mmreplay.gym, mmreplay.cli.main; "
            "assert 'ray' not in sys.modules, sorted(m for m in sys.modules if m.startswith('ray'))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.fixture(scope="module")
def cluster():
    ray = require("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])}})
    yield ray
    ray.shutdown()


def _exited(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie, not yet reaped, has released its locks)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _episode_frames(env: int, episode: int, length: int) -> np.ndarray:
    """Frames [env, episode, t] for t = 0 .. length: every frame says where it belongs."""
    return np.array([[env, episode, t] for t in range(length + 1)], np.int32)


def test_several_writers_write_whole_episodes_into_their_own_streams(cluster, tmp_path):
    from mmreplay.ray import RemoteWriter, ReplayActor

    ray = cluster
    actor = ReplayActor.options(num_cpus=0).remote(str(tmp_path / "s"), capacity=10_000, obs_shape=(3,),
                                                   obs_dtype="int32", num_envs=2, stack=2, n_step=2,
                                                   chunk_size=64, extras={"t": ((), "int64")})

    @ray.remote(num_cpus=0)
    def write(env: int, lengths: list[int]) -> int:
        w = RemoteWriter(actor, env=env, block=7)
        for e, n in enumerate(lengths):
            frames = _episode_frames(env, e, n)
            w.reset(frames[0])
            for t in range(n):
                w.step(t % 3, float(env * 1000 + e * 100 + t), frames[t + 1], t == n - 1 and e % 2 == 0,
                       t == n - 1 and e % 2 == 1, t=t)
        return w.flush()

    lengths = {0: [5, 20, 13, 1, 30], 1: [40, 3, 17, 9]}
    ray.get([write.remote(env, lens) for env, lens in lengths.items()])
    ray.get(actor.commit.remote())
    ray.get(actor.close.remote())
    with mr.ReplayStore.open(tmp_path / "s", mode="r") as s:
        total = sum(sum(v) for v in lengths.values())
        assert s.id_range == (0, total)
        table = s.episodes()
        got = {(int(table.stream[i]), int(s.episode_frames(table, i, 0, 1)[0][1])): i for i in range(len(table))}
        assert sorted(got) == sorted((env, e) for env, lens in lengths.items() for e in range(len(lens)))
        for (env, e), i in got.items():
            n = lengths[env][e]
            np.testing.assert_array_equal(s.episode_frames(table, i), _episode_frames(env, e, n))
            steps = s.episode_steps(table, i)
            np.testing.assert_array_equal(steps.rewards, env * 1000 + e * 100 + np.arange(n))
            np.testing.assert_array_equal(steps.extras["t"], np.arange(n))
            assert bool(table.terminated[i]) == (e % 2 == 0)
        batch = s.gather(s.sampleable_ids())
        # every row's stack and next state come from the row's own env and episode, in order
        t = batch.extras["t"]
        env_of = batch.obs[:, -1, 0]
        ep_of = batch.obs[:, -1, 1]
        assert (batch.next_obs[:, -1, 0] == env_of).all() and (batch.next_obs[:, -1, 1] == ep_of).all()
        np.testing.assert_array_equal(batch.obs[:, -1, 2], t)
        base = (env_of * 1000 + ep_of * 100 + t).astype(np.float64)
        m = batch.next_obs[:, -1, 2] - t  # the 2-step window, shorter at an episode end
        np.testing.assert_array_equal(batch.reward, (base + np.where(m == 2, 0.99 * (base + 1), 0)).astype(np.float32))


def test_draws_across_actors_follow_their_sizes_and_priorities(cluster, tmp_path):
    from mmreplay.ray import ReplayActor, batches

    ray = cluster
    sizes = [300, 100]
    actors = []
    for k, n in enumerate(sizes):
        a = ReplayActor.options(num_cpus=0).remote(str(tmp_path / f"a{k}"), capacity=1000, obs_shape=(2,),
                                                   obs_dtype="int32", prioritized=mr.Prioritized(alpha=1.0, beta=1.0))
        ray.get(a.reset.remote(np.array([k, 0], np.int32)))
        ray.get(a.extend.remote(np.zeros(n, np.int64), np.ones(n), np.stack([[k, t + 1] for t in range(n)]).astype(np.int32),
                                np.arange(n) == n - 1, np.zeros(n, np.bool_)))
        actors.append(a)
    it = batches(actors, 40, prefetch=4, seed=0)
    rows = np.concatenate([next(it).actor for _ in range(50)])
    share = np.mean(rows == 0)
    assert abs(share - 0.75) < 0.05, share  # 300 : 100 transitions, equal priorities
    # give actor 1 nine times the priority of actor 0 per transition: its mass is now 3x actor 0's
    b = next(it)
    ids1 = ray.get(actors[1].call.remote("sampleable_ids"))
    ray.get(actors[1].update_priorities.remote(ids1, np.full(ids1.size, 9.0)))
    it.update_priorities(b, np.where(b.actor == 1, 9.0, 1.0))
    it.wait()
    assert (ray.get(actors[0].call.remote("priorities", ray.get(actors[0].call.remote("sampleable_ids")))) == 1.0).all()
    for _ in range(2 * (it.prefetch + 1)):  # batches requested before the update, then split by the old masses
        next(it)
    rows, weights = [], []
    for _ in range(60):
        b = next(it)
        rows.append(b.actor)
        weights.append((b.actor, b.weight))
    share = np.mean(np.concatenate(rows) == 1)
    assert abs(share - 0.75) < 0.05, share  # masses 300 * 1 : 100 * 9
    # mixture weights: (m_i / m_min) ** -beta over all actors: 1 for actor 0's rows, 1/9 for actor 1's
    for who, w in weights:
        np.testing.assert_allclose(w, np.where(who == 0, 1.0, 1 / 9), rtol=1e-5)
    seq = next(batches(actors, 8, prefetch=1, seed=1, length=5))  # sequences, drawn the same way
    assert seq.obs.shape == (8, 6, 1, 2) and seq.actor.shape == (8,)
    for i in range(8):  # each sequence comes from its actor's store: frames [actor, t], t consecutive
        m = int(seq.mask[i].sum())
        states = seq.obs[i, : m + 1, 0]
        assert m >= 1 and (states[:, 0] == seq.actor[i]).all() and (np.diff(states[:, 1]) == 1).all()
    for a in actors:
        ray.get(a.close.remote())


def test_an_error_on_a_block_ends_the_writers_episode_there(cluster, tmp_path):
    """The actor refuses a block (rate limit timeout): the episode ends at what was stored before; the
    writer raises the error once, then refuses step() until reset(); no stored transition joins the states
    before and after the lost steps. A rate-limited store also caps the writer's block."""
    from mmreplay.ray import RemoteWriter, ReplayActor

    ray = cluster
    path = str(tmp_path / "s")
    limit = mr.RateLimit(1.0, 10, 5.0, timeout=0.0)  # no samples: at most 15 transitions stored
    actor = ReplayActor.options(num_cpus=0).remote(path, capacity=1000, obs_shape=(3,), obs_dtype="int32",
                                                   rate_limit=limit)
    w = RemoteWriter(actor, block=4, in_flight=1)
    frames = _episode_frames(0, 0, 40)
    w.reset(frames[0])
    with pytest.raises(mr.RateLimitTimeout):  # the block of steps 12..15 fails; 16..19 were on their way
        for t in range(40):
            w.step(0, float(t), frames[t + 1], False, False)
    assert t == 19
    with pytest.raises(mr.EpisodeStateError, match="reset"):
        w.step(0, 20.0, frames[21], False, False)
    ray.get(actor.sample.remote(10))  # room for more
    frames = _episode_frames(0, 1, 3)
    w.reset(frames[0])
    for t in range(3):
        w.step(0, 100.0 + t, frames[t + 1], t == 2, False)
    assert w.flush() == 15
    assert RemoteWriter(actor).block == limit.most_inserted_at_once  # the store refuses longer blocks
    ray.get(actor.close.remote())
    with mr.ReplayStore.open(path, mode="r") as s:
        table = s.episodes()
        assert len(table) == 2 and bool(table.truncated[0]) and bool(table.terminated[1])
        np.testing.assert_array_equal(s.episode_frames(table, 0), _episode_frames(0, 0, 12))
        np.testing.assert_array_equal(s.episode_steps(table, 0).rewards, np.arange(12))
        np.testing.assert_array_equal(s.episode_frames(table, 1), frames)


def test_batches_go_on_past_an_emptied_actor_and_refuse_a_mix_of_prioritized_and_uniform(cluster, tmp_path):
    from mmreplay.ray import ReplayActor, batches

    ray = cluster

    def filled(name: str, **kwargs: object) -> object:
        a = ReplayActor.options(num_cpus=0).remote(str(tmp_path / name), capacity=100, obs_shape=(2,),
                                                   obs_dtype="int32", **kwargs)
        ray.get(a.reset.remote(np.zeros(2, np.int32)))
        ray.get(a.extend.remote(np.zeros(20, np.int64), np.ones(20), np.ones((20, 2), np.int32), np.arange(20) == 19,
                                np.zeros(20, np.bool_)))
        return a

    a0, a1, p = filled("a0"), filled("a1"), filled("p", prioritized=mr.Prioritized())
    it = batches([a0, a1], 16, prefetch=2, seed=0)
    next(it)
    ray.get(a1.call.remote("clear"))
    for _ in range(it.prefetch + 1):  # requested before clear(): actor 1 may have served them
        next(it)
    for _ in range(8):  # requested with actor 1's weight before clear() (it drew none) or after (it is 0)
        assert (next(it).actor == 0).all()
    ray.get(a0.call.remote("clear"))
    with pytest.raises(mr.NotSampleableError):  # once the batches requested before clear() are out
        for _ in range(it.prefetch + 2):
            next(it)
    with pytest.raises(ValueError, match=r"prioritized ones at positions \[2\] and uniform ones at \[0, 1\]"):
        batches([a0, a1, p], 16)
    for a in (a0, a1, p):
        ray.get(a.close.remote())


def test_a_killed_actor_is_a_crash_and_its_replacement_opens_the_last_commit(cluster, tmp_path):
    from mmreplay.ray import RemoteWriter, ReplayActor

    ray = cluster
    path = str(tmp_path / "s")
    actor = ReplayActor.options(num_cpus=0).remote(path, capacity=1000, obs_shape=(3,), obs_dtype="int32")
    w = RemoteWriter(actor, block=8)
    frames = _episode_frames(0, 0, 50)
    w.reset(frames[0])
    for t in range(30):
        w.step(0, 1.0, frames[t + 1], False, False)
    assert w.flush() == 30
    assert ray.get(actor.commit.remote()) == 1
    for t in range(30, 50):
        w.step(0, 1.0, frames[t + 1], False, False)
    w.flush()
    pid = ray.get(actor.__ray_call__.remote(lambda _: os.getpid()))
    ray.kill(actor)  # returns before the actor's process is gone, which holds the store's writer lock until then
    wait_until(lambda: _exited(pid), f"the killed actor's process {pid} to exit", pause=0.05)
    again = ReplayActor.options(num_cpus=0).remote(path, open=True)
    assert ray.get(again.stats.remote())["id_range"] == (0, 30)
    w = RemoteWriter(again, block=8)
    w.reset(frames[0])
    w.step(0, 1.0, frames[1], True, False)
    assert w.flush() == 31
    ray.get(again.close.remote())
    with mr.ReplayStore.open(path, mode="r") as s:
        assert s.id_range == (0, 31) and s.verify() == []


def test_a_graceful_shutdown_commits(cluster, tmp_path):
    """An actor whose handles go out of scope (or that is told to exit) commits before it goes."""
    import gc
    import time

    from mmreplay.ray import ReplayActor

    ray = cluster
    for how in ("out of scope", "terminate"):
        path = str(tmp_path / how.replace(" ", "-"))
        a = ReplayActor.options(num_cpus=0).remote(path, capacity=100, obs_shape=(2,), obs_dtype="int32")
        ray.get(a.reset.remote(np.zeros(2, np.int32)))
        ray.get(a.extend.remote(np.zeros(5, np.int64), np.ones(5), np.ones((5, 2), np.int32), np.zeros(5, np.bool_),
                                np.zeros(5, np.bool_)))
        if how == "terminate":
            a.__ray_terminate__.remote()
        del a
        gc.collect()
        deadline = time.monotonic() + 60
        while True:  # the actor process lets go of the writer lock once it has exited
            try:
                s = mr.ReplayStore.open(path)
                break
            except mr.StoreLockedError:
                assert time.monotonic() < deadline, f"{how}: the actor never released its store"
                time.sleep(0.1)
        assert s.id_range == (0, 5), how
        s.close()


def test_an_actor_ray_restarts_resumes_its_store_from_the_last_commit(cluster, tmp_path):
    """Ray's automatic restart (max_restarts) re-runs __init__ with the create() arguments: the actor
    opens the store its first life created instead of dying on create()."""
    from mmreplay.ray import RemoteWriter, ReplayActor

    ray = cluster
    path = str(tmp_path / "s")
    actor = ReplayActor.options(num_cpus=0, max_restarts=1, max_task_retries=0).remote(
        path, capacity=1000, obs_shape=(3,), obs_dtype="int32")
    w = RemoteWriter(actor, block=8)
    frames = _episode_frames(0, 0, 50)
    w.reset(frames[0])
    for t in range(20):
        w.step(0, 1.0, frames[t + 1], False, False)
    w.flush()
    assert ray.get(actor.commit.remote()) == 1
    import os
    import time

    first_pid = ray.get(actor.__ray_call__.remote(lambda _: os.getpid()))
    ray.kill(actor, no_restart=False)

    def through_restart(call):  # noqa: ANN001, ANN202 - a call to the actor, retried while Ray restarts it
        deadline = time.monotonic() + 60
        while True:
            try:
                return ray.get(call(), timeout=30)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    deadline = time.monotonic() + 60  # (the kill is asynchronous: calls may still reach the first life)
    while through_restart(lambda: actor.__ray_call__.remote(lambda _: os.getpid())) == first_pid:
        assert time.monotonic() < deadline, "Ray did not restart the actor"
        time.sleep(0.2)
    stats = through_restart(lambda: actor.stats.remote())  # the second life opened the committed store
    assert stats["id_range"] == (0, 20)
    # the steps after the commit are lost: the writer's episode ended at step 20, and it must start another
    w.step(0, 1.0, frames[21], False, False)
    with pytest.raises(mr.EpisodeStateError, match="restarted"):
        w.flush()
    with pytest.raises(mr.EpisodeStateError, match="reset"):
        w.step(0, 1.0, frames[22], False, False)
    w.reset(frames[0])
    w.step(0, 1.0, frames[1], True, False)
    assert w.flush() == 21
    through_restart(lambda: actor.close.remote())
    with mr.ReplayStore.open(path, mode="r") as s:
        assert s.id_range == (0, 21) and s.verify() == []
        table = s.episodes()
        np.testing.assert_array_equal(s.episode_frames(table, 0), frames[:21])
        assert bool(table.truncated[0])
