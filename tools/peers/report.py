"""Renders the `peers` section of BENCHMARKS.md from the measurements of ``tools/bench_peers.py``."""

from __future__ import annotations

import statistics
from typing import Any

from _report import table

GB = 1e9

LABELS = {
    ("mmreplay", ""): "mmreplay",
    ("torchrl", ""): "TorchRL LazyMemmapStorage",
    ("cpprb", "nstep"): "cpprb, Nstep 3",
    ("cpprb", "1step"): "cpprb, 1-step next_of",
    ("dopamine", ""): "Dopamine OutOfGraph",
}


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def fmt_rate(x: float) -> str:
    return "–" if x != x else f"{x:,.0f}"


def report(units: list[Any], source: str, installed: dict[str, list[list[str]]], args: Any,
           minutes: float, loads: list[float], malloc_rows: list[dict[str, Any]] | None = None) -> str:
    """The `peers` section of BENCHMARKS.md. ``installed``: the pip arguments of each peer installed."""
    rows, checks, notes = [], [], []
    groups: dict[tuple[str, str, int], dict[bool, Any]] = {}
    for u in units:
        groups.setdefault((*u.key, u.capacity), {})[u.prioritized] = u
    for (peer, variant, cap), pair in groups.items():
        uni, pri = pair.get(False), pair.get(True)
        label = LABELS[(peer, variant)]
        if all(x is None or x.skipped for x in (uni, pri)):
            reason = (uni or pri).skipped if (uni or pri) else ""
            rows.append([label, f"{cap:,}", f"not measured: {reason}"] + [""] * 8)
            continue

        def cell(fn: Any, pair: tuple[Any, ...] = (uni, pri)) -> str:
            vals = [fn(x) if x is not None and not x.skipped else "–" for x in pair]
            return " / ".join(vals)

        def append(x: Any) -> str:
            f = x.info["filled"]
            star = "*" if "batched_steps" in f else ""
            return f"{f['append_per_s']:,.0f}{star}"

        def ratio(x: Any) -> str:
            if x.peer == "mmreplay":
                return "–"
            return f"{med([m / r for m, r in zip(x.mm_rates, x.rates, strict=True)]):.2f}"

        def ck(x: Any, what: str) -> str:
            if x is None or x.skipped:
                return "–"
            if x.ckpt is None:
                return "–"
            if what == "bytes":
                return f"{x.ckpt['ckpt_bytes'] / GB:.2f}"
            return f"{x.ckpt[what]:.2f}"

        rows.append([
            f"**{label}**" if peer == "mmreplay" else label, f"{cap:,}",
            cell(append),
            fmt_rate(med(uni.rates)) if uni and not uni.skipped else "–",
            fmt_rate(med(pri.rates)) if pri and not pri.skipped else "–",
            cell(ratio),
            cell(lambda x: f"{x.info['filled']['rss_anon_mb']:,.0f}"),
            cell(lambda x: f"{x.info['filled']['disk_bytes'] / GB:.2f}"),
            cell(lambda x: ck(x, "save_s")), cell(lambda x: ck(x, "load_s")), cell(lambda x: ck(x, "bytes")),
        ])
        for x in (uni, pri):
            if x is None or x.skipped:
                continue
            c = x.info["checked"]
            shapes = c["shapes"]
            obs_key = next(k for k in ("obs", "pixels", "state") if k in shapes)
            checks.append([label, f"{cap:,}", x.kind, "×".join(map(str, shapes[obs_key])), f"{c['rows']:,}",
                           str(c["obs_bad"]), str(c["next_bad"]), f"{c['reward_err']:.1e}",
                           f"{c['terminal_flag_bad']} of {c['terminal_rows']}",
                           str(c["terminal_next_bad"])])
        for x in (uni, pri):
            if x is not None and x.skipped:
                notes.append(f"{label} {x.kind} at {cap:,}: not measured ({x.skipped}).")
            elif x is not None and x.ckpt is None and x.ckpt_skipped:
                notes.append(f"{label} {x.kind} at {cap:,}: checkpoint not measured ({x.ckpt_skipped}).")
    versions: dict[str, dict[str, str]] = {}
    for u in units:
        if u.info.get("versions"):
            versions.setdefault(u.peer, {}).update(u.info["versions"])
    extra = extras(units)
    header = ["buffer", "capacity", "append /s (u / p)", "uniform sample(32) /s", "prioritized sample+update /s",
              "mmreplay ÷ peer, same windows (u / p)", "RssAnon MB (u / p)", "disk GB (u / p)",
              "save s (u / p)", "load s (u / p)", "checkpoint GB (u / p)"]
    body = [
        "## Peers: mmreplay against TorchRL, cpprb and Dopamine"
        + (" (mmreplay with raw frames)" if args.mmreplay_compression == "none" else ""),
        "",
        "mmreplay's stores keep "
        + ("their frames raw (`compression=None`)." if args.mmreplay_compression == "none" else
           "the frames of sealed chunks LZ4-compressed (`compression=\"auto\"`, the default for images)."),
        "",
        f"Reference workload (see the top of this file): {source} cycled, 84x84 uint8, stack 4, n-step 3, gamma 0.99,",
        "batch 32, episodes of 100..3000 steps (seeded, all terminated), every buffer fed the same transitions",
        "and filled to 1.1x capacity one transition at a time through its add call (only the add calls are",
        "timed; building each call's input is not). Each buffer runs in its own process and virtual",
        "environment; uniform (u) and prioritized (p) buffers are separate processes. Sampling: `sample(32)`",
        "per second, prioritized: `sample(32)` + `update_priorities(32)` with random priorities (alpha 0.6,",
        f"beta 0.4), on warm data, in {args.rounds} windows of {args.seconds:g} s alternating with an mmreplay",
        "process of the same kind that lives through the whole run; medians, and the median of the per-window",
        "ratios (mmreplay's rate over the peer's, > 1: mmreplay faster). RssAnon: anonymous memory of the",
        "process after filling (imports included; mapped file pages excluded). Disk: allocated bytes of the",
        "buffer's files. Save/load: the peer's checkpoint API into a new directory, then a new buffer loaded",
        "from it (the original dropped first); checkpoint GB: new bytes the save wrote (hard links not counted).",
        "",
        table(header, rows),
        "",
        "Targets: mmreplay's uniform and prioritized rates at least every peer's (ratio >= 1), its RssAnon the",
        "lowest of all, its disk bytes the lowest among disk-backed buffers (in-RAM buffers use none).",
        "",
        "\\* TorchRL: append rate of the first transitions added one at a time (a time budget of "
        f"{args.append_budget:g} s), the rest added with `extend()` in batches of 256 "
        + extra.get("torchrl_batched", "") + ".",
        "",
        "Every buffer's batches were checked row by row against the workload (which transition each row is",
        "comes from the returned indices): stacked shape, obs frames, next-obs frames (rows without a",
        "termination in their window), n-step reward, and the termination flag where the window holds one",
        "(1-step expectations for cpprb's 1-step buffer).",
        "",
        table(["buffer", "capacity", "kind", "obs batch", "rows", "obs wrong", "next wrong", "reward err",
               "termination flag wrong", "next wrong, terminal rows"], checks),
        "",
        *allocator(units, malloc_rows or [], args),
        "### What was configured",
        "",
        *paragraphs(extra, versions, installed),
    ]
    if notes:
        body += ["", "### Not measured", "", *[f"- {n}" for n in notes]]
    body += ["", f"The whole run took {minutes:.0f} minutes; the machine's 1-minute load average at its start and"
             f" end: {loads[0]:.1f} and {loads[-1]:.1f} (other work shares this machine: compare rates through"
             " the ratio column, measured in neighbouring windows)."]
    return "\n".join(body)


def allocator(units: list[Any], rows: list[dict[str, Any]], args: Any) -> list[str]:
    """The subsection on the allocator state every buffer process is measured in."""
    states = sorted({u.info.get("malloc", "?") for u in units if u.info})
    out = [
        "### Allocator state: every process as a long-running learner",
        "",
        "A batch of 32 Atari stacks is ~1.8 MB (obs and next_obs). glibc serves a request above its mmap",
        "threshold (128 KB in a new process) with a fresh mmap and unmaps it when it is freed, so in a process",
        "that just started every batch output costs a new mapping, a page fault per page written and the zeroing",
        "of every page; freeing such a block also raises the threshold to its size (up to 32 MB), after which those",
        "sizes come from the heap and are reused. A learner that has trained for a while is in that second",
        "state. So every buffer process, mmreplay's included, allocates and frees one 16 MB block at",
        "start-up, before importing anything else (`learner_malloc_state` in tools/peers/common.py; ctypes,",
        "`malloc` and `free` of the C library); `--malloc fresh` turns it off. State of the processes in this"
        f" run: {', '.join(states)}.",
    ]
    if rows:
        table_rows = [[LABELS[(r["peer"], r["variant"])], f"{r['capacity']:,}", f"{r['fresh_rate']:,.0f}",
                       f"{r['fresh_minflt']:,.0f}", f"{r['learner_rate']:,.0f}", f"{r['learner_minflt']:,.0f}",
                       f"{r['ratio']:.2f}"] for r in rows]
        out += [
            "",
            f"Check (uniform buffers at {rows[0]['capacity']:,}, {args.rounds} alternating windows of"
            f" {args.seconds:g} s between a process in each state): `sample(32)` per second and minor page faults"
            " per batch.",
            "",
            table(["buffer", "capacity", "fresh process /s", "faults/batch", "learner state /s", "faults/batch",
                   "learner ÷ fresh"], table_rows),
        ]
    return out + [""]


def extras(units: list[Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    tr = [u for u in units if u.peer == "torchrl" and not u.skipped and "batched_per_s" in u.info["filled"]]
    if tr:
        parts = [f"{u.info['filled']['batched_per_s']:,.0f}/s ({u.kind}, {u.capacity:,})" for u in tr]
        out["torchrl_batched"] = "(" + ", ".join(parts) + ")"
    for peer in ("torchrl", "mmreplay"):
        ck = [u for u in units if u.peer == peer and u.ckpt]
        if peer == "torchrl" and ck:
            out["torchrl_inplace"] = ", ".join(
                f"save {u.ckpt['save_inplace_s']:.2f} s / load {u.ckpt['load_inplace_s']:.2f} s "
                f"({u.kind}, {u.capacity:,})" for u in ck)
        if peer == "mmreplay" and ck:
            out["mm_api"] = ck[0].ckpt.get("api", "")
            out["mm_commit"] = ", ".join(f"{u.ckpt['commit_s']:.3f} s ({u.kind}, {u.capacity:,})" for u in ck
                                         if u.ckpt.get("commit_s") is not None)
    base = {u.peer: u.info.get("rss_anon_base_mb") for u in units if u.info.get("rss_anon_base_mb")}
    out["base_rss"] = ", ".join(f"{p} {v:,.0f} MB" for p, v in sorted(base.items()))
    return out


def paragraphs(extra: dict[str, str], versions: dict[str, dict[str, str]],
               installed: dict[str, list[list[str]]]) -> list[str]:
    def v(peer: str) -> str:
        d = versions.get(peer, {})
        return ", ".join(f"{k} {val}" for k, val in d.items() if k != "checkpoint_api")

    mm_ckpt = ("`store.save(dir)` and `ReplayStore.load(dir, path)`" if extra.get("mm_api", "save/load") ==
               "save/load" else "`commit()` and `ReplayStore.open()` (save/load were not available)")
    out = [
        f"- **mmreplay** ({v('mmreplay')}): `ReplayStore.create(path, capacity, obs_shape=(84, 84), stack=4,"
        " n_step=3, gamma=0.99, prioritized=None | mr.Prioritized(alpha=0.6, beta=0.4))`, `reset()` and"
        " `step()` per transition, `commit()` after filling (" + extra.get("mm_commit", "") + "), `sample(32)`,"
        f" `update_priorities()`. Checkpoint: {mm_ckpt}. Stores each frame once on disk.",
        f"- **TorchRL** ({v('torchrl')}): `TensorDictReplayBuffer(storage=LazyMemmapStorage(capacity),"
        " sampler=RandomSampler() | PrioritizedSampler(capacity, alpha=0.6, beta=0.4),"
        " transform=MultiStepTransform(n_steps=3, gamma=0.99))`. Stored per transition, in TorchRL's"
        " TED layout as its Atari DQN example does: `pixels` (the stacked state, uint8 4x84x84; the example"
        " stores float32, 4x more) and `(\"next\", \"pixels\")`, plus action, reward, done, terminated,"
        " truncated: two stacks (8 frames) per transition. Its memory-saving alternative (single frames"
        " with `CatFrames` applied at sampling by a `SliceSampler` reading 4 rows per transition) has no"
        " equivalent of `PrioritizedSampler` per transition and is not measured. One transition is added"
        " as `extend()` of a batch of one (`MultiStepTransform` needs a time dimension; most of each"
        " add's time is that transform). Checkpoint: `dumps(dir)` (copies the storage) and `loads(dir)`"
        " into a new buffer with its own scratch directory (copies again). The documented zero-copy"
        " forms, dumping into the storage's own directory and loading with `scratch_dir` set to the"
        " checkpoint, took " + extra.get("torchrl_inplace", "–") + "; the first is the live files, which"
        " training goes on overwriting, not a snapshot. `torch.set_num_threads(1)`: with torch's default"
        " of one thread per core, any other busy process on this 2-core machine made adds and samples up"
        " to 10x slower; one thread is faster for these small operations. TorchRL's wheels are built"
        " against an older torch"
        " than the required 2.13.0: its C++ extension (the segment trees) loads only with lazy symbol"
        " binding, which the benchmark uses; the checks above verify what it samples.",
        f"- **cpprb** ({v('cpprb')}): `ReplayBuffer` / `PrioritizedReplayBuffer(alpha=0.6)` sampled with"
        " `sample(32)` / `sample(32, beta=0.4)`, uint8 `obs` of shape (84, 84, 4) (the stack on the last axis,"
        " as `stack_compress` requires), `on_episode_end()` after each episode. *Nstep 3*: `Nstep={size: 3,"
        " gamma: 0.99, rew: rew, next: next_obs}`, `stack_compress=\"obs\"`; cpprb disables `next_of` with"
        " Nstep, so `next_obs` is its own field holding full stacks (compressing it too returns wrong"
        " frames: the n-step tail of each episode does not slide). *1-step*: `next_of=\"obs\"` +"
        " `stack_compress=\"obs\"`, cpprb's most compact layout, but it returns 1-step transitions: less"
        " work than the reference workload. In RAM only (its `mmap_prefix` files cannot be reopened)."
        " Checkpoint: `save_transitions(file, safe=False)` (keeps the compressed layout; the default"
        " `safe=True` first expands every stack) and `load_transitions()`; priorities are not saved.",
        f"- **Dopamine** ({v('dopamine')}): `OutOfGraphReplayBuffer` / `OutOfGraphPrioritizedReplayBuffer`"
        " with `observation_shape=(84, 84), stack_size=4, replay_capacity, batch_size=32, update_horizon=3,"
        " gamma=0.99` from the dopamine-rl package (installed without its declared dependencies; its"
        " replay modules need only tensorflow-cpu, gin-config and absl-py), `add(observation, action,"
        " reward, terminal)` per step (prioritized: with `priority=sum_tree.max_recorded_priority`, as its"
        " agents do), `sample_transition_batch(32)`, `set_priority()`. In RAM; one frame per add plus 3"
        " zero-padding transitions per episode start; it never stores an episode's final observation."
        " Its prioritized sampling uses priorities as given (its agents pass sqrt-scaled losses; no"
        " alpha or beta). Checkpoint: `save(dir, iteration)` / `load(dir, iteration)` (gzip of every array).",
        "",
        "Semantic differences the checks show (the flag column of the second table): a row whose n-step"
        " window reaches its episode's terminal step should not bootstrap. cpprb's Nstep marks done on such"
        " rows only when the termination is within the window's first n-1 steps (its done sums look n-2"
        " steps ahead), so the row whose window ends exactly on the terminal step keeps done = 0; TorchRL's"
        " `MultiStepTransform` marks `(\"next\", \"terminated\")` only on the terminal step's own row, so"
        " the n-1 rows before it keep it False (with `nonterminal` True and `gamma` = 0.99^m). Those rows"
        " bootstrap from the terminal observation unless the learner corrects for it. For terminal rows"
        " Dopamine returns an undefined next state, as its docstring says, and cpprb (Nstep) a left-over"
        " one. mmreplay returns discount 0 after a termination inside the window and next_obs ="
        " the final observation's stack (README, \"What a sampled row means\"). All of them pad stacks at an episode start with zero frames"
        " here. RssAnon includes each interpreter's imports before any buffer exists: "
        + extra.get("base_rss", "") + ".",
    ]
    if installed:
        out += ["", "Installed by the benchmark, one virtual environment per peer: " + "; ".join(
            f"{p}: `pip install {' && pip install '.join(' '.join(a) for a in steps)}`"
            for p, steps in installed.items())
            + "."]
    return out
