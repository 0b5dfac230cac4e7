"""Tests of the reference model (tests/_support/model.py) against hand-derived values.

Frames are filled with one small integer each, so a stacked state reads as a
list of integers: obs_t of the single-env episodes below is filled with t + 1
(obs_0 = 1, so the zero padding is distinguishable). gamma = 0.5 keeps every
n-step return exact in float32.
"""
import random

import numpy as np
import pytest

from tests._support.model import ModelStore

OBS = (2, 3)


def F(value):
    return np.full(OBS, value, np.uint8)


def vals(stack):
    """[v0, v1, ...] for a stack whose frames are each filled with one value."""
    stack = np.asarray(stack)
    assert stack.dtype == np.uint8 and stack.shape[1:] == OBS
    out = []
    for frame in stack:
        assert (frame == frame.flat[0]).all()
        out.append(int(frame.flat[0]))
    return out


def make(**kw):
    args = dict(capacity=100, obs_shape=OBS, stack=4, n_step=3, gamma=0.5)
    args.update(kw)
    return ModelStore(**args)


def run_episode(store, steps, term_at=None, trunc_at=None):
    """reset(obs_0=1); step t: action 10*t, reward t+1, next_obs filled with t+2."""
    store.reset(F(1))
    for t in range(steps):
        store.step(10 * t, t + 1, F(t + 2), t == term_at, t == trunc_at)


def check(row, obs, next_obs, reward, discount, terminated=False, truncated=False):
    assert vals(row["obs"]) == obs
    assert vals(row["next_obs"]) == next_obs
    assert type(row["reward"]) is np.float32 and row["reward"] == reward
    assert type(row["discount"]) is np.float32 and row["discount"] == discount
    assert row["terminated"] is terminated
    assert row["truncated"] is truncated


# ----------------------------------------------------------------- one episode


def test_open_episode_rows_zero_padding():
    s = make(extras={"logp": ((), "float32"), "h": ((2,), "int16")})
    s.reset(F(1))
    for t in range(5):
        s.step(10 * t, t + 1, F(t + 2), False, False, logp=-t / 4, h=[t, -t])
    assert s.next_id == 5 and s.oldest_id == 0
    # ids 3 and 4 need obs_6 / obs_7: still pending
    assert s.sampleable_ids() == [0, 1, 2]
    # reward_t = r_t + r_{t+1}/2 + r_{t+2}/4 with r_t = t + 1
    check(s.row(0), [0, 0, 0, 1], [1, 2, 3, 4], 2.75, 0.125)
    check(s.row(1), [0, 0, 1, 2], [2, 3, 4, 5], 4.5, 0.125)
    check(s.row(2), [0, 1, 2, 3], [3, 4, 5, 6], 6.25, 0.125)
    r = s.row(2)
    assert r["index"] == 2
    assert r["action"].dtype == np.int64 and r["action"].shape == () and r["action"] == 20
    assert r["extras"]["logp"].dtype == np.float32 and r["extras"]["logp"] == -0.5
    assert r["extras"]["h"].dtype == np.int16 and r["extras"]["h"].tolist() == [2, -2]
    assert r["obs"].shape == (4, *OBS) and r["next_obs"].shape == (4, *OBS)
    for i in (3, 4, 5, -1):
        with pytest.raises(KeyError):
            s.row(i)


def test_open_episode_rows_first_padding():
    s = make(pad="first")
    run_episode(s, 5)
    assert s.sampleable_ids() == [0, 1, 2]
    check(s.row(0), [1, 1, 1, 1], [1, 2, 3, 4], 2.75, 0.125)
    check(s.row(1), [1, 1, 1, 2], [2, 3, 4, 5], 4.5, 0.125)
    check(s.row(2), [1, 1, 2, 3], [3, 4, 5, 6], 6.25, 0.125)


def test_termination_inside_window():
    s = make()
    run_episode(s, 6, term_at=5)  # final observation obs_6 is filled with 7
    assert s.sampleable_ids() == [0, 1, 2, 3, 4, 5]
    # window 2..4 does not reach the end
    check(s.row(2), [0, 1, 2, 3], [3, 4, 5, 6], 6.25, 0.125)
    # windows that reach step 5: m = 3, 2, 1, discount 0, next_obs = final state
    check(s.row(3), [1, 2, 3, 4], [4, 5, 6, 7], 4 + 5 / 2 + 6 / 4, 0.0, terminated=True)
    check(s.row(4), [2, 3, 4, 5], [4, 5, 6, 7], 5 + 6 / 2, 0.0, terminated=True)
    check(s.row(5), [3, 4, 5, 6], [4, 5, 6, 7], 6.0, 0.0, terminated=True)
    assert s.row(5)["action"] == 50
    with pytest.raises(RuntimeError):
        s.step(0, 0.0, F(9), False, False)  # unbatched: reset() first
    assert s.next_id == 6


def test_truncation_inside_window():
    s = make()
    run_episode(s, 6, trunc_at=5)
    assert s.sampleable_ids() == [0, 1, 2, 3, 4, 5]
    check(s.row(2), [0, 1, 2, 3], [3, 4, 5, 6], 6.25, 0.125)
    check(s.row(3), [1, 2, 3, 4], [4, 5, 6, 7], 8.0, 0.125, truncated=True)
    check(s.row(4), [2, 3, 4, 5], [4, 5, 6, 7], 8.0, 0.25, truncated=True)
    check(s.row(5), [3, 4, 5, 6], [4, 5, 6, 7], 6.0, 0.5, truncated=True)


def test_both_flags_terminated_wins():
    s = make(stack=1, n_step=2)
    s.reset(F(1))
    s.step(0, 1.0, F(2), False, False)
    s.step(1, 2.0, F(3), True, True)
    check(s.row(0), [1], [3], 2.0, 0.0, terminated=True)
    check(s.row(1), [2], [3], 2.0, 0.0, terminated=True)


def test_reset_mid_episode_counts_as_truncation():
    s = make()
    run_episode(s, 4)
    assert s.sampleable_ids() == [0, 1]  # ids 2, 3 wait for obs_5, obs_6
    check(s.row(1), [0, 0, 1, 2], [2, 3, 4, 5], 4.5, 0.125)
    # The reset puts the end (step 3) inside id 1's window 1..3: its row now says
    # truncated; reward, discount and next_obs (obs_4 either way) do not change.
    s.reset(F(50))  # ends the episode as truncated after step 3 (final obs_4 = 5)
    assert s.sampleable_ids() == [0, 1, 2, 3]
    check(s.row(0), [0, 0, 0, 1], [1, 2, 3, 4], 2.75, 0.125)  # end not in window 0..2
    check(s.row(1), [0, 0, 1, 2], [2, 3, 4, 5], 2 + 3 / 2 + 4 / 4, 0.125, truncated=True)
    check(s.row(2), [0, 1, 2, 3], [2, 3, 4, 5], 3 + 4 / 2, 0.25, truncated=True)
    check(s.row(3), [1, 2, 3, 4], [2, 3, 4, 5], 4.0, 0.5, truncated=True)
    assert vals(s.current_obs()) == [0, 0, 0, 50]
    # the new episode's stacks never reach into the old one
    for t in range(3):
        s.step(7, 1.0, F(51 + t), False, False)
    assert s.sampleable_ids() == [0, 1, 2, 3, 4]
    check(s.row(4), [0, 0, 0, 50], [50, 51, 52, 53], 1.75, 0.125)
    # reset() right after reset(): an empty episode, no transition, nothing changes
    s.reset(F(60))
    s.reset(F(61))
    assert s.next_id == 7 and s.sampleable_ids() == [0, 1, 2, 3, 4, 5, 6]
    check(s.row(6), [0, 50, 51, 52], [50, 51, 52, 53], 1.0, 0.5, truncated=True)


def test_step_before_reset_raises():
    s = make()
    with pytest.raises(RuntimeError):
        s.step(0, 0.0, F(1), False, False)
    assert s.next_id == 0 and s.oldest_id == 0 and s.sampleable_ids() == []


def test_pending_windows_at_write_head():
    s = make(stack=1)
    s.reset(F(1))
    expected = [[], [], [0], [0, 1]]
    for t in range(4):
        s.step(t, 1.0, F(t + 2), False, False)
        assert s.sampleable_ids() == expected[t]
    with pytest.raises(KeyError):
        s.row(2)  # pending
    with pytest.raises(KeyError):
        s.row(4)  # never issued
    s.step(4, 1.0, F(6), False, True)  # the end flag closes every open window
    assert s.sampleable_ids() == [0, 1, 2, 3, 4]
    check(s.row(3), [4], [6], 1.5, 0.25, truncated=True)


def test_current_obs_padding():
    z = make()
    f = make(pad="first")
    for s in (z, f):
        s.reset(F(1))
        assert s.current_obs().shape == (4, *OBS)
    assert vals(z.current_obs()) == [0, 0, 0, 1]
    assert vals(f.current_obs()) == [1, 1, 1, 1]
    for s in (z, f):
        s.step(0, 0.0, F(2), True, False)
    assert vals(z.current_obs()) == [0, 0, 1, 2]  # the final state until reset()
    assert vals(f.current_obs()) == [1, 1, 1, 2]


def test_reward_and_discount_numbers():
    s = make(stack=1, gamma=0.99)
    s.reset(F(0))
    for t, r in enumerate([0.1, 0.2, 0.3, 0.4]):
        s.step(t, r, F(t + 1), False, False)
    r = s.row(0)
    f64 = [float(np.float32(x)) for x in (0.1, 0.2, 0.3)]  # rewards are stored as float32
    assert r["reward"] == np.float32(f64[0] + 0.99 * f64[1] + 0.99 ** 2 * f64[2])
    assert r["discount"] == np.float32(0.99 ** 3)


# ----------------------------------------------------------------- vector envs


def test_two_envs_with_autoreset():
    s = make(stack=2, n_step=2, num_envs=2, extras={"logp": ((), "float32")})
    s.reset(np.stack([F(10), F(20)]))
    s.step([0, 1], [1, 2], np.stack([F(11), F(21)]), [False, False], [False, False], logp=[0.0, 0.5])
    s.step([2, 3], [3, 4], np.stack([F(12), F(22)]), [True, False], [False, False], logp=[1.0, 1.5])
    # env 0 ended: this call is its autoreset (action 99 etc. ignored, 30 is obs_0)
    s.step([99, 5], [99, 6], np.stack([F(30), F(23)]), [True, False], [True, False], logp=[9.0, 2.5])
    s.step([7, 8], [7, 8], np.stack([F(31), F(24)]), [False, True], [False, False], logp=[3.0, 3.5])
    assert s.next_id == 7
    # ids in write order, env order within a call: 0:e0t0 1:e1t0 2:e0t1 3:e1t1 4:e1t2 5:e0'(t0) 6:e1t3
    assert s.sampleable_ids() == [0, 1, 2, 3, 4, 6]  # id 5 waits for env 0's next frame
    check(s.row(0), [0, 10], [11, 12], 1 + 3 / 2, 0.0, terminated=True)
    check(s.row(2), [10, 11], [11, 12], 3.0, 0.0, terminated=True)
    check(s.row(1), [0, 20], [21, 22], 2 + 4 / 2, 0.25)
    check(s.row(3), [20, 21], [22, 23], 4 + 6 / 2, 0.25)
    check(s.row(4), [21, 22], [23, 24], 6 + 8 / 2, 0.0, terminated=True)
    check(s.row(6), [22, 23], [23, 24], 8.0, 0.0, terminated=True)
    assert [int(s.row(i)["action"]) for i in (0, 1, 2, 3, 4, 6)] == [0, 1, 2, 3, 5, 8]
    assert s.row(4)["extras"]["logp"] == 2.5
    with pytest.raises(KeyError):
        s.row(5)
    cur = s.current_obs()
    assert cur.shape == (2, 2, *OBS)
    assert vals(cur[0]) == [30, 31] and vals(cur[1]) == [23, 24]
    s.step([4, 0], [1, 0], np.stack([F(32), F(40)]), [False, False], [False, False], logp=[0.0, 0.0])
    assert s.next_id == 8  # env 1 autoreset, env 0 wrote id 7
    check(s.row(5), [0, 30], [31, 32], 7 + 1 / 2, 0.25)


def test_vector_reset_truncates_open_streams_only():
    s = make(stack=1, n_step=3, num_envs=2)
    s.reset(np.stack([F(10), F(20)]))
    s.step([0, 0], [1, 2], np.stack([F(11), F(21)]), [False, True], [False, False])
    assert s.sampleable_ids() == [1]
    s.reset(np.stack([F(12), F(22)]))
    assert s.sampleable_ids() == [0, 1]
    check(s.row(0), [10], [11], 1.0, 0.5, truncated=True)
    check(s.row(1), [20], [21], 2.0, 0.0, terminated=True)


def test_vector_true_with_one_env():
    s = make(stack=1, n_step=1, vector=True)
    s.reset(F(1)[None])
    s.step([3], [1.0], F(2)[None], [True], [False])
    s.step([4], [1.0], F(5)[None], [False], [False])  # autoreset: no transition
    s.step([6], [2.0], F(6)[None], [False], [False])
    assert s.next_id == 2 and s.sampleable_ids() == [0, 1]
    check(s.row(1), [5], [6], 2.0, 0.5)
    assert s.current_obs().shape == (1, 1, *OBS)


# ----------------------------------------------------------------- eviction


def test_eviction_stack_history():
    # rows per chunk 4; k*N = 2; retire chunk f while transitions with next frame
    # in chunks f+1.. minus 2 >= 3. One episode: obs_t (value t+1) sits in row t,
    # transition t has next frame in row t+1.
    s = make(capacity=3, stack=2, n_step=1, chunk_size=4)
    run_episode(s, 11)  # opening chunk 1 (row 4) and chunk 2 (row 8) retires nothing
    assert s.oldest_id == 0 and s.sampleable_ids() == list(range(11))
    s.step(110, 12, F(13), False, False)  # row 12 opens chunk 3: ids 3..10 in chunks 1+ -> retire 0
    assert s.next_id == 12 and s.oldest_id == 3
    # id 3 (obs row 3) and id 4 (stack rows 3, 4) lost history; id 5 has rows 4, 5
    assert s.sampleable_ids() == list(range(5, 12))
    for i in (0, 2, 3, 4):
        with pytest.raises(KeyError):
            s.row(i)
    check(s.row(5), [5, 6], [6, 7], 6.0, 0.5)
    for t in range(12, 16):  # row 16 opens chunk 4: ids 7..14 in chunks 2+ -> retire 1
        s.step(10 * t, t + 1, F(t + 2), False, False)
    assert s.next_id == 16 and s.oldest_id == 7
    assert s.sampleable_ids() == list(range(9, 16))
    check(s.row(9), [9, 10], [10, 11], 10.0, 0.5)
    assert vals(s.current_obs()) == [16, 17]


def test_eviction_episode_starting_at_chunk_boundary():
    s = make(capacity=3, stack=2, n_step=1, chunk_size=4)
    run_episode(s, 3, term_at=2)  # rows 0..3, ids 0..2
    s.reset(F(50))  # row 4: first row of chunk 1
    for t in range(8):  # ids 3..10, next frames in rows 5..12
        s.step(t, 1.0, F(51 + t), False, False)
    # row 12 opened chunk 3 with ids 3..9 in chunks 1+: 7 - 2 >= 3, retire chunk 0
    assert s.oldest_id == 3
    # id 3 is obs_0 of the new episode (row 4): no history before it is needed
    assert s.sampleable_ids() == list(range(3, 11))
    check(s.row(3), [0, 50], [50, 51], 1.0, 0.5)


def test_eviction_two_streams():
    # chunk_size 8 over 2 streams: 4 rows per chunk; k*N = 2
    s = make(capacity=4, stack=1, n_step=1, num_envs=2, chunk_size=8)
    s.reset(np.stack([F(0), F(100)]))
    for r in range(1, 9):  # writes row r: ids 2r-2 (env 0) and 2r-1 (env 1)
        s.step([r, r], [r, r], np.stack([F(r), F(100 + r)]), [False, False], [False, False])
    # row 8 opened chunk 2: ids 6..13 have next frames in rows 4..7 -> 8 - 2 >= 4, retire chunk 0
    assert s.next_id == 16 and s.oldest_id == 6
    assert s.sampleable_ids() == list(range(8, 16))  # ids 6, 7 have obs in row 3
    check(s.row(8), [4], [5], 5.0, 0.5)
    check(s.row(9), [104], [105], 5.0, 0.5)


def _batch(values, num_envs):
    return np.stack([F(v) for v in values]) if num_envs > 1 else F(values[0])


def _pick(values, num_envs):
    return values if num_envs > 1 else values[0]


@pytest.mark.parametrize("chunk_size, num_envs, stack, n_step, capacity",
                         [(6, 2, 3, 2, 10), (5, 1, 4, 3, 7), (9, 3, 2, 1, 12)])
def test_capacity_guarantee_random_run(chunk_size, num_envs, stack, n_step, capacity):
    # SEMANTICS.md, "Capacity": at least the `capacity` most recent transitions are sampleable when
    # they satisfy the rule. The same random run goes into a store that never
    # evicts (chunk_size=None); among the recent ids, the two must agree.
    rng = random.Random(7)
    kw = dict(capacity=capacity, stack=stack, n_step=n_step, num_envs=num_envs)
    small, full = make(chunk_size=chunk_size, **kw), make(**kw)
    for s in (small, full):
        s.reset(_batch([0] * num_envs, num_envs))
    ended = False  # unbatched only: the single env needs reset() after an end
    for step in range(200):
        frames = _batch([rng.randrange(256) for _ in range(num_envs)], num_envs)
        if ended or rng.random() < 0.03:
            for s in (small, full):
                s.reset(frames)
            ended = False
            continue
        term = [rng.random() < 0.1 for _ in range(num_envs)]
        trunc = [rng.random() < 0.05 for _ in range(num_envs)]
        rew = [rng.randrange(5) for _ in range(num_envs)]
        for s in (small, full):
            s.step(_pick([step] * num_envs, num_envs), _pick(rew, num_envs), frames,
                   _pick(term, num_envs), _pick(trunc, num_envs))
        ended = num_envs == 1 and (term[0] or trunc[0])
        assert small.next_id == full.next_id
        ok = small.sampleable_ids()
        recent = [i for i in full.sampleable_ids() if i >= full.next_id - capacity]
        assert set(recent) <= set(ok)
        assert set(ok) <= set(full.sampleable_ids())
        assert all(i >= small.oldest_id for i in ok)
        for i in ok[-3:]:
            a, b = small.row(i), full.row(i)
            assert vals(a["obs"]) == vals(b["obs"]) and vals(a["next_obs"]) == vals(b["next_obs"])
            assert a["reward"] == b["reward"] and a["discount"] == b["discount"]
    assert small.oldest_id > 0  # eviction did happen
    assert full.oldest_id == 0
