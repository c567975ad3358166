"""Symbolic integer expressions, used for buffer indexing and for symbolic shapes.

A `Node` is an immutable integer expression that knows inclusive integer bounds `min` and `max`.
Building expressions with the Python operators simplifies as it goes (constant folding, flattening
sums, combining like terms, div/mod rules, folding comparisons decided by the bounds, ...).

There are exactly eight node kinds; code that walks a tree (e.g. the code generator) only has to
handle these:

  =========  =====================================  ==========================================
  kind       public fields                          value
  =========  =====================================  ==========================================
  NumNode    b: int                                 b
  Variable   expr: str, min: int, max: int,         a named integer in [min, max]; `val` is set
             val: int | None                        on a *bound* copy (see `Variable.bind`)
  MulNode    a: Node, b: int | Node                 a * b (b is a Node only for symbolic
                                                    products such as `idx0 * n`)
  DivNode    a: Node, b: int (b > 0)                floor(a / b)
  ModNode    a: Node, b: int (b > 0)                a - b * floor(a / b)    (in [0, b-1])
  SumNode    nodes: tuple[Node, ...]                sum of nodes (an int constant, if any, last)
  AndNode    nodes: tuple[Node, ...]                1 if every node is nonzero else 0
  LtNode     a: Node, b: int | Node                 1 if a < b else 0
  =========  =====================================  ==========================================

Division and modulo use Python (floor) semantics. Index expressions produced by the shape layer only
divide non-negative values at valid (unmasked) positions, where floor and C (truncating) semantics
agree; at masked-out positions the index value is irrelevant.

`==` and `hash` are structural (`NumNode(3) == 3` is also True), so nodes can be dict keys.
`<`, `<=`, `>`, `>=` build 0/1 valued nodes (folded to NumNode when the bounds decide them).
`render()` gives a readable string that is also a valid Python expression, e.g. `((gidx0*4)+ridx1)`;
division renders as `//`, conjunction as `and`.
"""
from __future__ import annotations

import math
from typing import Dict, Iterable, List, Mapping, Optional, Set, Tuple, Union

__all__ = ["Node", "NumNode", "Variable", "MulNode", "DivNode", "ModNode", "SumNode", "AndNode", "LtNode",
           "sint", "create_lt_node", "sym_infer", "sym_render", "NODE_KINDS"]


_setattr = object.__setattr__  # (Nodes are immutable: their constructors set their slots through this)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _to_node(x: Union[int, "Node"]) -> "Node":
    if isinstance(x, Node):
        return x
    if isinstance(x, int):
        return NumNode(int(x))
    raise TypeError(f"expected an int or a Node, got {type(x).__name__}: {x!r}")


def _unnum(x: Union[int, "Node"]) -> Union[int, "Node"]:
    """NumNode -> int, everything else unchanged."""
    if isinstance(x, NumNode):
        return x.b
    if isinstance(x, bool):
        return int(x)
    return x


def _fold(n: "Node") -> "Node":
    """Replace a node whose bounds pin it to one value by that constant."""
    if n.min == n.max and not isinstance(n, (NumNode, Variable)):
        return NumNode(n.min)
    return n


def _ceildiv(a: int, b: int) -> int:
    return -(-a // b)


def _split_coef(n: "Node") -> Tuple[int, "Node"]:
    """n == coef * base with an int coef (1 when there is none)."""
    if isinstance(n, MulNode) and isinstance(n.b, int):
        return n.b, n.a
    return 1, n


def _exact_div(n: "Node", g: int) -> "Node":
    """n / g for a node whose int coefficient is a multiple of g."""
    c, base = _split_coef(n)
    return NumNode(n.b // g) if isinstance(n, NumNode) else base._mul_int(c // g)


class Node:
    """Base class of all symbolic integer expressions (immutable, structural equality/hash)."""

    __slots__ = ("min", "max", "_hash")
    min: int
    max: int
    _hash: Optional[int]

    def _set(self, **kw) -> None:
        for k, v in kw.items():
            object.__setattr__(self, k, v)

    def _bounds(self, lo: int, hi: int) -> None:
        # (every Node is built through here: the plain-int test first, then the full one)
        if (lo.__class__ is not int or hi.__class__ is not int) and not (_is_int(lo) and _is_int(hi)):
            raise TypeError(f"node bounds must be ints, got {lo!r}, {hi!r}")
        _setattr(self, "min", lo)
        _setattr(self, "max", hi)
        _setattr(self, "_hash", None)

    def __setattr__(self, key, value):
        raise AttributeError(f"{type(self).__name__} is immutable")

    # pickling: the slots but the cached hash, which is of names that hash differently in another process
    def __getstate__(self):
        slots = (k for cls in type(self).__mro__ for k in getattr(cls, "__slots__", ()))
        return {k: getattr(self, k) for k in slots if k != "_hash" and hasattr(self, k)}

    def __setstate__(self, state):
        for k, v in state.items():
            object.__setattr__(self, k, v)
        object.__setattr__(self, "_hash", None)

    def __delattr__(self, key):
        raise AttributeError(f"{type(self).__name__} is immutable")

    # ---- structure -----------------------------------------------------------------------------
    def _key(self) -> tuple:
        raise NotImplementedError

    def __eq__(self, other):
        if self is other:
            return True
        if isinstance(other, Node):
            return type(self) is type(other) and self._key() == other._key()
        return NotImplemented

    def __ne__(self, other):
        r = self.__eq__(other)
        return r if r is NotImplemented else not r

    def __hash__(self) -> int:
        h = self._hash
        if h is None:
            h = hash((type(self).__name__,) + self._key())
            _setattr(self, "_hash", h)
        return h

    def __bool__(self) -> bool:
        # like a number: false only when the expression is provably 0
        return not (self.min == self.max == 0)

    def __repr__(self) -> str:
        return f"<{self.render()}>"

    def __str__(self) -> str:
        return self.render()

    # ---- tree helpers ----------------------------------------------------------------------------
    def vars(self) -> Set["Variable"]:
        """All Variables appearing in the expression."""
        raise NotImplementedError

    def substitute(self, var_vals: Mapping["Variable", Union[int, "Node"]]) -> "Node":
        """Replace Variables by ints/Nodes (re-simplifying on the way)."""
        raise NotImplementedError

    def evaluate(self, var_vals: Optional[Mapping["Variable", int]] = None) -> int:
        """Integer value with the Variables set from `var_vals` (or their bound value)."""
        raise NotImplementedError

    def render(self, ctx: Optional[Mapping["Variable", str]] = None) -> str:
        """Readable string; `ctx` may map Variables to the names to print for them."""
        raise NotImplementedError

    # ---- arithmetic -----------------------------------------------------------------------------
    def __add__(self, other):
        if not isinstance(other, (Node, int)):
            return NotImplemented
        return Node.sum([self, other])

    def __radd__(self, other):
        if not isinstance(other, (Node, int)):
            return NotImplemented
        return Node.sum([other, self])

    def __neg__(self) -> "Node":
        return self * -1

    def __sub__(self, other):
        if not isinstance(other, (Node, int)):
            return NotImplemented
        return Node.sum([self, -other])

    def __rsub__(self, other):
        if not isinstance(other, (Node, int)):
            return NotImplemented
        return Node.sum([other, -self])

    def __mul__(self, other):
        if isinstance(other, Node):
            if isinstance(other, NumNode):
                return self._mul_int(other.b)
            if isinstance(self, NumNode):
                return other._mul_int(self.b)
            return _mul_nodes(self, other)
        if isinstance(other, int):
            return self._mul_int(int(other))
        return NotImplemented

    def __rmul__(self, other):
        if isinstance(other, int):
            return self._mul_int(int(other))
        return NotImplemented

    def _mul_int(self, b: int) -> "Node":
        if b == 0:
            return NumNode(0)
        if b == 1:
            return self
        return _fold(MulNode(self, b))

    def __floordiv__(self, other):
        if isinstance(other, Node) and not isinstance(other, NumNode):
            return _div_by_node(self, other)
        other = _unnum(other)
        if not isinstance(other, int):
            return NotImplemented
        if other == 0:
            raise ZeroDivisionError(f"{self.render()} // 0")
        if other < 0:
            raise ValueError(f"symbolic // needs a positive divisor, got {other}")
        if other == 1:
            return self
        lo, hi = self.min // other, self.max // other
        if lo == hi:
            return NumNode(lo)
        return self._div_struct(other)

    def __rfloordiv__(self, other):
        if not isinstance(other, int):
            return NotImplemented
        return NumNode(int(other)) // self

    def _div_struct(self, b: int) -> "Node":
        return DivNode(self, b)

    def __mod__(self, other):
        if isinstance(other, Node) and not isinstance(other, NumNode):
            return _mod_by_node(self, other)
        other = _unnum(other)
        if not isinstance(other, int):
            return NotImplemented
        if other == 0:
            raise ZeroDivisionError(f"{self.render()} % 0")
        if other < 0:
            raise ValueError(f"symbolic % needs a positive divisor, got {other}")
        if other == 1:
            return NumNode(0)
        lo, hi = self.min // other, self.max // other
        if lo == hi:
            return self - lo * other
        return self._mod_struct(other)

    def __rmod__(self, other):
        if not isinstance(other, int):
            return NotImplemented
        return NumNode(int(other)) % self

    def _mod_struct(self, b: int) -> "Node":
        return ModNode(self, b)

    # ---- comparisons (build 0/1 nodes) -----------------------------------------------------------
    def __lt__(self, other):
        if not isinstance(other, (Node, int)):
            return NotImplemented
        return create_lt_node(self, other)

    def __le__(self, other):
        if not isinstance(other, (Node, int)):
            return NotImplemented
        return create_lt_node(self, other + 1)

    def __gt__(self, other):
        if not isinstance(other, (Node, int)):
            return NotImplemented
        return create_lt_node(-self, -other)

    def __ge__(self, other):
        if not isinstance(other, (Node, int)):
            return NotImplemented
        return create_lt_node(-self, -other + 1)

    # ---- constructors ------------------------------------------------------------------------------
    @staticmethod
    def sum(nodes: Iterable[Union[int, "Node"]]) -> "Node":
        """Simplified sum: flattens sums, folds constants, combines like terms, fuses (x//k)*k + x%k."""
        terms: Dict[Node, int] = {}
        given: Dict[Node, Node] = {}  # a base met once, in a term taken as it was: that term is reused as it is
        const = 0
        todo: List[Tuple[Node, int]] = [(_to_node(n), 1) for n in reversed(list(nodes))]
        while todo:
            n, mul = todo.pop()
            if isinstance(n, NumNode):
                const += n.b * mul
            elif isinstance(n, SumNode):
                todo.extend((x, mul) for x in reversed(n.nodes))
            else:
                c, base = _split_coef(n)
                if base in terms:
                    terms[base] += c * mul
                    given.pop(base, None)
                else:
                    terms[base] = c * mul
                    if mul == 1:
                        given[base] = n
        # fuse (x//k)*(c*k) + (x%k)*c -> x*c
        changed = True
        while changed:
            changed = False
            for base, c in list(terms.items()):
                if c == 0 or not isinstance(base, ModNode):
                    continue
                partner = DivNode(base.a, base.b)
                if terms.get(partner) == c * base.b:
                    del terms[base], terms[partner]
                    extra = Node.sum([base.a._mul_int(c)])
                    for n2 in (extra.nodes if isinstance(extra, SumNode) else (extra,)):
                        if isinstance(n2, NumNode):
                            const += n2.b
                        else:
                            c2, b2 = _split_coef(n2)
                            terms[b2] = terms.get(b2, 0) + c2
                            given.pop(b2, None)
                    changed = True
                    break
        out: List[Node] = [given[base] if base in given else base._mul_int(c) for base, c in terms.items() if c != 0]
        if const != 0:
            out.append(NumNode(const))
        if not out:
            return NumNode(0)
        if len(out) == 1:
            return out[0]
        return _fold(SumNode(tuple(out)))

    @staticmethod
    def ands(nodes: Iterable[Union[int, "Node"]]) -> "Node":
        """Conjunction of 0/1 conditions: 0 if any is always 0, drops always-true ones, 1 if none left."""
        flat: List[Node] = []
        for n in nodes:
            n = _to_node(n)
            flat.extend(n.nodes if isinstance(n, AndNode) else (n,))
        out: List[Node] = []
        for n in flat:
            if n.min == n.max == 0:
                return NumNode(0)
            if n.min > 0 or n.max < 0:
                continue
            if n not in out:
                out.append(n)
        if not out:
            return NumNode(1)
        if len(out) == 1:
            return out[0]
        return AndNode(tuple(out))


def _mul_nodes(a: Node, b: Node) -> Node:
    """Product of two non-constant nodes."""
    if isinstance(a, SumNode):
        return Node.sum([n * b for n in a.nodes])
    if isinstance(b, SumNode):
        return Node.sum([a * n for n in b.nodes])
    ca, a = _split_coef(a)
    cb, b = _split_coef(b)
    if ca != 1 or cb != 1:
        return (a * b)._mul_int(ca * cb)
    if a.render() > b.render():
        a, b = b, a
    return _fold(MulNode(a, b))


def _factor_out(term: Node, b: Node) -> Optional[Node]:
    """term / b when term is syntactically b times something, else None."""
    if term == b:
        return NumNode(1)
    if isinstance(term, MulNode):
        if isinstance(term.b, int):
            f = _factor_out(term.a, b)
            return None if f is None else f._mul_int(term.b)
        if term.b == b:
            return term.a
        if term.a == b:
            return _to_node(term.b)
        f = _factor_out(term.a, b)
        if f is not None:
            return f * term.b
    return None


def _div_by_node(x: Node, b: Node) -> Node:
    if x == b:
        return NumNode(1)
    if b.min <= 0:
        raise ValueError(f"cannot divide {x.render()} by {b.render()}: the divisor may be <= 0")
    if 0 <= x.min and x.max < b.min:
        return NumNode(0)
    f = _factor_out(x, b)
    if f is not None:
        return f
    if isinstance(x, SumNode):
        quot: List[Node] = []
        rest: List[Node] = []
        for t in x.nodes:
            f = _factor_out(t, b)
            (rest if f is None else quot).append(t if f is None else f)
        if quot:
            return Node.sum(quot + [Node.sum(rest) // b])
    raise ValueError(f"cannot simplify {x.render()} // {b.render()} (symbolic divisor)")


def _mod_by_node(x: Node, b: Node) -> Node:
    if x == b or _factor_out(x, b) is not None:
        return NumNode(0)
    if b.min <= 0:
        raise ValueError(f"cannot take {x.render()} % {b.render()}: the divisor may be <= 0")
    if 0 <= x.min and x.max < b.min:
        return x
    if isinstance(x, SumNode):
        rest = [t for t in x.nodes if _factor_out(t, b) is None]
        if len(rest) < len(x.nodes):
            return Node.sum(rest) % b
    raise ValueError(f"cannot simplify {x.render()} % {b.render()} (symbolic divisor)")


def create_lt_node(lhs: Union[int, Node], b: Union[int, Node]) -> Node:
    """The 0/1 node `lhs < b`, simplified."""
    lhs, b = _to_node(lhs), _unnum(b)
    if isinstance(b, Node):
        d = lhs - b
        if d.max < 0:
            return NumNode(1)
        if d.min >= 0:
            return NumNode(0)
        return LtNode(lhs, b)
    if not isinstance(b, int):
        raise TypeError(f"cannot compare a Node with {b!r}")
    if lhs.max < b:
        return NumNode(1)
    if lhs.min >= b:
        return NumNode(0)
    if isinstance(lhs, SumNode):
        const = sum(n.b for n in lhs.nodes if isinstance(n, NumNode))
        if const != 0:
            return create_lt_node(Node.sum([n for n in lhs.nodes if not isinstance(n, NumNode)]), b - const)
        coefs = [_split_coef(n)[0] for n in lhs.nodes]
        g = math.gcd(*coefs)
        if g > 1:
            return create_lt_node(Node.sum([_exact_div(n, g) for n in lhs.nodes]), _ceildiv(b, g))
        # (c*y + r) < b  with 0 <= r < c and c | b   ->   y < b/c
        for c in sorted({abs(x) for x in coefs if abs(x) > 1}, reverse=True):
            if b % c:
                continue
            big = [n for n, k in zip(lhs.nodes, coefs) if k % c == 0]
            small = [n for n, k in zip(lhs.nodes, coefs) if k % c != 0]
            if not big or not small:
                continue
            r = Node.sum(small)
            if r.min >= 0 and r.max < c:
                return create_lt_node(Node.sum([_exact_div(n, c) for n in big]), b // c)
    if isinstance(lhs, MulNode) and isinstance(lhs.b, int) and abs(lhs.b) > 1:
        c = lhs.b
        return create_lt_node(lhs.a._mul_int(1 if c > 0 else -1), _ceildiv(b, abs(c)))
    return LtNode(lhs, b)


# ---- node kinds ----------------------------------------------------------------------------------

class NumNode(Node):
    """An integer constant."""

    __slots__ = ("b",)
    b: int

    def __init__(self, b: int):
        if not isinstance(b, int):
            raise TypeError(f"NumNode needs an int, got {b!r}")
        b = int(b)
        _setattr(self, "b", b)
        self._bounds(b, b)

    def _key(self) -> tuple:
        return (self.b,)

    def __eq__(self, other):
        if isinstance(other, int):
            return self.b == other
        return super().__eq__(other)

    def __hash__(self) -> int:
        return hash(self.b)

    def __int__(self) -> int:
        return self.b

    def __index__(self) -> int:
        return self.b

    def __repr__(self) -> str:
        return f"NumNode({self.b})"

    def vars(self) -> Set["Variable"]:
        return set()

    def substitute(self, var_vals) -> Node:
        return self

    def evaluate(self, var_vals=None) -> int:
        return self.b

    def render(self, ctx=None) -> str:
        return str(self.b)

    def _mul_int(self, b: int) -> Node:
        return NumNode(self.b * b)


class Variable(Node):
    """A named integer in [nmin, nmax]. Symbolic shape variables may be bound to a value (`bind`);
    a bound Variable compares and hashes equal to the unbound one (only expr/min/max count)."""

    __slots__ = ("expr", "val")
    expr: str
    val: Optional[int]

    def __init__(self, expr: str, nmin: int, nmax: int):
        if not isinstance(expr, str) or not expr:
            raise ValueError(f"Variable needs a non-empty name, got {expr!r}")
        if not (_is_int(nmin) and _is_int(nmax)):
            raise TypeError(f"Variable bounds must be ints, got {nmin!r}, {nmax!r}")
        if nmin > nmax:
            raise ValueError(f"Variable {expr}: min {nmin} > max {nmax}")
        _setattr(self, "expr", expr)
        _setattr(self, "val", None)
        self._bounds(nmin, nmax)

    def _key(self) -> tuple:
        return (self.expr, self.min, self.max)

    def __repr__(self) -> str:
        v = "" if self.val is None else f", val={self.val}"
        return f"Variable({self.expr!r}, {self.min}, {self.max}{v})"

    def bind(self, val: int) -> "Variable":
        """A copy of this Variable bound to `val` (must lie in [min, max])."""
        if not _is_int(val):
            raise TypeError(f"can only bind an int, got {val!r}")
        if not self.min <= val <= self.max:
            raise ValueError(f"cannot bind {self.expr}={val}: outside [{self.min}, {self.max}]")
        if self.val is not None and self.val != val:
            raise ValueError(f"{self.expr} is already bound to {self.val}")
        ret = Variable(self.expr, self.min, self.max)
        ret._set(val=int(val))
        return ret

    def unbind(self) -> Tuple["Variable", int]:
        """(the unbound Variable, its bound value)."""
        if self.val is None:
            raise ValueError(f"Variable {self.expr} is not bound")
        return Variable(self.expr, self.min, self.max), self.val

    def vars(self) -> Set["Variable"]:
        return {self}

    def substitute(self, var_vals) -> Node:
        return _to_node(var_vals[self]) if self in var_vals else self

    def evaluate(self, var_vals=None) -> int:
        if var_vals is not None and self in var_vals:
            return int(var_vals[self])
        if self.val is not None:
            return self.val
        raise KeyError(f"no value for Variable {self.expr}")

    def render(self, ctx=None) -> str:
        if ctx is not None and self in ctx:
            return ctx[self]
        return self.expr


class MulNode(Node):
    """a * b; b is an int, or a Node for a product of two symbolic values."""

    __slots__ = ("a", "b")
    a: Node
    b: Union[int, Node]

    def __init__(self, a: Node, b: Union[int, Node]):
        b = _unnum(b)
        _setattr(self, "a", a)
        _setattr(self, "b", b)
        if isinstance(b, Node):
            corners = [a.min * b.min, a.min * b.max, a.max * b.min, a.max * b.max]
            self._bounds(min(corners), max(corners))
        else:
            self._bounds(*sorted((a.min * b, a.max * b)))

    def _key(self) -> tuple:
        return (self.a, self.b)

    def vars(self) -> Set[Variable]:
        return self.a.vars() | (self.b.vars() if isinstance(self.b, Node) else set())

    def substitute(self, var_vals) -> Node:
        return self.a.substitute(var_vals) * (self.b.substitute(var_vals) if isinstance(self.b, Node) else self.b)

    def evaluate(self, var_vals=None) -> int:
        return self.a.evaluate(var_vals) * (self.b.evaluate(var_vals) if isinstance(self.b, Node) else self.b)

    def render(self, ctx=None) -> str:
        return f"({self.a.render(ctx)}*{self.b.render(ctx) if isinstance(self.b, Node) else self.b})"

    def _mul_int(self, b: int) -> Node:
        if isinstance(self.b, int):
            return self.a._mul_int(self.b * b)
        return super()._mul_int(b)

    def _div_struct(self, b: int) -> Node:
        if isinstance(self.b, int):
            if self.b % b == 0:
                return self.a._mul_int(self.b // b)
            if self.b > 0 and b % self.b == 0:
                return self.a // (b // self.b)
        return DivNode(self, b)

    def _mod_struct(self, b: int) -> Node:
        if isinstance(self.b, int):
            c = self.b
            if c % b == 0:
                return NumNode(0)
            if c % b != c:
                return self.a._mul_int(c % b) % b
            if b % c == 0:
                return (self.a % (b // c))._mul_int(c)
        return ModNode(self, b)


class DivNode(Node):
    """floor(a / b) with an int b > 0."""

    __slots__ = ("a", "b")
    a: Node
    b: int

    def __init__(self, a: Node, b: int):
        if not _is_int(b) or b <= 0:
            raise ValueError(f"DivNode needs a positive int divisor, got {b!r}")
        _setattr(self, "a", a)
        _setattr(self, "b", b)
        self._bounds(a.min // b, a.max // b)

    def _key(self) -> tuple:
        return (self.a, self.b)

    def vars(self) -> Set[Variable]:
        return self.a.vars()

    def substitute(self, var_vals) -> Node:
        return self.a.substitute(var_vals) // self.b

    def evaluate(self, var_vals=None) -> int:
        return self.a.evaluate(var_vals) // self.b

    def render(self, ctx=None) -> str:
        return f"({self.a.render(ctx)}//{self.b})"

    def _div_struct(self, b: int) -> Node:
        return self.a // (self.b * b)


class ModNode(Node):
    """a mod b (Python semantics, result in [0, b-1]) with an int b > 0."""

    __slots__ = ("a", "b")
    a: Node
    b: int

    def __init__(self, a: Node, b: int):
        if not _is_int(b) or b <= 0:
            raise ValueError(f"ModNode needs a positive int divisor, got {b!r}")
        _setattr(self, "a", a)
        _setattr(self, "b", b)
        if a.min // b == a.max // b:
            self._bounds(a.min % b, a.max % b)
        else:
            self._bounds(0, b - 1 if a.min < 0 else min(b - 1, a.max))

    def _key(self) -> tuple:
        return (self.a, self.b)

    def vars(self) -> Set[Variable]:
        return self.a.vars()

    def substitute(self, var_vals) -> Node:
        return self.a.substitute(var_vals) % self.b

    def evaluate(self, var_vals=None) -> int:
        return self.a.evaluate(var_vals) % self.b

    def render(self, ctx=None) -> str:
        return f"({self.a.render(ctx)}%{self.b})"

    def _mod_struct(self, b: int) -> Node:
        if self.b % b == 0:
            return self.a % b
        return ModNode(self, b)


class SumNode(Node):
    """Sum of nodes (build with Node.sum to get a simplified one)."""

    __slots__ = ("nodes",)
    nodes: Tuple[Node, ...]

    def __init__(self, nodes: Tuple[Node, ...]):
        nodes = tuple(_to_node(n) for n in nodes)
        _setattr(self, "nodes", nodes)
        self._bounds(sum(n.min for n in nodes), sum(n.max for n in nodes))

    def _key(self) -> tuple:
        return self.nodes

    def vars(self) -> Set[Variable]:
        return set().union(*(n.vars() for n in self.nodes))

    def substitute(self, var_vals) -> Node:
        return Node.sum([n.substitute(var_vals) for n in self.nodes])

    def evaluate(self, var_vals=None) -> int:
        return sum(n.evaluate(var_vals) for n in self.nodes)

    def render(self, ctx=None) -> str:
        return "(" + "+".join(n.render(ctx) for n in self.nodes) + ")"

    def _mul_int(self, b: int) -> Node:
        return Node.sum([n._mul_int(b) for n in self.nodes])

    def _parts(self) -> Tuple[List[Tuple[int, Node]], int]:
        const, terms = 0, []
        for n in self.nodes:
            if isinstance(n, NumNode):
                const += n.b
            else:
                terms.append(_split_coef(n))
        return terms, const

    def _div_struct(self, b: int) -> Node:
        terms, const = self._parts()
        quot = [base._mul_int(c // b) for c, base in terms if c % b == 0]
        rest = [base._mul_int(c) for c, base in terms if c % b != 0]
        if quot or const // b != 0:
            return Node.sum(quot + [const // b, Node.sum(rest + [const % b]) // b])
        g = math.gcd(b, const, *(c for c, _ in terms))
        if g > 1:
            return Node.sum([base._mul_int(c // g) for c, base in terms] + [const // g]) // (b // g)
        if (split := self._carry_free(terms, const, b)) is not None:
            d, big, _ = split
            return big // (b // d)
        return DivNode(self, b)

    def _carry_free(self, terms: List[Tuple[int, Node]], const: int, b: int) -> Optional[Tuple[int, Node, Node]]:
        """(d, big, small) with self = big * d + small, d a divisor of b and 0 <= small < d, where one exists (the
        largest such d): then self // b = big // (b / d) and self % b = (big % (b / d)) * d + small, as no carry
        crosses d. A window's index into the tracker below it is such a sum (positions and taps, whose largest
        value stays under the next axis's stride, plus the outer axes in multiples of it)."""
        for d in sorted({c for c, _ in terms if 1 < c < b and b % c == 0}, reverse=True):
            small = Node.sum([base._mul_int(c) for c, base in terms if c % d != 0] + [const])
            if small.min >= 0 and small.max < d:
                return d, Node.sum([base._mul_int(c // d) for c, base in terms if c % d == 0]), small
        return None

    def _mod_struct(self, b: int) -> Node:
        terms, const = self._parts()
        if const % b != const or any(c % b != c for c, _ in terms):
            return Node.sum([base._mul_int(c % b) for c, base in terms] + [const % b]) % b
        g = math.gcd(b, const, *(c for c, _ in terms))
        if g > 1:
            inner = Node.sum([base._mul_int(c // g) for c, base in terms] + [const // g])
            return (inner % (b // g))._mul_int(g)
        if (split := self._carry_free(terms, const, b)) is not None:
            d, big, small = split
            return Node.sum([(big % (b // d))._mul_int(d), small])
        return ModNode(self, b)


class AndNode(Node):
    """1 if every node is nonzero else 0 (build with Node.ands to get a simplified one)."""

    __slots__ = ("nodes",)
    nodes: Tuple[Node, ...]

    def __init__(self, nodes: Tuple[Node, ...]):
        nodes = tuple(_to_node(n) for n in nodes)
        _setattr(self, "nodes", nodes)
        always = all(n.min > 0 or n.max < 0 for n in nodes)
        never = any(n.min == n.max == 0 for n in nodes)
        self._bounds(1 if always else 0, 0 if never else 1)

    def _key(self) -> tuple:
        return self.nodes

    def vars(self) -> Set[Variable]:
        return set().union(*(n.vars() for n in self.nodes))

    def substitute(self, var_vals) -> Node:
        return Node.ands([n.substitute(var_vals) for n in self.nodes])

    def evaluate(self, var_vals=None) -> int:
        return int(all(n.evaluate(var_vals) != 0 for n in self.nodes))

    def render(self, ctx=None) -> str:
        return "(" + " and ".join(n.render(ctx) for n in self.nodes) + ")"


class LtNode(Node):
    """1 if a < b else 0 (build with create_lt_node or `<` to get a simplified one)."""

    __slots__ = ("a", "b")
    a: Node
    b: Union[int, Node]

    def __init__(self, a: Node, b: Union[int, Node]):
        b = _unnum(b)
        _setattr(self, "a", a)
        _setattr(self, "b", b)
        bmin, bmax = (b.min, b.max) if isinstance(b, Node) else (b, b)
        self._bounds(1 if a.max < bmin else 0, 0 if a.min >= bmax else 1)

    def _key(self) -> tuple:
        return (self.a, self.b)

    def vars(self) -> Set[Variable]:
        return self.a.vars() | (self.b.vars() if isinstance(self.b, Node) else set())

    def substitute(self, var_vals) -> Node:
        return create_lt_node(self.a.substitute(var_vals),
                              self.b.substitute(var_vals) if isinstance(self.b, Node) else self.b)

    def evaluate(self, var_vals=None) -> int:
        return int(self.a.evaluate(var_vals) < (self.b.evaluate(var_vals) if isinstance(self.b, Node) else self.b))

    def render(self, ctx=None) -> str:
        return f"({self.a.render(ctx)}<{self.b.render(ctx) if isinstance(self.b, Node) else self.b})"


NODE_KINDS = (NumNode, Variable, MulNode, DivNode, ModNode, SumNode, AndNode, LtNode)

sint = Union[int, Node]


def sym_infer(x: sint, var_vals: Optional[Mapping[Variable, int]] = None) -> int:
    """The int value of `x` with Variables taken from `var_vals` (or their bound value)."""
    if isinstance(x, Node):
        return x.evaluate(var_vals)
    return int(x)


def sym_render(x: sint, ctx: Optional[Mapping[Variable, str]] = None) -> str:
    """render() for a Node, str() for an int."""
    return x.render(ctx) if isinstance(x, Node) else str(x)
