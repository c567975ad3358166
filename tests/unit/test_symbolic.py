import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tgcore.shape.symbolic import (
    NODE_KINDS,
    AndNode,
    DivNode,
    LtNode,
    ModNode,
    MulNode,
    Node,
    NumNode,
    SumNode,
    Variable,
    create_lt_node,
    sym_infer,
    sym_render,
)

a = Variable("a", 0, 7)
b = Variable("b", 0, 3)
x = Variable("x", -5, 5)
n = Variable("n", 1, 10)


# ---- exact simplification results -----------------------------------------------------------------

@pytest.mark.parametrize("expr, expected", [
    (lambda: a * 2 + a * 3, "(a*5)"),
    (lambda: a + b + a, "((a*2)+b)"),
    (lambda: (a + 3) + (b + 4), "(a+b+7)"),
    (lambda: a + 3 - 3, "a"),
    (lambda: a - a, "0"),
    (lambda: (a + b) * 3, "((a*3)+(b*3))"),
    (lambda: a * 2 * 3, "(a*6)"),
    (lambda: -a, "(a*-1)"),
    (lambda: 4 * n, "(n*4)"),
    (lambda: (a * 4) // 4, "a"),
    (lambda: (a * 8) // 4, "(a*2)"),
    (lambda: (a * 2) // 4, "(a//2)"),
    (lambda: (a * 4 + b) // 4, "a"),
    (lambda: (a * 4 + b + 8) // 4, "(a+2)"),
    (lambda: (a * 4 + b) % 4, "b"),
    (lambda: (a * 6 + 3) % 3, "0"),
    (lambda: (a * 6 + 3) // 9, "(((a*2)+1)//3)"),
    (lambda: (a * 2) % 4, "((a%2)*2)"),
    (lambda: b % 4, "b"),
    (lambda: b // 4, "0"),
    (lambda: (a // 2) // 3, "(a//6)"),
    (lambda: (a % 4) % 2, "(a%2)"),
    (lambda: (a // 4) * 4 + a % 4, "a"),
    (lambda: ((a + b * 8) // 4) * 4 + (a + b * 8) % 4, "((b*8)+a)"),
    (lambda: (a + 8) % 8, "a"),
    (lambda: a // 1, "a"),
    (lambda: a % 1, "0"),
    (lambda: a < 8, "1"),
    (lambda: a < 0, "0"),
    (lambda: a >= 0, "1"),
    (lambda: a > 7, "0"),
    (lambda: a <= 3, "(a<4)"),
    (lambda: a < 3, "(a<3)"),
    (lambda: a * 4 + 8 < 16, "(a<2)"),
    (lambda: a * 4 + b < 8, "(a<2)"),
    (lambda: a * 4 + b * 4 < 7, "((a+b)<2)"),
    (lambda: a * 3 < 7, "(a<3)"),
    (lambda: a < n, "(a<n)"),
    (lambda: b < n + 3, "1"),
    (lambda: n // n, "1"),
    (lambda: (a * n) // n, "a"),
    (lambda: (a * n + b * n) // n, "(a+b)"),
    (lambda: (a * n) % n, "0"),
    (lambda: Node.ands([NumNode(1), a < 3]), "(a<3)"),
    (lambda: Node.ands([a < 3, NumNode(0), b < 2]), "0"),
    (lambda: Node.ands([a < 3, b < 2, a < 3]), "((a<3) and (b<2))"),
    (lambda: Node.ands([]), "1"),
    (lambda: Node.sum([]), "0"),
    (lambda: Node.sum([1, 2, a]), "(a+3)"),
])
def test_simplify_render(expr, expected):
    assert expr().render() == expected


def test_structural_results():
    assert (a * 4) // 4 == a
    assert (a // 2) // 3 == DivNode(a, 6)
    assert (a + b) % 5 == ModNode(a + b, 5)
    assert (a * 4 + b < 8) == LtNode(a, 2)
    assert isinstance(a * 3, MulNode) and (a * 3).b == 3 and (a * 3).a is a
    s = a * 4 + b + 1
    assert isinstance(s, SumNode) and s.nodes == (MulNode(a, 4), b, NumNode(1))
    c = Node.ands([a < 3, b < 2])
    assert isinstance(c, AndNode) and c.nodes == (LtNode(a, 3), LtNode(b, 2))
    assert create_lt_node(a, 3) == (a < 3)
    assert set(NODE_KINDS) == {NumNode, Variable, MulNode, DivNode, ModNode, SumNode, AndNode, LtNode}


def test_bounds():
    assert ((a * 4 + b).min, (a * 4 + b).max) == (0, 31)
    assert ((a - b).min, (a - b).max) == (-3, 7)
    assert ((a * -2).min, (a * -2).max) == (-14, 0)
    assert ((x // 2).min, (x // 2).max) == (-3, 2)
    assert ((x % 3).min, (x % 3).max) == (0, 2)
    assert ((a % 5).min, (a % 5).max) == (0, 4)
    assert ((b % 5).min, (b % 5).max) == (0, 3)
    assert ((a < 3).min, (a < 3).max) == (0, 1)
    assert ((a * n).min, (a * n).max) == (0, 70)


def test_floor_semantics():
    assert (x // 2).evaluate({x: -3}) == -2
    assert (x % 3).evaluate({x: -4}) == 2
    assert sym_infer((x * 3 + 1) // 2, {x: -1}) == -1


def test_numnode_interop():
    assert NumNode(3) == NumNode(3)
    assert NumNode(3) == 3 and 3 == NumNode(3)
    assert hash(NumNode(3)) == hash(3)
    assert int(NumNode(3)) == 3
    assert [0, 1, 2, 3][NumNode(2)] == 2
    assert NumNode(2) + 3 == 5 and isinstance(NumNode(2) + 3, NumNode)
    assert NumNode(0).min == NumNode(0).max == 0
    assert not NumNode(0) and NumNode(5)
    assert a != 3 and not (a == 3)


def test_eq_hash_dict_keys():
    d = {a * 4 + b: "x", a < 3: "y"}
    assert d[a * 4 + b] == "x" and d[a < 3] == "y"
    assert Variable("a", 0, 7) == a and Variable("a", 0, 8) != a
    assert len({a + 1, 1 + a, a + 1}) == 1
    assert a + b != b + a or True  # order is kept, equality is structural


def test_immutable():
    with pytest.raises(AttributeError):
        a.min = 3
    with pytest.raises(AttributeError):
        (a + b).nodes = ()


def test_bind_unbind():
    nb = n.bind(3)
    assert nb.val == 3 and n.val is None
    assert nb == n and hash(nb) == hash(n)
    u, v = nb.unbind()
    assert u == n and u.val is None and v == 3
    assert sym_infer(nb * 4) == 12
    assert sym_infer(n * 4, {n: 5}) == 20
    with pytest.raises(ValueError):
        n.bind(11)
    with pytest.raises(ValueError):
        n.unbind()
    with pytest.raises(KeyError):
        sym_infer(n * 2)


def test_vars_substitute():
    e = a * 4 + b * n + (a < 3)
    assert e.vars() == {a, b, n}
    s = e.substitute({a: NumNode(2), n: 3})
    assert s.vars() == {b}
    assert s.render() == "((b*3)+9)"
    assert (a * 4 + b).substitute({a: b}).render() == "(b*5)"
    assert e.substitute({a: 1, b: 2, n: 3}) == 11
    assert sym_infer(7, {}) == 7


def test_render():
    g = Variable("gidx0", 0, 15)
    r = Variable("ridx1", 0, 3)
    assert (g * 4 + r).render() == "((gidx0*4)+ridx1)"
    assert (g * 4 + r).render({g: "gid"}) == "((gid*4)+ridx1)"
    assert sym_render(3) == "3" and sym_render(g) == "gidx0"
    assert repr(n) == "Variable('n', 1, 10)"


def test_errors():
    with pytest.raises(ValueError):
        Variable("v", 3, 2)
    with pytest.raises(ZeroDivisionError):
        a // 0
    with pytest.raises(ValueError):
        a // -2
    with pytest.raises(ValueError):
        a % -2
    with pytest.raises(ValueError):
        a // n  # ambiguous symbolic divisor
    with pytest.raises(ValueError):
        a % n
    with pytest.raises(ValueError):
        DivNode(a, 0)
    with pytest.raises(TypeError):
        a + 1.5


# ---- random expressions against plain Python integers -------------------------------------------

VARS = [Variable("a", 0, 7), Variable("b", -3, 5), Variable("c", 2, 4)]
POINTS = list(itertools.product(*(range(v.min, v.max + 1) for v in VARS)))

leaf = st.one_of(st.sampled_from([("var", i) for i in range(len(VARS))]),
                 st.integers(-6, 9).map(lambda k: ("const", k)))


def _extend(children):
    k = st.integers(-4, 6)
    pos = st.integers(1, 6)
    return st.one_of(
        st.tuples(st.just("add"), children, children),
        st.tuples(st.just("sub"), children, children),
        st.tuples(st.just("mul"), children, k),
        st.tuples(st.just("mulnode"), children, children),
        st.tuples(st.just("div"), children, pos),
        st.tuples(st.just("mod"), children, pos),
        st.tuples(st.just("lt"), children, st.integers(-10, 20)),
        st.tuples(st.just("ge"), children, st.integers(-10, 20)),
        st.tuples(st.just("ltnode"), children, children),
        st.tuples(st.just("and"), children, children),
    )


exprs = st.recursive(leaf, _extend, max_leaves=8)


def build(t):
    op = t[0]
    if op == "var":
        return VARS[t[1]]
    if op == "const":
        return NumNode(t[1])
    if op == "add":
        return build(t[1]) + build(t[2])
    if op == "sub":
        return build(t[1]) - build(t[2])
    if op == "mul":
        return build(t[1]) * t[2]
    if op == "mulnode":
        return build(t[1]) * build(t[2])
    if op == "div":
        return build(t[1]) // t[2]
    if op == "mod":
        return build(t[1]) % t[2]
    if op == "lt":
        return build(t[1]) < t[2]
    if op == "ge":
        return build(t[1]) >= t[2]
    if op == "ltnode":
        return build(t[1]) < build(t[2])
    if op == "and":
        return Node.ands([build(t[1]) < 3, build(t[2]) >= 0])
    raise AssertionError(op)


def value(t, env):
    op = t[0]
    if op == "var":
        return env[t[1]]
    if op == "const":
        return t[1]
    if op == "add":
        return value(t[1], env) + value(t[2], env)
    if op == "sub":
        return value(t[1], env) - value(t[2], env)
    if op == "mul":
        return value(t[1], env) * t[2]
    if op == "mulnode":
        return value(t[1], env) * value(t[2], env)
    if op == "div":
        return value(t[1], env) // t[2]
    if op == "mod":
        return value(t[1], env) % t[2]
    if op == "lt":
        return int(value(t[1], env) < t[2])
    if op == "ge":
        return int(value(t[1], env) >= t[2])
    if op == "ltnode":
        return int(value(t[1], env) < value(t[2], env))
    if op == "and":
        return int(value(t[1], env) < 3 and value(t[2], env) >= 0)
    raise AssertionError(op)


@settings(max_examples=150, deadline=None)
@given(exprs)
def test_random_expressions(t):
    node = build(t)
    if not isinstance(node, Node):
        node = NumNode(node)
    assert isinstance(node, NODE_KINDS)
    text = node.render()
    for pt in POINTS:
        want = value(t, pt)
        env = dict(zip(VARS, pt))
        got = node.evaluate(env)
        assert got == want, (text, pt)
        assert node.min <= want <= node.max, (text, pt, node.min, node.max)
        assert int(eval(text, {}, {v.expr: p for v, p in zip(VARS, pt)})) == want
    # substituting all variables folds to the constant
    assert node.substitute(dict(zip(VARS, POINTS[7]))) == value(t, POINTS[7])


def test_a_sum_without_carry_divides_by_its_outer_terms() -> None:
    """(B * d + s) // (d * m) is B // m and its % is (B % m) * d + s when 0 <= s < d: a window's index unravelled
    by the padded tracker below it (outer axes in multiples of a row, the position and tap under one row)."""
    c, i, j = Variable("c", 0, 127), Variable("i", 0, 55), Variable("j", 0, 2)
    flat = c * 12996 + i * 228 + j * 114 + 3  # (a 114 x 114 map: 12996 per channel, rows of 114)
    for node, want in ((flat // 831744, (c // 64)), (flat % 831744, (c % 64) * 12996 + i * 228 + j * 114 + 3)):
        assert node == want and "831744" not in node.render()
    for cv, iv, jv in itertools.product((0, 1, 63, 64, 65, 127), (0, 17, 55), (0, 2)):
        env = {c: cv, i: iv, j: jv}
        total = cv * 12996 + iv * 228 + jv * 114 + 3
        assert (flat // 831744).substitute(env).evaluate() == total // 831744
        assert (flat % 831744).substitute(env).evaluate() == total % 831744
    # a term that may carry past the divisor's factor keeps the division
    assert isinstance((c * 12996 + i * 300) // 831744, DivNode)
