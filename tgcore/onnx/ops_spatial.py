"""ONNX operators that sample, fold or factor: GridSample, DeformConv, RoiAlign, MaxRoiPool, Col2Im and Det.

Sampling at data-dependent positions is done on the device: each position's integer taps and their weights are
computed as tensors, the taps are clamped into range (their weights zeroed where the padding says so) and read with
one gather, and the weighted taps summed. Only shapes and attributes are read on the host."""

from __future__ import annotations

import itertools
import math
from typing import Optional

import numpy as np

from tgcore.dtype import dtypes
from tgcore.onnx.registry import Node, op, wide_float
from tgcore.tensor import Tensor, _with_check

# one axis' taps for a coordinate: (integer-valued positions as floats, their weights)
Taps = list[tuple[Tensor, Tensor]]


def _cubic(t: Tensor, a: float = -0.75) -> Tensor:
    """The cubic convolution kernel (Keys, a = -0.75 as torch and ONNX use) at distance t."""
    t = t.abs()
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return (t <= 1).where(near, (t < 2).where(far, 0.0))


def _axis_taps(coord: Tensor, mode: str) -> Taps:
    """The taps one axis reads for a coordinate, by interpolation mode (nearest rounds half to even)."""
    if mode == "nearest":
        return [(coord.round(), coord.ones_like())]
    base = coord.floor()
    t = coord - base
    if mode == "linear":
        return [(base, 1 - t), (base + 1, t)]
    return [(base - 1, _cubic(t + 1)), (base, _cubic(t)), (base + 1, _cubic(1 - t)), (base + 2, _cubic(2 - t))]


def _reflect(pos: Tensor, low: float, high: float) -> Tensor:
    """pos reflected by the borders low and high until it lies between them."""
    span = high - low
    if span <= 0:
        return pos.zeros_like()
    dist = (pos - low).abs()
    flips = (dist / span).floor()
    extra = dist - flips * span
    even = (flips - 2 * (flips / 2).floor()) == 0
    return even.where(low + extra, high - extra)


def _padded(pos: Tensor, weight: Tensor, size: int, padding: str, align: bool) -> tuple[Tensor, Tensor]:
    """A tap moved into [0, size) by the padding mode: zeros drops a tap outside (weight 0), border clamps it,
    reflection mirrors it at the borders (pixel centers with align_corners, pixel edges without)."""
    if padding == "zeros":
        weight = ((pos >= 0) & (pos <= size - 1)).where(weight, 0.0)
    elif padding == "reflection":
        pos = _reflect(pos, 0.0, size - 1.0) if align else _reflect(pos, -0.5, size - 0.5)
    return pos.clip(0, size - 1), weight


def _sample(x: Tensor, coords: list[Tensor], mode: str, padding: str, align: bool) -> Tensor:
    """x (B, C, *spatial) read at pixel coordinates, one (B, P) tensor per spatial axis: (B, C, P).

    Every tap of every axis is combined into one flat index and one weight per point; all are read by one gather."""
    b, c, spatial = x.shape[0], x.shape[1], x.shape[2:]
    strides = [math.prod(spatial[i + 1 :]) for i in range(len(spatial))]
    index_dtype = dtypes.int32 if math.prod(spatial) < 2**31 else dtypes.int64
    per_axis = []
    for coord, size in zip(coords, spatial):
        per_axis.append([_padded(p, w, size, padding, align) for p, w in _axis_taps(coord, mode)])
    indices, weights = [], []
    for combo in itertools.product(*per_axis):
        index, weight = None, None
        for (pos, w), stride in zip(combo, strides):
            part = pos.cast(index_dtype) * stride
            index = part if index is None else index + part
            weight = w if weight is None else weight * w
        indices.append(index)
        weights.append(weight)
    taps, points = len(indices), coords[0].shape[1]
    index = Tensor.stack(*indices, dim=1).reshape(b, 1, taps * points).expand(b, c, taps * points)
    weight = Tensor.stack(*weights, dim=1).reshape(b, 1, taps, points)
    values = x.reshape(b, c, -1).gather(2, index).reshape(b, c, taps, points)
    return (values.cast(weight.dtype) * weight).sum(2)


# ***** GridSample *****

_GRID_MODES = {16: {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"},
               20: {"linear": "linear", "nearest": "nearest", "cubic": "cubic"}}  # fmt: skip


@op("GridSample", 16, 20)
def _grid_sample(n: Node) -> Tensor:
    x, grid = n[0], n[1]
    names = _GRID_MODES[16 if n.opset < 20 else 20]
    mode_name = n.get("mode", "bilinear" if n.opset < 20 else "linear")
    if mode_name not in names:
        raise n.unsupported(f"mode {mode_name!r}: expected one of {', '.join(names)} at this opset")
    mode, padding, align = names[mode_name], n.get("padding_mode", "zeros"), bool(n.get("align_corners", 0))
    if padding not in ("zeros", "border", "reflection"):
        raise n.unsupported(f"padding_mode {padding!r}: expected zeros, border or reflection")
    r = x.ndim - 2
    if n.opset < 20 and x.ndim != 4:
        raise n.unsupported(f"X of rank {x.ndim}: opset {n.opset} samples only 4-D (N, C, H, W) inputs")
    if r < 1 or grid.ndim != r + 2 or grid.shape[0] != x.shape[0] or grid.shape[-1] != r:
        raise n.unsupported(
            f"X of shape {x.shape} and grid of shape {grid.shape}: expected grid (N, *out, {max(r, 1)}) for X "
            "(N, C, *spatial) with as many spatial axes as the grid's last axis"
        )
    ct = wide_float(x.dtype, grid.dtype)
    out = grid.shape[1:-1]
    g = grid.cast(ct).reshape(grid.shape[0], -1, r)
    coords = []
    for axis, size in enumerate(x.shape[2:]):
        v = g[:, :, r - 1 - axis]  # (the grid's last component is the first spatial axis' position: x, y, z)
        coords.append((v + 1) / 2 * (size - 1) if align else ((v + 1) * size - 1) / 2)
    y = _sample(x, coords, mode, padding, align).reshape(*x.shape[:2], *out)
    if not dtypes.is_float(x.dtype) and mode != "nearest":  # integers: the nearest value of the interpolation
        y = y.round()
    return y.cast(x.dtype)


# ***** DeformConv *****


@op("DeformConv", 19)
def _deform_conv(n: Node) -> Tensor:
    x, w, offset, bias, mask = n[0], n[1], n[2], n[3], n[4]
    nd = x.ndim - 2
    kernel = list(n.get("kernel_shape", w.shape[2:]))
    strides, dils = list(n.get("strides", [1] * nd)), list(n.get("dilations", [1] * nd))
    pads = list(n.get("pads", [0] * (2 * nd)))
    group, offset_group = n.get("group", 1), n.get("offset_group", 1)
    batch, channels = x.shape[:2]
    if nd < 1 or w.ndim != x.ndim or list(w.shape[2:]) != kernel or len(strides) != nd or len(pads) != 2 * nd:
        raise n.unsupported(
            f"X {x.shape}, W {w.shape}, kernel_shape {kernel}, strides {strides}, pads {pads}: expected W "
            "(oC, C/group, *kernel) of X's rank, and a stride, dilation and two pads per spatial axis"
        )
    if channels % group or w.shape[0] % group or w.shape[1] * group != channels or channels % offset_group:
        raise n.unsupported(
            f"X with {channels} channels, W {w.shape}, group {group}, offset_group {offset_group}: expected C and oC "
            "divisible by group, W's second axis C/group, and C divisible by offset_group"
        )
    out = [
        (s + pads[i] + pads[i + nd] - d * (k - 1) - 1) // st + 1
        for i, (s, k, st, d) in enumerate(zip(x.shape[2:], kernel, strides, dils))
    ]
    k_count, points = math.prod(kernel), math.prod(out)
    if tuple(offset.shape) != (batch, offset_group * k_count * nd, *out):
        raise n.unsupported(
            f"offset of shape {offset.shape}: expected {(batch, offset_group * k_count * nd, *out)} "
            "(N, offset_group * kernel size * spatial axes, *output)"
        )
    if mask is not None and tuple(mask.shape) != (batch, offset_group * k_count, *out):
        raise n.unsupported(f"mask of shape {mask.shape}: expected {(batch, offset_group * k_count, *out)}")
    ct = wide_float(x.dtype, w.dtype, offset.dtype)
    # where each kernel tap reads before its offset: (axis, kernel taps, output points), known ahead
    taps = np.stack(np.meshgrid(*[np.arange(k) for k in kernel], indexing="ij"), 0).reshape(nd, k_count, 1)
    outs = np.stack(np.meshgrid(*[np.arange(o) for o in out], indexing="ij"), 0).reshape(nd, 1, points)
    step, dil, begin = (np.array(v).reshape(nd, 1, 1) for v in (strides, dils, pads[:nd]))
    base = Tensor((outs * step - begin + taps * dil).astype(ct.np), device=n.device)
    off = offset.cast(ct).reshape(batch * offset_group, k_count, nd, points)
    coords = [(off[:, :, axis, :] + base[axis]).reshape(batch * offset_group, k_count * points) for axis in range(nd)]
    xg = x.reshape(batch * offset_group, channels // offset_group, *x.shape[2:])
    cols = _sample(xg, coords, "linear", "zeros", False).reshape(batch, offset_group, -1, k_count, points)
    if mask is not None:
        cols = cols * mask.cast(ct).reshape(batch, offset_group, 1, k_count, points)
    cols = cols.reshape(batch, group, channels // group * k_count, points)
    weight = w.cast(ct).reshape(1, group, w.shape[0] // group, channels // group * k_count)
    y = weight.matmul(cols).reshape(batch, w.shape[0], *out)
    if bias is not None:
        y = y + bias.cast(ct).reshape(1, -1, *([1] * nd))
    return y.cast(x.dtype)


# ***** RoiAlign *****


def _roi_axis(start: Tensor, bin_size: Tensor, grid: Tensor, bins: int, samples: int, size: int) -> tuple[Taps, Tensor]:
    """One axis of RoiAlign's sampling (R rois, `bins` bins of `samples` points): the two taps of each point as
    (pixel, weight), each weight zero where the point lies beyond a pixel outside the map; and which points count
    (those within the roi's own sample count). Shapes (R, bins, samples)."""
    r = start.shape[0]
    dt = start.dtype
    bin_idx = Tensor.arange(bins, device=start.device).cast(dt).reshape(1, bins, 1)
    sample_idx = Tensor.arange(samples, device=start.device).cast(dt).reshape(1, 1, samples)
    s, b, g = start.reshape(r, 1, 1), bin_size.reshape(r, 1, 1), grid.reshape(r, 1, 1)
    pos = s + bin_idx * b + (sample_idx + 0.5) * b / g
    inside = (pos >= -1) & (pos <= size)
    pos = pos.maximum(0)
    low = pos.floor()
    edge = low >= size - 1  # (a point past the last pixel's center reads that pixel only)
    low = edge.where(size - 1, low)
    high = edge.where(size - 1, low + 1)
    frac = edge.where(0.0, pos - low)
    zero = inside.logical_not()
    taps = [(low, zero.where(0.0, 1 - frac)), (high, zero.where(0.0, frac))]
    return taps, sample_idx < g


@op("RoiAlign", 10, 16)
def _roi_align(n: Node) -> Tensor:
    x, rois, batch_index = n[0], n[1], n[2]
    mode = n.get("mode", "avg")
    coord = "output_half_pixel" if n.opset < 16 else n.get("coordinate_transformation_mode", "half_pixel")
    if mode not in ("avg", "max"):
        raise n.unsupported(f"mode {mode!r}: expected avg or max")
    if coord not in ("half_pixel", "output_half_pixel"):
        raise n.unsupported(f"coordinate_transformation_mode {coord!r}: expected half_pixel or output_half_pixel")
    if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 4 or tuple(batch_index.shape) != (rois.shape[0],):
        raise n.unsupported(
            f"X {x.shape}, rois {rois.shape}, batch_indices {batch_index.shape}: expected X (N, C, H, W), "
            "rois (num_rois, 4) and batch_indices (num_rois,)"
        )
    out_h, out_w = n.get("output_height", 1), n.get("output_width", 1)
    ratio, scale = n.get("sampling_ratio", 0), n.get("spatial_scale", 1.0)
    _, channels, height, width = x.shape
    count = rois.shape[0]
    ct = wide_float(x.dtype, rois.dtype)
    shift = 0.5 if coord == "half_pixel" else 0.0
    box = rois.cast(ct) * scale - shift
    x1, y1, x2, y2 = (box[:, i] for i in range(4))
    roi_w, roi_h = x2 - x1, y2 - y1
    if coord == "output_half_pixel":  # (the old behavior: a roi at least one pixel wide and high)
        roi_w, roi_h = roi_w.maximum(1.0), roi_h.maximum(1.0)
    bin_h, bin_w = roi_h / out_h, roi_w / out_w
    if ratio > 0:
        grid_h = grid_w = Tensor.full((count,), float(ratio), dtype=ct, device=n.device)
        samples_h = samples_w = ratio
    else:  # adaptive: each roi's own count; the largest, read back, sets how many points are laid out
        grid_h, grid_w = (roi_h / out_h).ceil(), (roi_w / out_w).ceil()
        # (read through Node.host_of, which counts the read: such a graph is walked again each call, not replayed)
        samples_h = max(1, int(n.host_of(grid_h.max()).item())) if count else 1
        samples_w = max(1, int(n.host_of(grid_w.max()).item())) if count else 1
    taps_y, used_y = _roi_axis(y1, bin_h, grid_h, out_h, samples_h, height)
    taps_x, used_x = _roi_axis(x1, bin_w, grid_w, out_w, samples_w, width)
    # every point's four taps: (R, out_h, samples_h, out_w, samples_w, 4), flat indices into all images' pixels
    index_dtype = dtypes.int32 if x.numel() < 2**31 else dtypes.int64
    image = (batch_index.cast(index_dtype) * (height * width)).reshape(count, 1, 1, 1, 1)
    indices, weights = [], []
    for (py, wy), (px, wx) in itertools.product(taps_y, taps_x):
        row = py.cast(index_dtype).reshape(count, out_h, samples_h, 1, 1)
        col = px.cast(index_dtype).reshape(count, 1, 1, out_w, samples_w)
        indices.append(image + row * width + col)
        weights.append(wy.reshape(count, out_h, samples_h, 1, 1) * wx.reshape(count, 1, 1, out_w, samples_w))
    index = Tensor.stack(*indices, dim=-1).reshape(1, -1)
    weight = Tensor.stack(*weights, dim=-1).reshape(1, count, out_h, samples_h, out_w, samples_w, 4)
    pixels = x.permute(1, 0, 2, 3).reshape(channels, -1)
    values = pixels.gather(1, index.expand(channels, index.shape[1])).reshape(channels, *weight.shape[1:])
    values = values.cast(ct) * weight
    used = used_y.reshape(1, count, 1, samples_h, 1, 1) & used_x.reshape(1, count, 1, 1, 1, samples_w)
    if mode == "avg":
        total = used.where(values.sum(-1), 0.0).sum((3, 5))
        y = total / (grid_h * grid_w).maximum(1.0).reshape(1, count, 1, 1)
    else:  # max: the largest weighted tap of any counted point (0 for a roi with none)
        best = used.where(values.max(-1), -math.inf).max((3, 5))
        y = (best == -math.inf).where(0.0, best)
    y = y.permute(1, 0, 2, 3).cast(x.dtype)
    bad = (batch_index < 0) | (batch_index >= x.shape[0])
    return _with_check(y, bad, f"RoiAlign: a batch_indices value is outside [0, {x.shape[0]}), the batch of X")


# ***** MaxRoiPool *****


@op("MaxRoiPool", 1, 22)
def _max_roi_pool(n: Node) -> Tensor:
    """Fast R-CNN's ROI pooling: each roi (batch index, x1, y1, x2, y2), scaled and rounded to pixels, is split into
    pooled_shape bins of whole pixels (floor of each bin's start, ceil of its end), and each bin gives the largest
    value inside it, 0 for a bin with no pixel. The bins are masks over the map, computed on the device."""
    x, rois = n[0], n[1]
    pooled = list(n.get("pooled_shape", ()))
    scale = float(n.get("spatial_scale", 1.0))
    if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 5 or len(pooled) != 2 or min(pooled) < 1:
        raise n.unsupported(
            f"X {x.shape}, rois {rois.shape}, pooled_shape {pooled}: expected X (N, C, H, W), rois (num_rois, 5) and "
            "a pooled_shape of two sizes of at least 1"
        )
    if not dtypes.is_float(x.dtype):
        raise n.unsupported(f"X of {x.dtype}: expected a float type")
    (ph, pw), (_, channels, height, width), count = pooled, x.shape, rois.shape[0]
    ct = wide_float(x.dtype, rois.dtype)
    box = rois.cast(ct)
    corners = box[:, 1:] * scale
    corners = corners.sign() * (corners.abs() + 0.5).floor()  # rounded half away from zero (C's round)
    x1, y1, x2, y2 = (corners[:, i].reshape(count, 1) for i in range(4))

    def bins(start: Tensor, end: Tensor, parts: int, size: int) -> tuple[Tensor, Tensor]:
        """Each roi's bins along one axis: their first pixel and one past their last, clipped to [0, size)."""
        step = (end - start + 1).maximum(1.0) / parts
        idx = Tensor.arange(parts, device=n.device).cast(ct).reshape(1, parts)
        lo = ((idx * step).floor() + start).maximum(0).minimum(size)
        hi = (((idx + 1) * step).ceil() + start).maximum(0).minimum(size)
        return lo, hi

    (hs, he), (ws, we) = bins(y1, y2, ph, height), bins(x1, x2, pw, width)
    rows = Tensor.arange(height, device=n.device).cast(ct).reshape(1, 1, height)
    cols = Tensor.arange(width, device=n.device).cast(ct).reshape(1, 1, width)
    in_h = (rows >= hs.unsqueeze(-1)) & (rows < he.unsqueeze(-1))  # (R, PH, H)
    in_w = (cols >= ws.unsqueeze(-1)) & (cols < we.unsqueeze(-1))  # (R, PW, W)
    inside = in_h.reshape(count, 1, ph, 1, height, 1) & in_w.reshape(count, 1, 1, pw, 1, width)
    batch = box[:, 0].cast(dtypes.int64)
    maps = x[batch].reshape(count, channels, 1, 1, height, width)  # (the index is checked against X's batch)
    best = inside.where(maps, -math.inf).max((-2, -1))
    empty = ((he <= hs).reshape(count, 1, ph, 1) | (we <= ws).reshape(count, 1, 1, pw)).expand(best.shape)
    return empty.where(0.0, best).cast(x.dtype)


# ***** Col2Im *****


@op("Col2Im", 18)
def _col2im(n: Node) -> Tensor:
    x, image, block = n[0], n.ints(1), n.ints(2)
    nd = len(image)
    strides, dils = list(n.get("strides", [1] * nd)), list(n.get("dilations", [1] * nd))
    pads = list(n.get("pads", [0] * (2 * nd)))
    if len(block) != nd or len(strides) != nd or len(dils) != nd or len(pads) != 2 * nd or x.ndim != 3:
        raise n.unsupported(
            f"input {x.shape}, image_shape {image}, block_shape {block}, strides {strides}, dilations {dils}, pads "
            f"{pads}: expected a 3-D input (N, C * block size, L) and one block size, stride, dilation and two pads "
            "per image axis"
        )
    k_count = math.prod(block)
    grid = [(s + pads[i] + pads[i + nd] - d * (k - 1) - 1) // st + 1 for i, (s, k, st, d) in
            enumerate(zip(image, block, strides, dils))]  # fmt: skip
    if x.shape[1] % k_count or min(grid, default=1) < 1 or x.shape[2] != math.prod(grid):
        raise n.unsupported(
            f"input {x.shape}: expected (N, C * {k_count}, {math.prod(grid)}) for image_shape {image}, block_shape "
            f"{block}, strides {strides}, dilations {dils} and pads {pads} ({' x '.join(map(str, grid))} blocks)"
        )
    batch, channels = x.shape[0], x.shape[1] // k_count
    cols = x.reshape(batch, channels, k_count, *grid)
    for i, s in enumerate(strides):  # blocks spread `stride` apart: s - 1 zeros between neighbours
        if s > 1:
            axis, count = 3 + i, grid[i]
            gaps = tuple((0, s - 1) if a == axis + 1 else None for a in range(cols.ndim + 1))
            cols = cols.unsqueeze(axis + 1).pad(gaps).flatten(axis, axis + 1)
            cols = cols.shrink(tuple((0, (count - 1) * s + 1) if a == axis else None for a in range(cols.ndim)))
    padded = [s + pads[i] + pads[i + nd] for i, s in enumerate(image)]
    spread = cols.shape[3:]
    total: Optional[Tensor] = None
    for k, where in enumerate(itertools.product(*[range(b) for b in block])):  # each block position, shifted in place
        shift = [p * d for p, d in zip(where, dils)]
        part = cols[:, :, k].pad(((0, 0), (0, 0), *[(a, full - a - s) for a, full, s in zip(shift, padded, spread)]))
        total = part if total is None else total + part
    assert total is not None  # (a block has at least one position)
    return total.shrink(((0, batch), (0, channels), *[(pads[i], pads[i] + s) for i, s in enumerate(image)]))


# ***** Det *****


@op("Det", 11)
def _det(n: Node) -> Tensor:
    """LU factorization with partial pivoting, one column a step: the determinant is the pivots' product, negated
    by each row swap; a matrix with no nonzero pivot left in a column is singular (0)."""
    x = n[0]
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise n.unsupported(f"input of shape {x.shape}: expected square matrices (*, M, M)")
    if not dtypes.is_float(x.dtype):
        raise n.unsupported(f"input of dtype {x.dtype.name}: expected a float type")
    size, batch_shape = x.shape[-1], x.shape[:-2]
    ct = wide_float(x.dtype)
    batch = math.prod(batch_shape)
    det = Tensor.ones(batch, dtype=ct, device=n.device)
    a = x.cast(ct).reshape(batch, size, size)
    for m in range(size, 0, -1):  # a: the (m, m) matrix still to factor
        pivot_row = a[:, :, 0].abs().argmax(-1).reshape(batch, 1)
        hit = Tensor.arange(m, device=n.device).reshape(1, m) == pivot_row  # (batch, m): the pivot's row
        row = hit.reshape(batch, m, 1).where(a, 0.0).sum(1)  # (batch, m)
        pivot = row[:, 0]
        det = det * (pivot_row.reshape(batch) == 0).where(pivot, -pivot)
        if m == 1:
            break
        swapped = hit.reshape(batch, m, 1).where(a[:, 0:1, :], a)[:, 1:, :]  # the pivot's row out, row 0 in its place
        safe = (pivot == 0).where(1.0, pivot).reshape(batch, 1, 1)
        a = (swapped[:, :, 1:] - swapped[:, :, 0:1] / safe * row[:, 1:].reshape(batch, 1, m - 1)).contiguous()
    return det.reshape(batch_shape).cast(x.dtype)
