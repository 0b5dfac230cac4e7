"""Reference model of the mmreplay store semantics (the oracle for tests).

Plain lists and dicts, one loop per thing, everything kept in RAM forever;
"evicted" is only a label computed from the chunk-retirement rule. It follows
SEMANTICS.md (and FORMAT.md for the retirement rule). Choices where those are silent:

- chunk_size=None means "one endless chunk": nothing is ever retired. The real
  store's None picks a size from the frame bytes, so pass the real store's
  chunk size explicitly whenever a comparison runs past capacity.
- extras given to step() must be exactly the declared names (TypeError).
- step() or current_obs() before the first reset() raises RuntimeError, also
  in vector mode.
- reset() of an episode that recorded no step just leaves an empty episode.
- A row that became sampleable because the frame at t+n existed can later gain
  truncated=True, when a reset() ends its episode at t+n-1 (end inside the window).
  reward, discount and next_obs do not change; only that flag does.

Chunks (only what eviction needs): each chunk holds a run of rows of every stream
(``chunks[c][s]`` = the stream's first row in chunk c). A chunk has
``chunk_size / E`` extents of E rows (E: the section ``chunk_size // num_envs``
cut into the most pieces, at most 16, that divide it). A stream writes into an
extent it took; when that is full it takes another; a new chunk opens when the
extents the streams about to write need are more than those left (FORMAT.md).
"""
import operator

import numpy as np


class _Episode:
    """One episode of one stream: where its frames are and which ids it owns."""

    def __init__(self, stream):
        self.stream = stream
        self.rows = []  # frame row of position 0, 1, 2, ... (obs_0 first)
        self.ids = []  # transition id of step 0, 1, 2, ...
        self.end = None  # None while open, then "terminated" or "truncated"


class ModelStore:
    def __init__(self, capacity, obs_shape, obs_dtype="uint8", stack=1, n_step=1, gamma=0.99,
                 action_shape=(), action_dtype="int64", extras=None, num_envs=1, pad="zeros",
                 chunk_size=None, vector=None):
        if pad not in ("zeros", "first"):
            raise ValueError(f"pad must be 'zeros' or 'first', got {pad!r}")
        self.capacity = int(capacity)
        self.obs_shape = tuple(obs_shape)
        self.obs_dtype = np.dtype(obs_dtype)
        self.k = int(stack)
        self.n = int(n_step)
        self.gamma = float(gamma)
        self.action_shape = tuple(action_shape)
        self.action_dtype = np.dtype(action_dtype)
        self.extras_spec = {}
        for name, (shape, dtype) in (extras or {}).items():
            shape = (shape,) if isinstance(shape, int) else tuple(shape)
            self.extras_spec[name] = (shape, np.dtype(dtype))
        self.num_envs = int(num_envs)
        self.vector = self.num_envs > 1 if vector is None else bool(vector)
        if self.num_envs > 1 and not self.vector:
            raise ValueError("num_envs > 1 needs vector=True (or None)")
        self.pad = pad
        if chunk_size is None:
            self.rows_per_chunk = None  # never retire anything
        else:
            self.rows_per_chunk = int(chunk_size) // self.num_envs
            if self.rows_per_chunk < 1:
                raise ValueError("chunk_size must be >= num_envs")
        self.frames = [[] for _ in range(self.num_envs)]  # frames[stream][row]
        self.missing = set()  # (stream, row) of final observations that were not available
        self.current = [None] * self.num_envs  # latest episode of each stream
        self.transitions = []  # transitions[id] = dict(episode, t, action, reward, extras)
        self.chunks = []  # chunks[c][s]: row of stream s where chunk c begins
        self.taken = 0  # extents taken in the open chunk
        self.left = [0] * self.num_envs  # rows left in each stream's extent of the open chunk
        if self.rows_per_chunk is not None:
            per = self.rows_per_chunk
            m = max(d for d in range(1, min(16, per) + 1) if per % d == 0)
            self.extent = per // m
            self.n_extents = self.num_envs * m
        self.retired_chunks = 0  # chunks 0 .. retired_chunks-1 are gone
        self._retired_below = 0  # transitions 0 .. _retired_below-1 are known gone (oldest_id's last scan)

    # ---------------------------------------------------------------- writing

    def reset(self, obs, env=None):
        if env is not None and self.vector:
            frames = {env: self._frame(obs, None)}
        elif env is not None:
            frames = {0: self._frame(obs, 0)}
        else:
            frames = {s: self._frame(obs, s) for s in range(self.num_envs)}
        self._open_rows(list(frames))
        for s, frame in frames.items():
            ep = self.current[s]
            if ep is not None and ep.end is None:
                ep.end = "truncated"  # reset() mid-episode: truncated at its last step
            self._start_episode(s, frame)

    def step(self, action, reward, next_obs, terminated, truncated, **extras):
        if set(extras) != set(self.extras_spec):
            raise TypeError(f"extras must be {sorted(self.extras_spec)}, got {sorted(extras)}")
        autoreset = []
        for s in range(self.num_envs):
            ep = self.current[s]
            if ep is None:
                raise RuntimeError("step() before reset()")
            if ep.end is not None and not self.vector:
                raise RuntimeError("the episode has ended; call reset() first")
            autoreset.append(ep.end is not None)  # vector: NEXT_STEP autoreset
        # Convert and check everything before writing anything.
        frames = [self._frame(next_obs, s) for s in range(self.num_envs)]
        records = []
        for s in range(self.num_envs):
            records.append(None if autoreset[s] else self._record(s, action, reward, extras))
        self._open_rows(list(range(self.num_envs)))
        for s in range(self.num_envs):
            if autoreset[s]:
                self._start_episode(s, frames[s])  # action, reward, flags, extras ignored
                continue
            self._append(s, frames[s], records[s], bool(self._pick(terminated, s)), bool(self._pick(truncated, s)))

    def extend(self, actions, rewards, next_obs, terminated, truncated, env=0, final_missing=False, **extras):
        """``len(rewards)`` steps of stream ``env``, as ``step()`` would write them one by one."""
        if set(extras) != set(self.extras_spec):
            raise TypeError(f"extras must be {sorted(self.extras_spec)}, got {sorted(extras)}")
        ep = self.current[env]
        if ep is None or ep.end is not None:
            raise RuntimeError("extend() needs an open episode; call reset() first")
        n = len(rewards)
        ends = [bool(terminated[i]) or bool(truncated[i]) for i in range(n)]
        if any(ends[:-1]) or (final_missing and not (n and ends[-1])):
            raise ValueError("an episode end may only be the block's last step")
        records = [dict(action=np.array(actions[i], dtype=self.action_dtype), reward=np.float32(rewards[i]),
                        extras={k: np.array(v[i], dtype=self.extras_spec[k][1]) for k, v in extras.items()})
                   for i in range(n)]
        for i in range(n):
            self._open_rows([env])
            last_missing = final_missing and i == n - 1
            frame = np.zeros(self.obs_shape, self.obs_dtype) if last_missing else self._frame(next_obs[i], None)
            if last_missing:
                self.missing.add((env, len(self.frames[env])))
            self._append(env, frame, records[i], bool(terminated[i]), bool(truncated[i]))

    def _append(self, s, frame, record, terminated, truncated):
        ep = self.current[s]
        i = len(self.transitions)
        self.transitions.append(dict(episode=ep, t=len(ep.ids), **record))
        ep.ids.append(i)
        ep.rows.append(len(self.frames[s]))
        self.frames[s].append(frame)
        if terminated:
            ep.end = "terminated"  # terminated wins when both are set
        elif truncated:
            ep.end = "truncated"

    def _record(self, s, action, reward, extras):
        action_s = np.array(self._pick(action, s), dtype=self.action_dtype)
        if action_s.shape != self.action_shape:
            raise ValueError(f"expected action shape {self.action_shape}, got {action_s.shape}")
        extras_s = {}
        for name, (shape, dtype) in self.extras_spec.items():
            value = np.array(self._pick(extras[name], s), dtype=dtype)
            if value.shape != shape:
                raise ValueError(f"expected extras[{name!r}] shape {shape}, got {value.shape}")
            extras_s[name] = value
        return dict(action=action_s, reward=np.float32(self._pick(reward, s)), extras=extras_s)

    def _pick(self, value, s):
        return np.asarray(value)[s] if self.vector and s is not None else value

    def _frame(self, obs, s):
        frame = np.array(self._pick(obs, s), dtype=self.obs_dtype)
        if frame.shape != self.obs_shape:
            raise ValueError(f"expected obs shape {self.obs_shape}, got {frame.shape}")
        return frame

    def _start_episode(self, s, frame):
        ep = _Episode(s)
        ep.rows.append(len(self.frames[s]))
        self.frames[s].append(frame)
        self.current[s] = ep

    def _open_rows(self, streams):
        """A row of each of ``streams`` is about to be written: open a new chunk if they need more extents
        than are left (retiring old chunks first, as far as capacity allows)."""
        if self.rows_per_chunk is None:
            return
        need = [s for s in streams if self.left[s] == 0]
        if not self.chunks or self.taken + len(need) > self.n_extents:
            while self.retired_chunks < len(self.chunks):
                # (the transitions oldest_id found gone lie in retired chunks: not kept)
                kept = sum(1 for tr in self.transitions[self._retired_below:]
                           if self._chunk_of(tr) > self.retired_chunks)
                if kept - self.k * self.num_envs >= self.capacity:
                    self.retired_chunks += 1
                else:
                    break
            self.chunks.append([len(f) for f in self.frames])
            self.taken, self.left = 0, [0] * self.num_envs
            need = list(streams)
        for s in need:
            self.taken += 1
            self.left[s] = self.extent
        for s in streams:
            self.left[s] -= 1

    def _chunk_of(self, tr):
        """The chunk holding the transition's next frame (remembered: a later chunk begins after every row
        written before it was opened, so the answer never changes)."""
        if "chunk" not in tr:
            s, row = tr["episode"].stream, self._next_row(tr)
            tr["chunk"] = max(c for c in range(len(self.chunks)) if self.chunks[c][s] <= row)
        return tr["chunk"]

    # ---------------------------------------------------------------- reading

    @property
    def next_id(self):
        return len(self.transitions)

    @property
    def oldest_id(self):
        # A transition once gone stays gone (chunks retire in order, each stream's first retained row only
        # grows), so the scan for the first retained one goes on from where the last scan stopped.
        i = self._retired_below
        while i < len(self.transitions):
            tr = self.transitions[i]
            if self._next_row(tr) >= self._first_retained_row(tr["episode"].stream):
                break
            i += 1
        self._retired_below = i
        return i

    def __len__(self):
        return len(self.sampleable_ids())

    def sampleable_ids(self):
        return [i for i in range(self.oldest_id, self.next_id) if self._complete_and_intact(i)]

    def row(self, i):
        i = operator.index(i)
        if not (self.oldest_id <= i < self.next_id and self._complete_and_intact(i)):
            raise KeyError(i)
        tr = self.transitions[i]
        ep, t = tr["episode"], tr["t"]
        m, end = self._window(tr)
        total = 0.0  # float64, summed in increasing j
        for j in range(m):
            total += self.gamma ** j * float(self.transitions[ep.ids[t + j]]["reward"])
        terminated = end == "terminated"
        final_gone = (ep.stream, ep.rows[t + m]) in self.missing
        return dict(
            obs=self._stacked(ep, t),
            next_obs=np.zeros((self.k, *self.obs_shape), self.obs_dtype) if final_gone else self._stacked(ep, t + m),
            action=tr["action"].copy(),
            reward=np.float32(total),
            discount=np.float32(0.0) if terminated else np.float32(self.gamma ** m),
            terminated=terminated,
            truncated=end == "truncated",
            index=i,
            extras={name: value.copy() for name, value in tr["extras"].items()},
        )

    def sequence(self, i, length):
        """The sequence of ``length`` steps starting at sampleable transition ``i`` (SEMANTICS.md,
        "Sequences"): one row of a SequenceBatch, each field without the batch axis."""
        i = operator.index(i)
        if not (self.oldest_id <= i < self.next_id and self._complete_and_intact(i)):
            raise KeyError(i)
        ep, t = self.transitions[i]["episode"], self.transitions[i]["t"]
        steps = min(length, len(ep.ids) - t)  # the episode's steps written so far, from t on
        out = dict(
            obs=np.zeros((length + 1, self.k) + self.obs_shape, self.obs_dtype),
            action=np.zeros((length,) + self.action_shape, self.action_dtype),
            reward=np.zeros(length, np.float32),
            terminated=np.zeros(length, bool),
            truncated=np.zeros(length, bool),
            is_first=np.zeros(length, bool),
            mask=np.zeros(length, bool),
            ids=np.full(length, -1, np.int64),
            index=i,
            extras={name: np.zeros((length,) + shape, dtype) for name, (shape, dtype) in self.extras_spec.items()},
        )
        for j in range(steps):
            tid = ep.ids[t + j]
            tr = self.transitions[tid]
            last = t + j == len(ep.ids) - 1
            out["action"][j] = tr["action"]
            out["reward"][j] = tr["reward"]
            out["terminated"][j] = last and ep.end == "terminated"
            out["truncated"][j] = last and ep.end == "truncated"
            out["is_first"][j] = t + j == 0
            out["mask"][j] = True
            out["ids"][j] = tid
            for name, value in tr["extras"].items():
                out["extras"][name][j] = value
        for j in range(steps + 1):  # states before each step and after the last; zeros after that
            out["obs"][j] = self._stacked(ep, t + j)
        if (ep.stream, ep.rows[t + steps]) in self.missing:
            out["obs"][steps] = 0  # the final observation was not available
        return out

    def sequence_fits(self, i, length):
        """Whether sampleable transition ``i`` starts ``length`` steps of its episode (strict sequences)."""
        tr = self.transitions[i]
        return len(tr["episode"].ids) - tr["t"] >= length

    def current_obs(self):
        states = []
        for ep in self.current:
            if ep is None:
                raise RuntimeError("current_obs() before reset()")
            states.append(self._stacked(ep, len(ep.rows) - 1))
        return np.stack(states) if self.vector else states[0]

    # ---------------------------------------------------------------- rules

    def _first_retained_row(self, s):
        if self.rows_per_chunk is None or self.retired_chunks == 0:
            return 0
        if self.retired_chunks < len(self.chunks):
            return self.chunks[self.retired_chunks][s]
        return len(self.frames[s])

    def _next_row(self, tr):
        return tr["episode"].rows[tr["t"] + 1]

    def _window(self, tr):
        """(m, end) where end is the episode's end if it lies in the window else None;
        None while the window is still pending."""
        ep, t = tr["episode"], tr["t"]
        last = len(ep.ids) - 1  # the episode's latest transition so far
        if ep.end is not None and last - t < self.n:
            return last - t + 1, ep.end
        if len(ep.rows) > t + self.n:  # the frame at position t+n exists
            return self.n, None
        return None

    def _complete_and_intact(self, i):
        tr = self.transitions[i]
        window = self._window(tr)
        if window is None:
            return False
        ep, t = tr["episode"], tr["t"]
        m, end = window
        if (ep.stream, ep.rows[t + m]) in self.missing and end != "terminated":
            return False  # it would bootstrap from a final observation that is not there
        first_row = self._first_retained_row(ep.stream)
        for p in range(max(0, t - self.k + 1), t + 1):
            if ep.rows[p] < first_row:
                return False
        return True

    def _stacked(self, ep, pos):
        out = []
        for p in range(pos - self.k + 1, pos + 1):
            if p >= 0:
                out.append(self.frames[ep.stream][ep.rows[p]])
            elif self.pad == "first":
                out.append(self.frames[ep.stream][ep.rows[0]])
            else:
                out.append(np.zeros(self.obs_shape, self.obs_dtype))
        return np.stack(out)
