"""crosscheck.jaxpr, the one walker over JAX programs (``python -m mutation jaxpr`` runs this file first): which
equations are computed, returned or dead, across calls (``jit``, ``remat``, custom rules), loops and branches, on
jaxprs traced here from small functions.  A second or so."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.jax


def _uses(fn, *shapes):
    """[(primitive, use)] of every equation ``equations`` walks, nested ones after their equation."""
    import jax
    import numpy as np
    from crosscheck.jaxpr import equations
    jaxpr = jax.make_jaxpr(fn)(*(np.ones(s, np.float32) for s in shapes)).jaxpr
    return [("jit" if eqn.primitive.name == "pjit" else eqn.primitive.name, use)     # pjit: JAX < 0.7's name
            for _, eqn, use in equations(jaxpr)]


def test_computed_returned_dead_at_top_level():
    import jax.numpy as jnp

    def f(x):
        jnp.cos(x)                                    # nothing reads it
        return jnp.sin(x) + 1, x * 3
    assert _uses(f, (2,)) == [("cos", "dead"), ("sin", "computed"), ("add", "returned"), ("mul", "returned")]


def test_a_jit_output_its_caller_drops_is_dead_inside_and_its_inputs_unread():
    import jax
    import jax.numpy as jnp

    def f(x, y):
        y2 = jnp.cos(y)                               # only the dropped output of the call reads it
        return jax.jit(lambda a, b: (a * 2, b * 3))(x, y2)[0]
    assert _uses(f, (2,), (2,)) == [("cos", "dead"), ("jit", "returned"), ("mul", "returned"), ("mul", "dead")]


def test_a_jit_output_its_caller_reads_is_computed_inside():
    import jax
    import jax.numpy as jnp
    assert _uses(lambda x: jax.jit(lambda a: a * 2)(jnp.sin(x)) + 1, (2,)) == [
        ("sin", "computed"), ("jit", "computed"), ("mul", "computed"), ("add", "returned")]


def test_a_call_input_passed_straight_out_is_read_when_that_output_is_needed():
    import jax
    import jax.numpy as jnp

    def f(x, y):
        return jax.jit(lambda a, b: (a, b * 2))(jnp.sin(x), jnp.cos(y))[0]
    uses = dict(_uses(f, (2,), (2,)))                 # (JAX < 0.5 forwards a straight-out input past the jit)
    assert uses["sin"] in ("computed", "returned") and (uses["cos"], uses["mul"]) == ("dead", "dead")


def test_remat_is_a_call_too():
    import jax
    import jax.numpy as jnp

    def f(x):
        return jax.checkpoint(lambda a: (jnp.sin(a), jnp.cos(a)))(x)[1]
    uses = _uses(f, (2,))
    assert uses[0][0].startswith(("remat", "checkpoint")) and uses[1:] == [("sin", "dead"), ("cos", "returned")]


def test_a_loop_body_keeps_a_carry_its_caller_drops():
    import jax
    import jax.numpy as jnp

    def f(xs):                                        # the final carry is dropped; each step's ys reads the carry
        _, ys = jax.lax.scan(lambda c, t: (jnp.sin(c) + t, c * t), 0.0, xs)
        return ys
    assert [u for u in _uses(f, (3,)) if u[0] != "convert_element_type"] == [
        ("scan", "returned"), ("sin", "computed"), ("add", "returned"), ("mul", "returned")]


def test_an_equation_is_as_live_as_its_most_used_result():
    import jax

    def f(x):
        _, second = jax.lax.sort((x, -x), num_keys=1)  # one sort, two results: the first dropped
        return second * 2
    assert _uses(f, (4,)) == [("neg", "computed"), ("sort", "computed"), ("mul", "returned")]


def test_branches_are_walked_and_everything_under_a_dead_equation_is_dead():
    import jax
    import jax.numpy as jnp

    def f(x):
        dead = jax.lax.cond(x[0] > 0, jnp.sin, jnp.cos, x)           # nothing reads it
        del dead
        return jax.lax.cond(x[0] > 0, lambda a: a + 1, lambda a: a - 1, x)
    uses = [u for u in _uses(f, (2,)) if u[0] in ("cond", "sin", "cos", "add", "sub")]
    assert uses == [("cond", "dead"), ("cos", "dead"), ("sin", "dead"),
                    ("cond", "returned"), ("sub", "returned"), ("add", "returned")]


def test_sub_jaxprs_of_a_parameter():
    import jax
    import jax.numpy as jnp
    from crosscheck.jaxpr import sub_jaxprs
    closed = jax.make_jaxpr(jnp.sin)(1.0)
    inner = closed.jaxpr

    def found(value):                                 # the jaxpr itself, or the ClosedJaxpr standing for it
        return [j.eqns[0] is inner.eqns[0] for j in sub_jaxprs(value)]
    assert found(closed) == [True] and found(inner) == [True]              # a ClosedJaxpr, a Jaxpr
    assert found((closed, [inner])) == [True, True]                         # a cond's branches: a tuple of them
    assert found("jaxpr") == [] and found(3) == [] and found(()) == []


def _fake_eqn(name, *bodies, ins=2, outs=1):
    from types import SimpleNamespace
    return SimpleNamespace(primitive=SimpleNamespace(name=name), invars=[object()] * ins, outvars=[object()] * outs,
                           params={f"jaxpr{i}": body for i, body in enumerate(bodies)})


def _fake_body(ins=2, outs=1):
    from types import SimpleNamespace
    return SimpleNamespace(eqns=[], invars=[object()] * ins, outvars=[object()] * outs)


def test_a_call_body_is_one_jaxpr_matching_its_equation_one_for_one():
    from crosscheck.jaxpr import call_body
    body = _fake_body()
    assert call_body(_fake_eqn("jit", body)) is body
    assert call_body(_fake_eqn("scan", body)) is None                     # not a call
    assert call_body(_fake_eqn("jit")) is None                            # no body
    assert call_body(_fake_eqn("jit", body, _fake_body())) is None        # two
    for other in (_fake_body(ins=1), _fake_body(ins=3), _fake_body(outs=0), _fake_body(outs=2)):
        assert call_body(_fake_eqn("jit", other)) is None                 # inputs or outputs not one for one


def test_sub_jaxprs_needs_both_marks_of_a_jaxpr():
    from types import SimpleNamespace
    from crosscheck.jaxpr import sub_jaxprs
    for half in (SimpleNamespace(eqns=[]), SimpleNamespace(invars=[]), SimpleNamespace(jaxpr=_fake_body()),
                 SimpleNamespace(consts=[])):
        assert list(sub_jaxprs(half)) == []
