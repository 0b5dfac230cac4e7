"""Pictures of a store: ``mmreplay show`` (transitions as frames) and ``mmreplay stats`` (episodes, priorities).

``show`` draws one line per transition: the stacked ``obs`` frames (oldest first), an arrow, the
stacked ``next_obs`` frames, and under them the id, env, step in the episode, action, n-step reward,
discount, flags and extras. Frames that lie before the episode's first observation (stack padding:
zeros or a repeated first frame, per the store's ``pad``) get an orange border, and their row an
orange tint - a stacking bug shows at a glance. Image observations (``(H, W)``, ``(H, W, C)`` or
``(C, H, W)`` with C in 1, 3, 4) are drawn as pictures; vectors (up to 64 values) as bar charts.

``stats`` reports the episodes' returns and lengths over time, the priority distribution
(prioritized stores) and how much of the store is sampleable, as text and as a picture: each
panel has titled axes with round, thousands-separated ticks, and the episode panels a legend
for their dots (one per episode) and the running mean (over about a tenth of the episodes).

Pictures need Pillow (``pip install 'mmreplay[image]'``), imported only when a picture is made.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import NotSampleableError
from ..reading.batch import Batch
from ..store import ReplayStore
from .main import non_negative_int, out, output_file, positive_int, require_store

__all__ = ["stack_padding", "show_image", "StoreStats", "store_stats", "stats_text", "stats_image"]

PAD_COLOR = (255, 140, 0)
PAD_TINT = (255, 236, 214)
INK = (20, 20, 20)
MARGIN, GAP, ARROW, HEADER, LINE_H, ROW_GAP = 8, 2, 28, 34, 15, 8
STATS_SIZE = (960, 720)
MAX_BARS = 64
MAX_ROWS = 64  # rows of one show picture: all go into one image, so its height grows with them


def _pil() -> Any:
    """Pillow's ``Image``/``ImageDraw``/``ImageFont``, or an ImportError naming the extra."""
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError:
        raise ImportError("pictures need Pillow: pip install 'mmreplay[image]'") from None
    return Image, ImageDraw, ImageFont


def _font(size: int = 12) -> Any:
    return _pil()[2].load_default(size=size)


# -- which frames are padding ---------------------------------------------------------------------------
def stack_padding(store: ReplayStore, ids: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(obs_pad, next_pad, env, t)`` for sampleable ids: ``(B, k)`` bools marking the stack frames that lie
    before the episode's first observation, each row's env, and its step in the episode.

    Env and step come from the store's own table of transitions (``to_pandas()``'s ``env`` and ``step``):
    ids are handed out in write order, and env streams may be written at their own pace, so an id's row
    cannot be worked out from the episodes alone. Padding follows from the step as the store pads a row.
    """
    ids = np.asarray(ids, np.int64)
    sch = store.schema
    k, n = sch.stack, sch.n_step
    if ids.size == 0:
        return np.zeros((0, k), np.bool_), np.zeros((0, k), np.bool_), np.zeros(0, np.int64), np.zeros(0, np.int64)
    cols = store._table_columns()
    known = cols["id"]  # in id order
    at = np.minimum(np.searchsorted(known, ids), max(known.size - 1, 0))
    if known.size == 0 or not np.array_equal(known[at], ids):
        bad = ids[0] if known.size == 0 else ids[known[at] != ids][0]
        raise ValueError(f"stack_padding: id {int(bad)} is not a retained transition of {store.path}; give"
                         " sampleable ids (store.sampleable_ids())")
    env, t, episode = cols["env"][at], cols["step"][at], cols["episode"]
    last = np.full(int(episode.max()) + 1, -1, np.int64)
    np.maximum.at(last, episode, cols["step"])  # each episode's last step written
    m = np.minimum(n, last[episode[at]] - t + 1)  # the n-step window, cut at the episode's end
    j = np.arange(k)[None, :] - (k - 1)
    obs_pad = t[:, None] + j < 0
    next_pad = (t + m)[:, None] + j < 0
    return obs_pad, next_pad, env, t


# -- show ------------------------------------------------------------------------------------------------
def _frame_kind(shape: tuple[int, ...]) -> str:
    if len(shape) == 2:
        return "gray"
    if len(shape) == 3 and shape[2] in (1, 3, 4):
        return "hwc"
    if len(shape) == 3 and shape[0] in (1, 3, 4):
        return "chw"
    if int(np.prod(shape)) <= MAX_BARS:
        return "bars"
    raise ValueError(f"show: cannot draw observations of shape {shape} (images (H, W), (H, W, C), (C, H, W),"
                     f" or vectors of at most {MAX_BARS} values); use store.gather() to look at them")


def _as_pixels(frames: np.ndarray, kind: str) -> np.ndarray:
    """``(..., H, W[, C])`` uint8 pixels of image frames; other dtypes are scaled to 0..255 over all frames."""
    if kind == "chw":
        frames = np.moveaxis(frames, -3, -1)
    if frames.dtype != np.uint8:
        f = frames.astype(np.float64)
        lo, hi = float(np.nanmin(f)), float(np.nanmax(f))
        frames = np.rint((f - lo) / (hi - lo if hi > lo else 1.0) * 255).astype(np.uint8)
    if frames.ndim >= 3 and frames.shape[-1] == 1 and kind != "gray":
        frames = frames[..., 0]
    return frames


def _tile_size(shape: tuple[int, ...], kind: str) -> tuple[int, int]:
    if kind == "bars":
        return 96, 96
    h, w = (shape[1], shape[2]) if kind == "chw" else (shape[0], shape[1])
    scale = max(1, round(96 / max(h, w)))
    return h * scale, w * scale


def _fmt(value: Any) -> str:
    a = np.asarray(value)
    if a.ndim == 0:
        return f"{a.item():.4g}" if a.dtype.kind == "f" else str(a.item())
    return np.array2string(a, precision=3, separator=",", threshold=8)


def _draw_bars(draw: Any, x: int, y: int, size: tuple[int, int], values: np.ndarray, scale: float) -> None:
    h, w = size
    v = values.astype(np.float64).ravel()
    mid = y + h // 2
    draw.line([(x, mid), (x + w - 1, mid)], fill=(150, 150, 150))
    bw = max(1, (w - 4) // v.size)
    for i, val in enumerate(v):
        bh = int(round((h // 2 - 2) * (val / scale if scale > 0 else 0.0)))
        x0 = x + 2 + i * bw
        y0, y1 = (mid - bh, mid) if bh >= 0 else (mid, mid - bh)
        draw.rectangle([x0, y0, x0 + max(bw - 2, 0), y1], fill=(60, 110, 200) if val >= 0 else (200, 70, 60))


def _row_lines(store: ReplayStore, batch: Batch, r: int, env: int, t: int, kind: str) -> list[str]:
    sch = store.schema
    step = f"t={t}" if t >= 0 else "t=?"
    extras = "  ".join(f"{name} {_fmt(v[r])}" for name, v in batch.extras.items())
    lines = [f"id {int(batch.index[r])}  env {env}  {step}  action {_fmt(batch.action[r])}" +
             (f"  {extras}" if extras else ""),
             f"{sch.n_step}-step reward {batch.reward[r]:.4g}  discount {batch.discount[r]:.4g}  terminated"
             f" {bool(batch.terminated[r])}  truncated {bool(batch.truncated[r])}  weight {batch.weight[r]:.3g}"]
    if kind == "bars":
        lines.append(f"obs[-1] {_fmt(batch.obs[r, -1])}  next_obs[-1] {_fmt(batch.next_obs[r, -1])}")
    return lines


def show_image(store: ReplayStore, batch: Batch) -> Any:
    """A PIL image of ``batch``'s rows (see the module docstring for the layout).

    Width: ``2 * MARGIN + 2 * (k * tile_w + (k - 1) * GAP) + ARROW`` (wider if a text line needs it);
    height: ``HEADER + rows * (tile_h + text + ROW_GAP)``.
    """
    Image, ImageDraw, _ = _pil()
    sch = store.schema
    k, shape = sch.stack, sch.obs_shape
    kind = _frame_kind(shape)
    th, tw = _tile_size(shape, kind)
    obs_pad, next_pad, env, t = stack_padding(store, batch.index)
    font, small = _font(12), _font(10)
    header = [f"{store.path}: obs {shape} {sch.obs_dtype}, stack {k} (pad {sch.pad!r}), n_step {sch.n_step},"
              f" gamma {sch.gamma}",
              "obs (oldest frame first) -> next_obs; orange border: padding before the episode start"]
    texts = [_row_lines(store, batch, r, int(env[r]), int(t[r]), kind) for r in range(len(batch))]
    block = k * tw + (k - 1) * GAP
    text_w = max([font.getlength(line) for rows in texts for line in rows] + [font.getlength(header[0])])
    width = max(2 * MARGIN + 2 * block + ARROW, int(text_w) + 2 * MARGIN)
    text_h = LINE_H * len(texts[0]) + 4 if texts else 0
    row_h = th + text_h + ROW_GAP
    img = Image.new("RGB", (width, HEADER + len(batch) * row_h), "white")
    draw = ImageDraw.Draw(img)
    draw.text((MARGIN, 4), header[0], fill=INK, font=font)
    draw.text((MARGIN, 18), header[1], fill=PAD_COLOR, font=small)
    both = np.stack([batch.obs, batch.next_obs], axis=1)  # (B, 2, k, *shape)
    pixels = None if kind == "bars" else _as_pixels(both, kind)
    scale = float(np.abs(both.astype(np.float64)).max()) if kind == "bars" else 0.0
    for r in range(len(batch)):
        y = HEADER + r * row_h
        pads = (obs_pad[r], next_pad[r])
        if pads[0].any() or pads[1].any():
            draw.rectangle([0, y - ROW_GAP // 2, width, y + th + text_h + ROW_GAP // 2 - 1], fill=PAD_TINT)
        for half in range(2):
            x0 = MARGIN + half * (block + ARROW)
            for j in range(k):
                x = x0 + j * (tw + GAP)
                if pixels is None:
                    draw.rectangle([x, y, x + tw - 1, y + th - 1], fill=(245, 245, 245))
                    _draw_bars(draw, x, y, (th, tw), both[r, half, j], scale)
                else:
                    p = pixels[r, half, j]
                    tile = Image.fromarray(p, "L" if p.ndim == 2 else ("RGBA" if p.shape[-1] == 4 else "RGB"))
                    img.paste(tile.convert("RGB").resize((tw, th), Image.Resampling.NEAREST), (x, y))
                if pads[half][j]:
                    draw.rectangle([x, y, x + tw - 1, y + th - 1], outline=PAD_COLOR, width=3)
        ay = y + th // 2
        draw.line([(MARGIN + block + 6, ay), (MARGIN + block + ARROW - 6, ay)], fill=INK, width=2)
        draw.polygon([(MARGIN + block + ARROW - 6, ay - 4), (MARGIN + block + ARROW - 2, ay),
                      (MARGIN + block + ARROW - 6, ay + 4)], fill=INK)
        for i, line in enumerate(texts[r]):
            draw.text((MARGIN, y + th + 3 + LINE_H * i), line, fill=INK, font=font)
    return img


# -- stats -----------------------------------------------------------------------------------------------
@dataclass
class StoreStats:
    """The numbers ``stats`` reports. Episode arrays cover complete episodes (first observation retained,
    ended), in the order they started."""

    path: str
    capacity: int
    id_range: tuple[int, int]
    sampleable: int
    episodes: int
    open_episodes: int
    terminated: int
    truncated: int
    returns: np.ndarray
    lengths: np.ndarray
    priorities: np.ndarray | None
    max_priority: float | None

    @property
    def retained(self) -> int:
        return self.id_range[1] - self.id_range[0]


def store_stats(store: ReplayStore) -> StoreStats:
    table = store.episodes()
    done = table.complete
    order = np.argsort(table.first_row[done], kind="stable")
    prios = max_p = None
    if store.schema.prioritized is not None:
        ids = store.sampleable_ids()
        prios = store.priorities(ids) if ids.size else np.zeros(0)
        max_p = store.max_priority
    return StoreStats(store.path, store.capacity, store.id_range, len(store), len(table),
                      int((~table.ended).sum()), int(table.terminated.sum()), int(table.truncated.sum()),
                      table.returns[done][order], table.length[done][order], prios, max_p)


def number(v: float) -> str:
    """A number as people read it: whole numbers with thousands separators (``1,110``, never ``1.11e+03``),
    others with 4 significant digits (one decimal from 1,000 up)."""
    v = float(v)
    if not np.isfinite(v):
        return str(v)
    if v == round(v) and abs(v) < 1e15:
        return f"{int(round(v)):,}"
    if abs(v) >= 1000:
        return f"{v:,.1f}"
    return f"{v:.4g}"


def _summary(a: np.ndarray) -> str:
    if a.size == 0:
        return "-"
    return f"mean {number(a.mean())}, min {number(a.min())}, median {number(np.median(a))}, max {number(a.max())}"


def stats_text(s: StoreStats) -> list[str]:
    lo, hi = s.id_range
    if s.retained:
        held = (f"{s.retained:,} retained (ids {lo}..{hi - 1}), {s.sampleable:,} sampleable ="
                f" {s.sampleable / s.retained:.2%} of retained, {s.sampleable / s.capacity:.2%} of capacity"
                f" {s.capacity:,}")
    else:
        held = f"none retained (next id {hi:,}), 0 sampleable; capacity {s.capacity:,}"
    lines = [
        f"store         {s.path}",
        f"transitions   {held}",
        f"episodes      {s.episodes:,} with retained frames: {s.terminated:,} terminated, {s.truncated:,}"
        f" truncated, {s.open_episodes:,} open; {s.returns.size:,} complete",
        f"returns       {_summary(s.returns)}" + (f"; last 10: mean {number(s.returns[-10:].mean())}"
                                                  if s.returns.size else ""),
        f"lengths       {_summary(s.lengths.astype(np.int64))} transitions",
    ]
    if s.priorities is None:
        lines.append("priorities    - (uniform sampling)")
    else:
        lines.append(f"priorities    {_summary(s.priorities)}; max ever {number(s.max_priority or 0.0)}")
    return lines


# -- drawing the stats picture ---------------------------------------------------------------------------
def nice_ticks(lo: float, hi: float, count: int = 5, integer: bool = False) -> np.ndarray:
    """About ``count`` round tick values (steps of 1, 2 or 5 x 10^k; at least 1 when ``integer``) that cover
    ``[lo, hi]``: the first tick is <= lo and the last >= hi."""
    if not hi > lo:
        lo, hi = lo - 1, hi + 1
    raw = (hi - lo) / max(count - 1, 1)
    mag = 10.0 ** np.floor(np.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    if integer:
        step = max(1.0, float(np.ceil(step)))
    first, last = np.floor(lo / step) * step, np.ceil(hi / step) * step
    ticks = first + step * np.arange(int(round((last - first) / step)) + 1)
    return np.round(ticks, 12)


def tick_labels(ticks: np.ndarray) -> list[str]:
    """Labels with the decimals the tick step needs, thousands separated: ``0, 250, 500, ..., 1,000``."""
    step = float(ticks[1] - ticks[0]) if ticks.size > 1 else 1.0
    decimals = int(-np.floor(np.log10(step))) if step < 1 else 0
    labels = []
    for t in ticks.tolist():
        label = f"{t:,.{decimals}f}"
        labels.append(label.lstrip("-") if float(label.replace(",", "")) == 0 else label)  # no "-0"
    return labels


@dataclass
class _Plot:
    """A panel's plotting area and its data ranges (x and y both increase to the right / upwards)."""

    draw: Any
    area: tuple[int, int, int, int]
    xr: tuple[float, float]
    yr: tuple[float, float]

    def x(self, v: Any) -> Any:
        x0, _, x1, _ = self.area
        return x0 + (np.asarray(v, np.float64) - self.xr[0]) / (self.xr[1] - self.xr[0]) * (x1 - x0)

    def y(self, v: Any) -> Any:
        _, y0, _, y1 = self.area
        return y1 - (np.asarray(v, np.float64) - self.yr[0]) / (self.yr[1] - self.yr[0]) * (y1 - y0)


def _text_size(font: Any, text: str) -> tuple[int, int]:
    left, top, right, bottom = font.getbbox(text)
    return int(right - left), int(bottom - top)


def _vertical_text(img: Any, center: tuple[float, float], text: str, font: Any) -> None:
    """``text`` rotated 90 degrees (read bottom to top), centred on ``center``: a y-axis title."""
    Image, ImageDraw, _ = _pil()
    w, h = _text_size(font, text)
    label = Image.new("L", (w + 4, h + 6), 0)
    ImageDraw.Draw(label).text((2, 1), text, fill=255, font=font)
    label = label.rotate(90, expand=True)
    img.paste(INK, (int(center[0] - label.width / 2), int(center[1] - label.height / 2)), mask=label)


def _panel(draw: Any, box: tuple[int, int, int, int], title: str, font: Any) -> tuple[int, int, int, int]:
    """Frame and title a panel; return its plotting area (room left for tick labels, axis titles, legend)."""
    x0, y0, x1, y1 = box
    draw.rectangle(box, outline=(200, 200, 200))
    draw.text((x0 + 8, y0 + 6), title, fill=INK, font=font)
    return x0 + 78, y0 + 46, x1 - 16, y1 - 42


def _axes(img: Any, draw: Any, area: tuple[int, int, int, int], x: tuple[float, float, bool],
          y: tuple[float, float, bool], titles: tuple[str, str], font: Any) -> _Plot:
    """Axes over ``area`` with round ticks, readable labels and titles; ``x``/``y``: (lo, hi, integer)."""
    x0, y0, x1, y1 = area
    xt, yt = nice_ticks(x[0], x[1], 6, x[2]), nice_ticks(y[0], y[1], 5, y[2])
    plot = _Plot(draw, area, (float(xt[0]), float(xt[-1])), (float(yt[0]), float(yt[-1])))
    for value, label in zip(yt.tolist(), tick_labels(yt), strict=True):
        yy = float(plot.y(value))
        draw.line([(x0, yy), (x1, yy)], fill=(235, 235, 235))
        w, h = _text_size(font, label)
        draw.text((x0 - 6 - w, yy - h / 2 - 2), label, fill=INK, font=font)
    for value, label in zip(xt.tolist(), tick_labels(xt), strict=True):
        xx = float(plot.x(value))
        draw.line([(xx, y1), (xx, y1 + 3)], fill=INK)
        w, _ = _text_size(font, label)
        draw.text((xx - w / 2, y1 + 5), label, fill=INK, font=font)
    draw.line([(x0, y0), (x0, y1), (x1, y1)], fill=INK)
    w, _ = _text_size(font, titles[0])
    draw.text(((x0 + x1) / 2 - w / 2, y1 + 22), titles[0], fill=INK, font=font)
    widest = max(_text_size(font, label)[0] for label in tick_labels(yt))
    _vertical_text(img, (x0 - 6 - widest - 12, (y0 + y1) / 2), titles[1], font)
    return plot


def _legend(draw: Any, at: tuple[int, int], entries: list[tuple[str, str, tuple[int, int, int]]], font: Any) -> None:
    """One row of legend entries: ``(kind, label, color)`` with kind ``"dot"``, ``"line"`` or ``"bar"``."""
    x, y = at
    for kind, label, color in entries:
        if kind == "dot":
            draw.ellipse([x + 7, y + 4, x + 12, y + 9], fill=color)
        elif kind == "bar":
            draw.rectangle([x + 5, y + 2, x + 15, y + 12], fill=color)
        else:
            draw.line([(x, y + 7), (x + 20, y + 7)], fill=color, width=2)
        draw.text((x + 26, y), label, fill=INK, font=font)
        x += 26 + _text_size(font, label)[0] + 18


def running_window(n: int) -> int:
    """Episodes averaged by the running-mean line: about a tenth of them, between 2 and 50."""
    return int(min(50, max(2, n // 10)))


def _series(img: Any, draw: Any, box: tuple[int, int, int, int], title: str, ys: np.ndarray,
            what: str, color: tuple[int, int, int], fonts: tuple[Any, Any]) -> None:
    """Per-episode values as dots, in start order, with a labelled running mean."""
    font, small = fonts
    area = _panel(draw, box, title, font)
    if ys.size == 0:
        draw.text((area[0] + 10, area[1] + 10), "no complete episode yet", fill=INK, font=font)
        return
    integer = ys.dtype.kind in "iub"
    v = ys.astype(np.float64)
    plot = _axes(img, draw, area, (0, max(ys.size - 1, 1), True), (float(v.min()), float(v.max()), integer),
                 ("episode (in start order)", what), small)
    xs, py = plot.x(np.arange(ys.size)), plot.y(v)
    for x, y in zip(xs.tolist(), py.tolist(), strict=True):
        draw.ellipse([x - 2, y - 2, x + 2, y + 2], fill=color)
    w = running_window(ys.size)
    entries = [("dot", f"each episode ({what})", color)]
    if ys.size >= 2 * w:  # a mean over most of the points says nothing
        avg = np.convolve(v, np.ones(w) / w, mode="valid")
        draw.line(list(zip(xs[w - 1:].tolist(), plot.y(avg).tolist(), strict=True)), fill=INK, width=2)
        entries.append(("line", f"running mean of {w} episodes", INK))
    _legend(draw, (box[0] + 10, box[1] + 24), entries, small)


def _histogram(img: Any, draw: Any, box: tuple[int, int, int, int], values: np.ndarray | None,
               fonts: tuple[Any, Any]) -> None:
    font, small = fonts
    area = _panel(draw, box, "priorities of sampleable transitions", font)
    if values is None or values.size == 0:
        draw.text((area[0], area[1] + 10), "uniform store: no priorities" if values is None else
                  "nothing sampleable", fill=INK, font=font)
        return
    counts, edges = np.histogram(values, bins=40)
    plot = _axes(img, draw, area, (float(edges[0]), float(edges[-1]), False), (0.0, float(counts.max()), True),
                 ("priority (as last set)", "transitions"), small)
    for c, lo, hi in zip(counts.tolist(), plot.x(edges[:-1]).tolist(), plot.x(edges[1:]).tolist(), strict=True):
        if c:
            draw.rectangle([lo + 1, float(plot.y(c)), max(lo + 1, hi - 1), area[3]], fill=(120, 80, 180))
    _legend(draw, (box[0] + 10, box[1] + 24), [("bar", f"transitions per bin (40 bins, {values.size:,} in all)",
                                                 (120, 80, 180))], small)


def stats_image(s: StoreStats) -> Any:
    """A ``STATS_SIZE`` PIL image: returns, lengths, priorities, and the store's fill."""
    Image, ImageDraw, _ = _pil()
    w, h = STATS_SIZE
    img = Image.new("RGB", STATS_SIZE, "white")
    draw = ImageDraw.Draw(img)
    fonts = (_font(13), _font(11))
    font = fonts[0]
    draw.text((10, 6), f"mmreplay stats: {s.path}", fill=INK, font=font)
    top, hw, hh = 28, w // 2, (h - 28) // 2
    boxes = [(4, top, hw - 4, top + hh - 4), (hw + 4, top, w - 4, top + hh - 4),
             (4, top + hh + 4, hw - 4, h - 4), (hw + 4, top + hh + 4, w - 4, h - 4)]
    _series(img, draw, boxes[0], f"episode returns ({s.returns.size:,} complete episode{'' if s.returns.size == 1 else 's'})", s.returns, "return",
            (40, 120, 200), fonts)
    _series(img, draw, boxes[1], "episode lengths", s.lengths.astype(np.int64), "transitions", (40, 160, 90), fonts)
    _histogram(img, draw, boxes[2], s.priorities, fonts)
    x0, y0, x1, y1 = boxes[3]
    draw.rectangle(boxes[3], outline=(200, 200, 200))
    draw.text((x0 + 8, y0 + 6), "store (transitions)", fill=INK, font=font)
    x0, y0, x1 = x0 + 12, y0 + 34, x1 - 12
    full = max(s.capacity, s.retained, 1)
    for i, (label, value, color) in enumerate((("capacity", s.capacity, (190, 190, 190)),
                                               ("retained", s.retained, (90, 140, 210)),
                                               ("sampleable", s.sampleable, (60, 170, 90)))):
        y = y0 + 10 + i * 40
        draw.rectangle([x0, y, x0 + (x1 - x0) * value / full, y + 24], fill=color)
        draw.text((x0 + 6, y + 6), f"{label} {value:,}", fill=INK, font=font)
    frac = s.sampleable / s.retained if s.retained else 0.0
    draw.text((x0, y0 + 135), f"sampleable: {frac:.2%} of retained, {s.sampleable / s.capacity:.2%} of capacity",
              fill=INK, font=font)
    draw.text((x0, y0 + 155), f"episodes: {s.terminated:,} terminated, {s.truncated:,} truncated,"
              f" {s.open_episodes:,} open", fill=INK, font=font)
    return img


# -- commands --------------------------------------------------------------------------------------------
def _no_pillow(command: str, exc: ImportError) -> int:
    sys.stderr.write(f"mmreplay {command}: error: {exc}\n")
    return 1


def show_rows(text: str) -> int:
    """argparse ``type=`` of ``--rows``: 1 to ``MAX_ROWS``."""
    value = positive_int(text)
    if value > MAX_ROWS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_ROWS} (every row goes into one picture), got"
                                         f" {value}; draw more rows in several pictures (other --seed values)")
    return value


def cmd_show(args: argparse.Namespace) -> int:
    if args.ids and len(args.ids) > MAX_ROWS:
        raise ValueError(f"--ids: expected at most {MAX_ROWS} ids (every row goes into one picture), got"
                         f" {len(args.ids)}; draw the others in further pictures")
    require_store(args.path)
    output_file("--out", args.out)
    with ReplayStore.open(args.path, mode="r") as store:  # a wrong path is reported first
        try:
            _pil()
        except ImportError as exc:
            return _no_pillow("show", exc)
        if args.ids:
            batch = _gather_ids(store, args.path, args.ids)
        else:
            # chosen here, not by store.sample(): that goes through the store's rate limit, which a live run
            # shares (it would wait while the run may not sample, and count these rows against its budget)
            ids = store.sampleable_ids()
            if ids.size == 0:
                raise ValueError(f"{args.path} has no sampleable transition yet (mmreplay info {args.path} says"
                                 " what it holds); record more steps first")
            rng = np.random.default_rng(args.seed)
            batch = store.gather(np.sort(rng.choice(ids, min(args.rows, ids.size), replace=False)))
        img = show_image(store, batch)
    img.save(args.out)
    out(f"wrote {args.out} ({img.width}x{img.height}): ids {', '.join(str(int(i)) for i in batch.index)}")
    return 0


_API_ID = re.compile(r"index\[\d+\] = (-?\d+) (.*)", re.S)


def _gather_ids(store: ReplayStore, path: str, ids: list[int]) -> Batch:
    """The rows of ``--ids``, each refused in command-line terms unless a retained, sampleable transition."""
    lo, hi = store.id_range
    have = f"its retained ids are {lo}..{hi - 1}" if hi > lo else "it retains no transition yet"
    for i in ids:
        if not lo <= i < hi:
            raise ValueError(f"--ids {i}: no such transition in {path} ({have}); give ids in that range, or leave"
                             " --ids out to draw a sample")
    try:
        return store.gather(np.asarray(ids, np.int64))
    except NotSampleableError as exc:  # retained, but not sampleable: the API's words name the id
        m = _API_ID.fullmatch(str(exc))
        why = f"{m.group(1)} {m.group(2)}" if m else str(exc)
        raise ValueError(f"--ids {why}; give sampleable ids ({have}; mmreplay stats {path} counts the"
                         " sampleable ones), or leave --ids out to draw a sample") from None


def cmd_stats(args: argparse.Namespace) -> int:
    require_store(args.path)
    if args.out:
        output_file("--out", args.out)
    with ReplayStore.open(args.path, mode="r") as store:
        s = store_stats(store)
    for line in stats_text(s):
        out(line)
    if args.out:
        try:
            img = stats_image(s)
        except ImportError as exc:
            return _no_pillow("stats", exc)
        img.save(args.out)
        out(f"wrote {args.out} ({img.width}x{img.height})")
    return 0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    s = sub.add_parser("show", parents=[common], help="a PNG of random rows: stacked obs -> next_obs frames with"
                       " action, reward, discount, flags (padding highlighted)",
                       description="Draw transitions of a store as a PNG: per row the stacked obs frames, then"
                       " the next_obs frames, with the action, n-step reward, discount and flags written beside"
                       " them; stack padding at an episode's start is outlined. Draws --rows sampleable"
                       " transitions chosen at random (uniformly; the store's own sampling and its rate limit are"
                       " left alone), or the transitions given by --ids. Needs Pillow (the [image] extra).")
    s.add_argument("path", help="a store or snapshot directory")
    s.add_argument("--out", default="sample.png", help="PNG to write (default: sample.png)")
    s.add_argument("--ids", type=int, nargs="+", help=f"transition ids to draw, at most {MAX_ROWS} (default: --rows"
                   " chosen at random)")
    s.add_argument("--rows", type=show_rows, default=4, help="rows to draw when --ids is not given (default: 4,"
                   f" at most {MAX_ROWS})")
    s.add_argument("--seed", type=non_negative_int, default=0, help="seed of the rows' random choice (default: 0)")
    s.set_defaults(func=cmd_show)
    t = sub.add_parser("stats", parents=[common], help="episode returns and lengths, priorities, sampleable"
                       " fraction (text, and a PNG with --out)")
    t.add_argument("path", help="a store or snapshot directory")
    t.add_argument("--out", help="also draw the numbers into this PNG")
    t.set_defaults(func=cmd_stats)
