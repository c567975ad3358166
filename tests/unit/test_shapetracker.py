import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tgcore.shape.shapetracker import ShapeTracker
from tgcore.shape.symbolic import (
    AndNode,
    DivNode,
    LtNode,
    ModNode,
    MulNode,
    Node,
    NumNode,
    SumNode,
    Variable,
    sym_infer,
)
from tgcore.shape.view import View

# ---- helpers --------------------------------------------------------------------------------------


def np_eval(node, env):
    """Evaluate a Node over numpy index grids (also checks only the documented node kinds appear)."""
    if isinstance(node, int):
        return node
    if isinstance(node, NumNode):
        return node.b
    if isinstance(node, Variable):
        return env[node.expr]
    if isinstance(node, MulNode):
        return np_eval(node.a, env) * np_eval(node.b, env)
    if isinstance(node, DivNode):
        return np.floor_divide(np_eval(node.a, env), node.b)
    if isinstance(node, ModNode):
        return np.mod(np_eval(node.a, env), node.b)
    if isinstance(node, SumNode):
        return sum(np_eval(x, env) for x in node.nodes)
    if isinstance(node, LtNode):
        return (np_eval(node.a, env) < np_eval(node.b, env)).astype(np.int64)
    if isinstance(node, AndNode):
        ret = np.ones((), dtype=bool)
        for x in node.nodes:
            ret = ret & (np.asarray(np_eval(x, env)) != 0)
        return ret.astype(np.int64)
    raise AssertionError(f"unexpected node kind {type(node)}")


def st_indices(st: ShapeTracker):
    """(flat index array, validity array) of every position of st.shape."""
    shape = st.shape
    idx, valid = st.expr_idxs()
    grid = np.indices(shape, dtype=np.int64) if shape else []
    env = {f"idx{i}": grid[i] for i in range(len(shape))}
    iv = np.broadcast_to(np.asarray(np_eval(idx, env), dtype=np.int64), shape)
    vv = np.broadcast_to(np.asarray(np_eval(valid, env)) != 0, shape)
    return iv, vv


def st_values(st: ShapeTracker, buf: np.ndarray) -> np.ndarray:
    iv, vv = st_indices(st)
    assert (iv[vv] >= 0).all() and (iv[vv] < buf.size).all(), "a valid element reads outside the buffer"
    out = np.full(st.shape, -1, dtype=np.int64)
    out[vv] = buf[iv[vv]]
    return out


def apply_np(a: np.ndarray, op):
    kind, arg = op
    if kind == "reshape":
        return a.reshape(arg)
    if kind == "permute":
        return a.transpose(arg)
    if kind == "expand":
        return np.broadcast_to(a, arg)
    if kind == "pad":
        return np.pad(a, arg, constant_values=-1) if a.ndim else a
    if kind == "shrink":
        return a[tuple(slice(b, e) for b, e in arg)]
    if kind == "stride":
        return a[tuple(slice(None, None, m) for m in arg)]
    raise AssertionError(kind)


def apply_st(s: ShapeTracker, op) -> ShapeTracker:
    return getattr(s, op[0])(op[1])


def prime_factors(x):
    ret, p = [], 2
    while x > 1:
        while x % p == 0:
            ret.append(p)
            x //= p
        p += 1
    return ret


@st.composite
def op_for(draw, shape):
    size = math.prod(shape)
    kinds = ["reshape_split", "reshape_merge", "reshape_any", "reshape_ones", "permute", "shrink", "stride", "flip"]
    if size <= 200:
        kinds += ["pad", "expand"]
    kind = draw(st.sampled_from(kinds))
    nd = len(shape)
    if kind == "reshape_split":
        cands = [(i, p) for i, s in enumerate(shape) for p in range(2, s) if s % p == 0]
        if cands:
            i, p = draw(st.sampled_from(cands))
            return "reshape", shape[:i] + (p, shape[i] // p) + shape[i + 1 :]
        kind = "reshape_any"
    if kind == "reshape_merge" and nd >= 2:
        i = draw(st.integers(0, nd - 2))
        return "reshape", shape[:i] + (shape[i] * shape[i + 1],) + shape[i + 2 :]
    if kind == "reshape_ones":
        if 1 in shape and draw(st.booleans()):
            return "reshape", tuple(s for s in shape if s != 1)
        i = draw(st.integers(0, nd))
        return "reshape", shape[:i] + (1,) + shape[i:]
    if kind in ("reshape_any", "reshape_merge"):
        primes = draw(st.permutations(prime_factors(size)))
        cuts = sorted(draw(st.sets(st.integers(1, max(1, len(primes) - 1)), max_size=3))) if len(primes) > 1 else []
        groups, prev = [], 0
        for c in cuts + [len(primes)]:
            groups.append(math.prod(primes[prev:c]))
            prev = c
        for _ in range(draw(st.integers(0, 2))):
            groups.insert(draw(st.integers(0, len(groups))), 1)
        return "reshape", tuple(groups)
    if kind == "permute":
        return "permute", tuple(draw(st.permutations(range(nd))))
    if kind == "expand":
        return "expand", tuple(draw(st.integers(1, 3)) if s == 1 else s for s in shape)
    if kind == "pad":
        return "pad", tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in shape)
    if kind == "shrink":
        arg = []
        for s in shape:
            b = draw(st.integers(0, s - 1))
            arg.append((b, draw(st.integers(b + 1, s))))
        return "shrink", tuple(arg)
    if kind == "stride":
        return "stride", tuple(draw(st.sampled_from([-2, -1, 1, 1, 2, 3])) for _ in shape)
    return "stride", tuple(draw(st.sampled_from([-1, 1])) for _ in shape)


@st.composite
def chains(draw, max_ops=7):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    ops = []
    cur = shape
    for _ in range(draw(st.integers(1, max_ops))):
        op = draw(op_for(cur))
        ops.append(op)
        cur = apply_np(np.zeros(cur), op).shape
    return shape, ops


def run_chain(shape, ops):
    buf = np.arange(math.prod(shape), dtype=np.int64)
    ref = buf.reshape(shape)
    s = ShapeTracker.from_shape(shape)
    for op in ops:
        ref = apply_np(ref, op)
        s = apply_st(s, op)
        assert s.shape == ref.shape
    return buf, ref, s


# ---- property tests ---------------------------------------------------------------------------------


@settings(max_examples=250, deadline=None)
@given(chains())
def test_movement_chain_matches_numpy(case):
    shape, ops = case
    buf, ref, s = run_chain(shape, ops)
    np.testing.assert_array_equal(st_values(s, buf), ref)
    iv, vv = st_indices(s)
    # real_size: exact for one view, an upper bound (never beyond the buffer) otherwise
    need = int(iv[vv].max()) + 1 if vv.any() else 0
    if len(s.views) == 1:
        assert s.real_size() == need
    else:
        assert need <= s.real_size() <= buf.size
    # simplify keeps the meaning
    simp = s.simplify()
    assert len(simp.views) <= len(s.views)
    np.testing.assert_array_equal(st_values(simp, buf), ref)
    # the flat-index form agrees
    if ref.size:
        size = ref.size
        idx, valid = s.expr_node()
        flat = np.arange(size)
        env = {"idx": flat}
        fi = np.broadcast_to(np.asarray(np_eval(idx, env)), (size,))
        fv = np.broadcast_to(np.asarray(np_eval(valid, env)) != 0, (size,))
        out = np.full(size, -1)
        out[fv] = buf[fi[fv]]
        np.testing.assert_array_equal(out, ref.reshape(-1))
    # real_strides: a reported stride is the step between neighbouring valid elements
    for axis, rs in enumerate(s.real_strides()):
        if rs is None or ref.shape[axis] < 2:
            continue
        lo = [slice(None)] * ref.ndim
        hi = [slice(None)] * ref.ndim
        lo[axis], hi[axis] = slice(0, -1), slice(1, None)
        both = vv[tuple(lo)] & vv[tuple(hi)]
        assert ((iv[tuple(hi)] - iv[tuple(lo)])[both] == rs).all()
    # minify keeps the element order
    if len(s.views) == 1:
        m = ShapeTracker((s.views[0].minify(),))
        assert math.prod(m.shape) == ref.size and len(m.shape) <= max(1, len(s.shape))
        np.testing.assert_array_equal(st_values(m, buf).reshape(-1), ref.reshape(-1))


@settings(max_examples=120, deadline=None)
@given(chains(max_ops=8), st.data())
def test_compose_matches_chain(case, data):
    shape, ops = case
    k = data.draw(st.integers(0, len(ops)))
    buf, ref, full = run_chain(shape, ops)
    _, _, first = run_chain(shape, ops[:k])
    second = ShapeTracker.from_shape(first.shape)
    for op in ops[k:]:
        second = apply_st(second, op)
    composed = first + second
    assert composed.shape == ref.shape
    np.testing.assert_array_equal(st_values(composed, buf), ref)


@settings(max_examples=150, deadline=None)
@given(chains(max_ops=5), st.data())
def test_view_add_matches_two_views(case, data):
    shape, ops = case
    buf, ref, inner = run_chain(shape, ops)
    outer = ShapeTracker.from_shape(ref.shape)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(op_for(outer.shape))
        ref = apply_np(ref, op)
        outer = apply_st(outer, op)
    vm2, vm1 = inner.views[-1], outer.views[-1]
    if len(outer.views) != 1:
        return
    two = ShapeTracker(inner.views + (vm1,))
    np.testing.assert_array_equal(st_values(two, buf), ref)
    merged = vm2 + vm1
    if merged is not None:
        assert merged.shape == vm1.shape
        np.testing.assert_array_equal(st_values(ShapeTracker(inner.views[:-1] + (merged,)), buf), ref)


@st.composite
def bijective_chains(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    ops, cur = [], shape
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["permute", "flip", "reshape"]))
        if kind == "permute":
            op = ("permute", tuple(draw(st.permutations(range(len(cur))))))
        elif kind == "flip":
            op = ("stride", tuple(draw(st.sampled_from([-1, 1])) for _ in cur))
        else:
            op = draw(op_for(cur).filter(lambda o: o[0] == "reshape"))
        ops.append(op)
        cur = apply_np(np.zeros(cur), op).shape
    return shape, ops


@settings(max_examples=80, deadline=None)
@given(bijective_chains())
def test_invert(case):
    shape, ops = case
    buf, ref, s = run_chain(shape, ops)
    inv = s.invert(shape)
    if inv is None:
        assert len(s.views) > 1  # single-view permute/flip/reshape chains always invert
        return
    assert inv.shape == shape
    # reading the permuted data back through the inverse gives the original layout
    np.testing.assert_array_equal(st_values(inv, ref.reshape(-1).copy()), buf.reshape(shape))
    np.testing.assert_array_equal(st_values(s + inv, buf), buf.reshape(shape))


# ---- views that must stay a single view -----------------------------------------------------------


def test_reshape_contiguous_one_view():
    s = ShapeTracker.from_shape((2, 3, 4)).reshape((6, 4)).reshape((24,)).reshape((2, 12))
    assert len(s.views) == 1 and s.contiguous and s.views[0].strides == (12, 1)


def test_permute_then_reshape_ones():
    s = ShapeTracker.from_shape((2, 1, 3)).permute((2, 0, 1)).reshape((3, 2))
    assert len(s.views) == 1 and s.views[0].strides == (1, 3)
    s = s.reshape((3, 1, 2, 1))
    assert len(s.views) == 1 and s.views[0].strides == (1, 0, 3, 0)


def test_expand_then_reshape_ones():
    s = ShapeTracker.from_shape((1, 4)).expand((3, 4)).reshape((3, 1, 4, 1))
    assert len(s.views) == 1 and s.views[0].strides == (0, 0, 1, 0)
    s = ShapeTracker.from_shape((4, 1)).expand((4, 6)).reshape((4, 2, 3))
    assert len(s.views) == 1 and s.views[0].strides == (1, 0, 0)


def test_pad_then_shrink_back():
    s = ShapeTracker.from_shape((3, 4)).pad(((1, 1), (2, 0))).shrink(((1, 4), (2, 6)))
    assert len(s.views) == 1 and s.contiguous


def test_masked_reshape_one_view():
    # mask on an axis that is not split or merged
    s = ShapeTracker.from_shape((3, 4)).pad(((1, 1), (0, 0))).reshape((5, 2, 2))
    assert len(s.views) == 1 and s.views[0].mask == ((1, 4), (0, 2), (0, 2))
    # a padded range that is a box after the split
    s = ShapeTracker.from_shape((3,)).pad(((3, 3),)).reshape((3, 3))
    assert len(s.views) == 1
    # not a box: needs a second view
    s = ShapeTracker.from_shape((4,)).pad(((1, 1),)).reshape((2, 3))
    assert len(s.views) == 2


def test_non_mergeable_reshape_two_views_and_simplify():
    s = ShapeTracker.from_shape((2, 3)).permute((1, 0)).reshape((6,))
    assert len(s.views) == 2
    assert s.real_strides() == (None,)
    back = s.reshape((3, 2))
    assert len(back.views) == 2 and len(back.simplify().views) == 1


def test_view_add():
    inner = View.create((4, 4)).permute((1, 0))
    assert inner + View.create((4, 4)) == inner
    assert View.create((16,)) + inner == inner
    assert inner + View.create((16,)) is None
    # a stride-2 slice of a permuted view merges
    outer = View.create((2, 4), (8, 1))
    merged = inner + outer
    assert merged == View.create((2, 4), (2, 4), 0)


def test_canonical_views():
    v = View.create((1, 3, 1), (5, 1, 7))
    assert v.strides == (0, 1, 0) and v.contiguous
    v = View.create((3, 4), mask=((0, 3), (0, 4)))
    assert v.mask is None and v.contiguous
    v = View.create((3, 4), offset=2, mask=((1, 2), (0, 4)))
    assert v.strides == (0, 1) and v.offset == 6 and not v.contiguous
    v = View.create((3, 4), mask=((1, 1), (0, 4)))
    assert v.strides == (0, 0) and v.offset == 0 and v.mask == ((0, 0), (0, 0))
    assert View.create((2, 3)).size() == 6


def test_real_size_and_strides():
    assert ShapeTracker.from_shape((3, 4)).real_size() == 12
    assert ShapeTracker.from_shape((3, 4)).shrink(((0, 2), (1, 3))).real_size() == 7
    assert ShapeTracker.from_shape((3, 4)).pad(((1, 1), (1, 1))).real_size() == 12
    assert ShapeTracker.from_shape((4,)).expand((4,)).real_size() == 4
    assert ShapeTracker.from_shape((1,)).expand((5,)).real_size() == 1
    assert ShapeTracker.from_shape((3, 0)).real_size() == 0
    assert ShapeTracker.from_shape((2, 3)).shrink(((1, 1), (0, 3))).real_size() == 0
    s = ShapeTracker.from_shape((3, 4)).pad(((1, 0), (0, 0)))
    assert s.real_strides() == (None, 1) and s.real_strides(ignore_valid=True) == (4, 1)
    assert s.unit_stride_axes() == [1]
    assert s.axis_is_masked(0) and not s.axis_is_masked(1)
    assert ShapeTracker.from_shape((3, 4)).permute((1, 0)).real_strides() == (1, 4)


def test_expr_idxs_render():
    s = ShapeTracker.from_shape((4, 5))
    idx, valid = s.expr_idxs()
    assert idx.render() == "((idx0*5)+idx1)" and valid == 1
    g, r = Variable("gidx0", 0, 3), Variable("ridx1", 0, 4)
    idx, valid = s.expr_idxs([g, r])
    assert idx.render() == "((gidx0*5)+ridx1)"
    idx, valid = s.pad(((0, 0), (1, 0))).expr_idxs([g, Variable("ridx1", 0, 5)])
    assert idx.render() == "((gidx0*5)+ridx1+-1)" and valid.vars() == {Variable("ridx1", 0, 5)}
    with pytest.raises(ValueError):
        s.expr_idxs([g])


# ---- symbolic shapes ---------------------------------------------------------------------------------


def test_symbolic_reshape():
    n = Variable("n", 1, 10)
    s = ShapeTracker.from_shape((n * 4,)).reshape((n, 4))
    assert len(s.views) == 1 and s.shape == (n, 4) and s.contiguous
    assert s.views[0].strides == (4, 1)
    s2 = ShapeTracker.from_shape((n, 4)).reshape((n * 4,))
    assert s2.contiguous and s2.shape == (n * 4,)
    s3 = ShapeTracker.from_shape((4, n))
    idx, valid = s3.expr_idxs()
    assert idx.render() == "((idx0*n)+idx1)" and valid == 1
    assert s3.real_size() == 40 and s3.size == n * 4
    p = s3.permute((1, 0))
    assert p.views[0].strides == (1, n) and p.real_strides() == (1, n)
    # merge/split with a symbolic block
    q = ShapeTracker.from_shape((n, 4)).permute((1, 0)).reshape((4, n, 1))
    assert len(q.views) == 1 and q.views[0].strides == (1, 4, 0)
    for val in (1, 3, 10):
        sub = idx.substitute({n: NumNode(val)})
        assert sub.vars() <= {Variable("idx0", 0, 3), Variable("idx1", 0, 9)}
        assert sym_infer(idx, {n: val, Variable("idx0", 0, 3): 2, Variable("idx1", 0, 9): 1}) == 2 * val + 1


def test_symbolic_shrink_pad():
    n = Variable("n", 1, 10)
    s = ShapeTracker.from_shape((10, 4)).shrink(((0, n), (0, 4)))
    assert s.shape == (n, 4) and s.views[0].strides == (4, 1)
    idx, valid = s.expr_idxs()
    assert idx.render() == "((idx0*4)+idx1)"
    p = ShapeTracker.from_shape((n, 4)).pad(((0, 2), (0, 0)))
    idx, valid = p.expr_idxs()
    assert valid.vars() == {Variable("idx0", 0, 11), n}
    assert valid.substitute({n: 3, Variable("idx0", 0, 11): 2}) == 1
    assert valid.substitute({n: 3, Variable("idx0", 0, 11): 3}) == 0


def test_bound_vars_unbind():
    n = Variable("n", 1, 10)
    s = ShapeTracker.from_shape((n.bind(3), 4))
    assert s.vars() == {n}
    u, vals = s.unbind()
    assert vals == {n: 3}
    assert all(v.val is None for v in u.vars())
    assert s.var_vals == {n: 3}
    assert ShapeTracker.from_shape((2, 3)).unbind() == (ShapeTracker.from_shape((2, 3)), {})


# ---- errors -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fn",
    [
        lambda s: s.reshape((5, 5)),
        lambda s: s.reshape((-1, 12)),
        lambda s: s.permute((0, 0)),
        lambda s: s.permute((0,)),
        lambda s: s.expand((4, 8)),
        lambda s: s.expand((3,)),
        lambda s: s.pad(((0, 1),)),
        lambda s: s.pad(((-1, 0), (0, 0))),
        lambda s: s.shrink(((0, 4), (0, 4))),
        lambda s: s.shrink(((2, 1), (0, 4))),
        lambda s: s.shrink(((-1, 1), (0, 4))),
        lambda s: s.stride((0, 1)),
        lambda s: s.stride((1,)),
    ],
)
def test_movement_errors(fn):
    with pytest.raises(ValueError):
        fn(ShapeTracker.from_shape((3, 4)))


def test_create_errors():
    with pytest.raises(ValueError):
        View.create((2, -1))
    with pytest.raises(ValueError):
        View.create((2, 3), (1,))
    with pytest.raises(ValueError):
        View.create((2, 3), mask=((0, 3), (0, 3)))
    with pytest.raises(ValueError):
        ShapeTracker(())


def test_node_kinds_only():
    s = ShapeTracker.from_shape((3, 4)).permute((1, 0)).reshape((12,)).pad(((1, 2),)).reshape((3, 5)).stride((-1, 2))
    idx, valid = s.expr_idxs()

    def walk(x):
        assert isinstance(x, (NumNode, Variable, MulNode, DivNode, ModNode, SumNode, AndNode, LtNode)), type(x)
        for c in [getattr(x, f, None) for f in ("a", "b")] + list(getattr(x, "nodes", ())):
            if isinstance(c, Node):
                walk(c)

    walk(idx)
    walk(valid)


def test_view_and_shapetracker_caches_keep_arguments_exact() -> None:
    # memoized for plain ints only: anything else is checked (or kept symbolic) as if there were no cache
    assert View.create((2, 3)) is View.create([2, 3]) and ShapeTracker.from_shape((2, 3)) is ShapeTracker.from_shape(
        [2, 3]
    )
    for bad in ((2.0, 3), (2, np.int64(3))):
        with pytest.raises(ValueError, match="invalid shape"):
            ShapeTracker.from_shape(bad)
        with pytest.raises(ValueError, match="invalid shape"):
            View.create(bad)
    i = Variable("i", 1, 10)
    st = ShapeTracker.from_shape((i.bind(4), 3))
    assert st.shape[0].val == 4 and ShapeTracker.from_shape((i, 3)).shape[0].val is None
    assert hash(View.create((4, 5), (5, 1))) == hash(View._create((4, 5), (5, 1), 0, None))


def test_reshapes_are_remembered_per_tracker_for_plain_shapes() -> None:
    st = ShapeTracker.from_shape((4, 6)).permute((1, 0))
    first = st.reshape((2, 3, 4))
    assert st.reshape([2, 3, 4]) is first and first == ShapeTracker(st.views).reshape((2, 3, 4))
    assert st.reshape((24,)) == ShapeTracker(st.views).reshape((24,)) and len(st.reshape((24,)).views) == 2
    for _ in range(2):  # a bad reshape raises every time, not only the first
        with pytest.raises(ValueError):
            st.reshape((5, 5))
    i = Variable("i", 1, 10)
    sym = ShapeTracker.from_shape((i.bind(4), 6))
    assert sym.reshape((i.bind(4), 2, 3)).shape[0].val == 4  # symbolic shapes are not remembered: bindings stay
    assert sym.reshape((i, 2, 3)).shape[0].val is None


def test_every_movement_op_is_remembered_per_tracker_for_plain_arguments() -> None:
    st = ShapeTracker.from_shape((4, 6)).permute((1, 0))
    fresh = ShapeTracker(st.views)  # the same views, no remembered moves
    moves = [
        ("pad", ((1, 2), (0, 3))),
        ("shrink", ((1, 5), (0, 2))),
        ("permute", (1, 0)),
        ("expand", (6, 4)),
        ("stride", (2, -1)),
        ("flip", (0,)),
        ("reshape", (3, 8)),
    ]
    for op, arg in moves:
        first = getattr(st, op)(arg)
        assert getattr(st, op)(list(arg)) is first, op
        assert first == getattr(fresh, op)(arg), op
    # a conv's sliding windows too (then the moves of their tracker, remembered in turn), masked or not
    for base in (st, st.pad(((1, 1), (1, 1)))):
        windows = base.window(1, 3, 2, 1)
        assert base.window(1, 3, 2, 1) is windows and windows == ShapeTracker(base.views).window(1, 3, 2, 1)
        other = base.window(1, 3, 1, 1)
        assert other != windows and other.shape == (base.shape[0], base.shape[1] - 2, 3)
    # a chain of moves, as a program makes at every step, gives the trackers of the last time
    assert st.pad(((1, 1), (1, 1))).reshape((8, 6)).shrink(((1, 7), (0, 6))) is st.pad(((1, 1), (1, 1))).reshape(
        (8, 6)
    ).shrink(((1, 7), (0, 6)))
    assert st.pad(((1, 1), (0, 0))) != st.pad(((2, 0), (0, 0)))  # other arguments, other trackers
    assert st.pad([[1, 2], [0, 3]]) is st.pad(((1, 2), (0, 3)))  # bounds given as lists are the same key
    for _ in range(2):  # a bad move raises every time
        with pytest.raises(ValueError):
            st.shrink(((0, 7), (0, 4)))
    # symbolic bounds are not remembered: a bound Variable equals the unbound one, and each keeps its binding
    i = Variable("i", 1, 10)
    sym = ShapeTracker.from_shape((6,))
    bound, unbound = sym.pad(((i.bind(2), 0),)), sym.pad(((i, 0),))
    assert [v.val for v in bound.shape[0].vars()] == [2] and [v.val for v in unbound.shape[0].vars()] == [None]


# ---- sliding windows ------------------------------------------------------------------------------


def _contains_div(node) -> bool:
    """Whether a // or % is anywhere in the expression."""
    if isinstance(node, (DivNode, ModNode)):
        return True
    inner = [node.a] if isinstance(node, MulNode) else list(getattr(node, "nodes", ()))
    return any(_contains_div(n) for n in inner)


@settings(max_examples=120, deadline=None)
@given(
    st.integers(1, 3), st.integers(4, 12), st.integers(1, 4), st.integers(1, 3), st.integers(1, 2), st.integers(0, 2),
    st.booleans(),
)
def test_window_matches_numpy(c, n, k, stride, dilation, pad, permuted):
    """ShapeTracker.window: element (.., i, .., j) is element stride * i + dilation * j of the axis, for a plain, a
    permuted and a padded (masked) tracker; where the axis is read unmasked it stays one view, affine in i and j."""
    if dilation * (k - 1) + 1 > n + 2 * pad:
        return
    buf = np.arange(c * n, dtype=np.int64)
    base = ShapeTracker.from_shape((c, n)) if not permuted else ShapeTracker.from_shape((n, c)).permute((1, 0))
    ref = buf.reshape(c, n) if not permuted else buf.reshape(n, c).T
    s = base.pad(((0, 0), (pad, pad))) if pad else base
    ref = np.pad(ref, ((0, 0), (pad, pad)), constant_values=-1)
    w = s.window(1, k, stride, dilation)
    o = (n + 2 * pad - dilation * (k - 1) - 1) // stride + 1
    want = np.stack([ref[:, j * dilation : j * dilation + (o - 1) * stride + 1 : stride] for j in range(k)], -1)
    assert w.shape == (c, o, k)
    np.testing.assert_array_equal(st_values(w, buf), want)
    if not pad:
        assert len(w.views) == len(s.views)
        assert not _contains_div(w.expr_idxs()[0])


def test_a_strided_max_pool_indexes_without_division():
    """A 3x3 stride-2 max pool of a padded map (ResNet's, after its stem): the kernel's indices are sums of loop
    indices times strides (the window is one view; the pad's view below it unravels without a carry), no / or %."""
    from tgcore import Tensor, dtypes
    from tgcore.codegen.program import to_program
    from tgcore.device import Device
    from tgcore.engine.realize import get_kernel

    x = Tensor.empty(2, 8, 16, 16, device="PYTHON")
    padded = x.pad2d((1, 1, 1, 1), value=float("-inf")).contiguous()
    for t in (padded.max_pool2d(3, 2), (x.relu() + 1).max_pool2d(3, 2)):
        uops = to_program(get_kernel(Device["PYTHON"].renderer, t.schedule()[-1].ast, "PYTHON")).uops
        divisions = [u for u in uops if u.op.name == "ALU" and getattr(u.arg, "name", "") in ("DIV", "MOD")]
        assert not [u for u in divisions if u.dtype is not None and dtypes.is_int(u.dtype)]
