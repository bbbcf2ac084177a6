"""Domain mutation operators for cosmic-ray: the mistakes this project's math is made of.

cosmic-ray's core operators replace ``+ - * / < ==``, numbers, booleans, ..., but never touch ``@``, ``.conj()``,
``.mT`` / ``.mH`` / ``.T`` or any call, which is where gradient code goes wrong (derivation.md: a missing
conjugate, a wrong transpose, a dropped term of (9)/(14)/(16), ``1 − a`` for ``1 − a²``).  These operators do:

* ``DropConjugate``: ``x.conj()`` → ``x``; ``jnp.conj(x)`` → ``x``; ``x.mH`` → ``x.mT``; ``tanh_backward(g, y)``
  (which applies ``conj``) → ``g * (1 - y * y)``.
* ``DropTranspose``: ``x.mT`` / ``x.T`` → ``x``; ``x.mH`` → ``x.conj()``.
* ``AddTranspose``: an operand ``x`` of ``@`` → ``x.mT``.
* ``SwapMatmulOperands``: ``x @ y`` → ``y @ x``.
* ``DropSumTerm``: ``a + b`` → ``a`` and → ``b``; ``a - b`` → ``a``; ``addmm(c, m1, m2)`` → ``c`` and
  → ``m1 @ m2``.
* ``FirstPowerDerivative``: ``a * a`` → ``a``; ``x ** 2`` → ``x``; ``tanh_backward(g, y)``
  → ``g * (1 - y).conj()``.
* ``RealPartOnly``: the first argument ``x`` of ``norm(...)`` / ``abs(...)`` → ``x.real`` (a comparison that sees
  only real parts: the weakening of crosscheck's metric that issue 24 measured).

Each mutated expression is written in parentheses, so it binds as the original did.  The provider is
registered as the ``cosmic_ray.operator_providers`` entry point ``domain`` (pyproject.toml); ``mutation.cr``
also registers it at run time, for a venv whose installed metadata predates that entry point.
"""

from __future__ import annotations

import parso
from cosmic_ray.operators.operator import Example, Operator

__all__ = ["OperatorProvider", "OPERATORS"]


# --- parso helpers ---------------------------------------------------------------------------------------------------

def _expr(code: str, prefix: str):
    """A parso node for ``(code)``, carrying the whitespace ``prefix`` of the node it replaces."""
    node = parso.parse(f"({code})").children[0]
    node.children[0].prefix = prefix
    return node


def _code(node) -> str:
    """Source of ``node`` without its leading whitespace."""
    return node.get_code(include_prefix=False)


def _prefix(node) -> str:
    return node.get_first_leaf().prefix


def _trailers(node):
    """``(base, [trailer, ...])`` of an ``atom_expr`` / ``power`` node such as ``x.conj()`` or ``k.mT``."""
    if node.type not in ("atom_expr", "power") or len(node.children) < 2:
        return None, []
    kids = node.children
    trailers = [c for c in kids[1:] if c.type == "trailer"]
    if node.type == "power" and len(trailers) != len(kids) - 1:
        return None, []
    return kids[0], trailers


def _attr(trailer) -> str:
    """The attribute name of a ``.name`` trailer, else ``""``."""
    if trailer.children[0].type == "operator" and trailer.children[0].value == ".":
        return trailer.children[1].value
    return ""


def _is_call(trailer) -> bool:
    return trailer.children[0].type == "operator" and trailer.children[0].value == "("


def _call_args(trailer):
    """The argument nodes of a call trailer ``(a, b, kw=c)``."""
    if len(trailer.children) == 2:
        return []
    inner = trailer.children[1]
    if inner.type == "arglist":
        return [c for c in inner.children if not (c.type == "operator" and c.value == ",")]
    return [inner]


def _callee(node):
    """``(callee name, args)`` when ``node`` is a call ``f(...)`` / ``mod.f(...)``, else ``(None, [])``."""
    base, trailers = _trailers(node)
    if base is None or not trailers or not _is_call(trailers[-1]):
        return None, []
    name = _attr(trailers[-2]) if len(trailers) >= 2 else (base.value if base.type == "name" else "")
    return name, _call_args(trailers[-1])


def _positional(args):
    return [a for a in args if a.type != "argument"]


_CONJ_METHODS = ("conj", "conjugate", "conj_physical", "resolve_conj")
_CONJ_FUNCTIONS = ("conj", "conjugate")
_TANH_BACKWARD = ("_tanh_backward", "_tanh_backward_out", "tanh_backward")
_ADDMM = ("addmm", "_addmm", "baddbmm")


class _Rewrite(Operator):
    """An operator given as ``rewrites(node) -> [(position node, new code)]``."""

    def rewrites(self, node):                          # pragma: no cover - abstract
        raise NotImplementedError

    def mutation_positions(self, node):
        for where, _ in self.rewrites(node):
            yield (where.start_pos, where.end_pos)

    def mutate(self, node, index):
        _, code = self.rewrites(node)[index]
        return _expr(code, _prefix(node))


def _trailer_rewrites(node, edit):
    base, trailers = _trailers(node)
    if base is None:
        return []
    out = []
    codes = [t.get_code(include_prefix=False) for t in trailers]
    for i in range(len(trailers)):
        new = edit(trailers, codes, i)
        if new is not None:
            out.append((trailers[i], _code(base) + "".join(new)))
    return out


# --- the operators ----------------------------------------------------------------------------------------------------

class DropConjugate(_Rewrite):
    """``x.conj()`` → ``x``; ``conj(x)`` → ``x``; ``x.mH`` → ``x.mT``;
    ``tanh_backward(g, y)`` → ``g * (1 - y * y)``."""

    def rewrites(self, node):
        def edit(trailers, codes, i):
            name = _attr(trailers[i])
            if (name in _CONJ_METHODS and i + 1 < len(trailers) and _is_call(trailers[i + 1])
                    and len(trailers[i + 1].children) == 2):          # x.conj(), not jnp.conj(x)
                return codes[:i] + codes[i + 2:]
            if name == "mH":
                return codes[:i] + [".mT"] + codes[i + 1:]
            return None

        out = _trailer_rewrites(node, edit)
        name, args = _callee(node)
        pos = _positional(args)
        if name in _CONJ_FUNCTIONS and len(pos) == 1 and len(args) == 1:
            out.append((node, _code(pos[0])))
        if name in _TANH_BACKWARD and len(pos) >= 2:
            out.append((node, f"{_code(pos[0])} * (1 - {_code(pos[1])} * {_code(pos[1])})"))
        return out

    @classmethod
    def examples(cls):
        return (Example("y = g @ k.conj()", "y = g @ (k)"),
                Example("y = a.mH @ g", "y = (a.mT) @ g"),
                Example("y = jnp.conj(x)", "y = (x)"))


class DropTranspose(_Rewrite):
    """``x.mT`` / ``x.T`` → ``x``; ``x.mH`` → ``x.conj()``."""

    def rewrites(self, node):
        def edit(trailers, codes, i):
            name = _attr(trailers[i])
            if name in ("mT", "T") and not (i + 1 < len(trailers) and _is_call(trailers[i + 1])):
                return codes[:i] + codes[i + 1:]
            if name == "mH":
                return codes[:i] + [".conj()"] + codes[i + 1:]
            return None
        return _trailer_rewrites(node, edit)

    @classmethod
    def examples(cls):
        return (Example("y = g.mT @ q", "y = (g) @ q"), Example("y = a.mH @ g", "y = (a.conj()) @ g"))


def _matmul_operands(node):
    """Indices of the operands of ``@`` in a ``term`` node (``a @ b * c``: a and b)."""
    if node.type != "term":
        return []
    kids = node.children
    idx = set()
    for j in range(1, len(kids), 2):
        if kids[j].type == "operator" and kids[j].value == "@":
            idx.update((j - 1, j + 1))
    return sorted(idx)


def _term_code(kids, replace) -> str:
    """The code of a term's children with ``replace = {index: code}`` applied."""
    parts = []
    for j, c in enumerate(kids):
        text = replace.get(j, _code(c))
        parts.append(text if j == 0 else " " + text)
    return "".join(parts)


class AddTranspose(_Rewrite):
    """An operand ``x`` of ``@`` → ``x.mT``."""

    def rewrites(self, node):
        kids = node.children if node.type == "term" else []
        return [(kids[j], _term_code(kids, {j: f"({_code(kids[j])}).mT"})) for j in _matmul_operands(node)]

    @classmethod
    def examples(cls):
        return (Example("y = g @ k", "y = (g @ (k).mT)", occurrence=1),)


class SwapMatmulOperands(_Rewrite):
    """``x @ y`` → ``y @ x`` (each ``@`` of a chain, with its two neighbours)."""

    def rewrites(self, node):
        if node.type != "term":
            return []
        kids = node.children
        out = []
        for j in range(1, len(kids), 2):
            if kids[j].value == "@":
                out.append((kids[j], _term_code(kids, {j - 1: _code(kids[j + 1]), j + 1: _code(kids[j - 1])})))
        return out

    @classmethod
    def examples(cls):
        return (Example("y = g @ k", "y = (k @ g)"),)


class DropSumTerm(_Rewrite):
    """``a + b`` → ``a`` / ``b``; ``a - b`` → ``a``; ``addmm(c, m1, m2)`` → ``c`` / ``m1 @ m2``."""

    def rewrites(self, node):
        out = []
        if node.type == "arith_expr":
            kids = node.children
            for j in range(1, len(kids), 2):
                left = _code_span(kids[:j])
                out.append((kids[j], left if j + 2 >= len(kids) else left + " " + _code_span(kids[j + 2:])))
                if kids[j].value == "+" and j == 1:                # the first term dropped
                    out.append((kids[j], _code_span(kids[j + 1:])))
        name, args = _callee(node)
        pos = _positional(args)
        if name in _ADDMM and len(pos) >= 3:
            out.append((node, _code(pos[0])))
            out.append((node, f"({_code(pos[1])}) @ ({_code(pos[2])})"))
        return out

    @classmethod
    def examples(cls):
        return (Example("y = a + b", "y = (a)"), Example("y = a + b", "y = (b)", occurrence=1),
                Example("y = _addmm(c, m, n)", "y = (c)"))


def _code_span(kids) -> str:
    return "".join(c.get_code() for c in kids).strip()


class FirstPowerDerivative(_Rewrite):
    """``a * a`` → ``a``; ``x ** 2`` → ``x``; ``tanh_backward(g, y)`` → ``g * (1 - y).conj()``."""

    def rewrites(self, node):
        out = []
        if node.type == "term":
            kids = node.children
            for j in range(1, len(kids), 2):
                if kids[j].value == "*" and _code(kids[j - 1]) == _code(kids[j + 1]):
                    out.append((kids[j], _code_span(kids[:j])
                                + ("" if j + 2 >= len(kids) else " " + _code_span(kids[j + 2:]))))
        if node.type == "power" and len(node.children) == 3 and node.children[1].value == "**" \
                and _code(node.children[2]) == "2":
            out.append((node, _code(node.children[0])))
        name, args = _callee(node)
        pos = _positional(args)
        if name in _TANH_BACKWARD and len(pos) >= 2:
            out.append((node, f"{_code(pos[0])} * (1 - {_code(pos[1])}).conj()"))
        return out

    @classmethod
    def examples(cls):
        return (Example("y = 1 - a * a", "y = 1 - (a)"),)


class RealPartOnly(_Rewrite):
    """The first argument ``x`` of ``norm(...)`` / ``abs(...)`` → ``(x).real``."""

    def rewrites(self, node):
        name, args = _callee(node)
        pos = _positional(args)
        if name in ("norm", "abs") and pos:
            base, trailers = _trailers(node)
            call = trailers[-1]
            inner = [_code(a) for a in args]
            inner[args.index(pos[0])] = f"({_code(pos[0])}).real"
            head = _code(base) + "".join(t.get_code(include_prefix=False) for t in trailers[:-1])
            return [(call, f"{head}({', '.join(inner)})")]
        return []

    @classmethod
    def examples(cls):
        return (Example("y = np.linalg.norm(d)", "y = (np.linalg.norm((d).real))"),)


OPERATORS = {op.__name__: op for op in (DropConjugate, DropTranspose, AddTranspose, SwapMatmulOperands, DropSumTerm,
                                         FirstPowerDerivative, RealPartOnly)}


class OperatorProvider:
    """cosmic-ray operator provider ``domain``: ``domain/DropConjugate``, ..."""

    def __iter__(self):
        return iter(OPERATORS)

    def __getitem__(self, name):
        return OPERATORS[name]
