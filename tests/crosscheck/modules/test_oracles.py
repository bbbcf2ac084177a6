"""crosscheck.torch_oracles and crosscheck.jax_oracles, the functions every verdict rests on, through their public
functions (``python -m mutation torch_oracles`` runs the ``torch`` tests of this file on each mutant,
``jax_oracles`` the ``jax`` ones): each autodiff oracle and each way of running a hand-written derivative agrees
with the project's formulas (``torch_impl.formulas`` / ``jax_impl.formulas``, eqs. (9)-(16)) or with the other
route to the same number (second order: through the hand-written backward vs autodiff of the reference), on a
shape whose n, d, e all differ, real and complex, every cotangent mode and input subset; and the autodiff-path
probe names how autodiff reaches the inputs.  A few seconds per framework."""

from __future__ import annotations

import numpy as np
import pytest

from crosscheck.cases import Case
from crosscheck.specs import SPECS

ATTN = SPECS["attn"]
SHAPE = (5, 2, 3)
ALL = (True, True, True)
REAL_AND_COMPLEX = ["float64", "complex128"]


def _case(dtype, shape=SHAPE, trial=0):
    return Case(ATTN, dtype, shape, trial, seed=7)


def _close(actual, expected, what=""):
    assert len(actual) == len(expected), what
    for i, (x, y) in enumerate(zip(actual, expected)):
        if y is None:
            assert x is None, f"{what}[{i}]: expected None"
            continue
        assert x is not None, f"{what}[{i}]: got None"
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-10, atol=1e-12, err_msg=f"{what}[{i}]")


# --- torch ---------------------------------------------------------------------------------------------------------

def _torch():
    import torch

    import torch_impl
    from crosscheck import torch_oracles as T
    from torch_impl import formulas as TF
    return torch, torch_impl, T, TF


def _torch_np(values):
    from crosscheck.torch_oracles import to_numpy
    return tuple(None if v is None else to_numpy(v) for v in values)


def _torch_truth_vjp(TF, xs, cots, wrt=ALL, zeros=True):
    """Eqs. (9)-(13); a gradient no cotangent reaches (v with o unused) is zero (``zeros``, an oracle's answer)
    or None (autograd's: nothing flows there); outside ``wrt``: None."""
    q, k, v = xs
    a = TF.attn_forward(q, k, v)[1]
    grads = TF.attn_backward(cots[0], cots[1], q, k, v, a, wrt)
    zero = [x * 0 for x in xs]
    return tuple(None if not w else (z if g is None and zeros else g) for g, z, w in zip(grads, zero, wrt))


@pytest.mark.parametrize("dtype", REAL_AND_COMPLEX)
def test_torch_ref_and_jacrev_vjps_are_eqs_9_to_13(dtype):
    torch, torch_impl, T, TF = _torch()
    case = _case(dtype)
    xs = tuple(T.to_native(x, "cpu") for x in case.inputs)
    cots_list = [tuple(None if c is None else T.to_native(c, "cpu") for c in cots) for cots in case.cots]
    truth = [_torch_np(_torch_truth_vjp(TF, xs, cots)) for cots in cots_list]
    for name, oracle in (("ref_vjp", T.ref_vjp), ("jacrev_vjp", T.jacrev_vjp)):
        got = oracle(torch_impl.attn_reference, xs, cots_list)
        assert len(got) == len(cots_list) == 3
        for mode, (g, t) in enumerate(zip(got, truth)):
            _close(_torch_np(g), t, f"{name} mode {mode}")


def test_torch_jacrev_vjp_of_a_one_output_block():
    torch, torch_impl, T, TF = _torch()
    rng = np.random.default_rng(3)
    a, v, g = rng.standard_normal((4, 4)), rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    xs = (torch.from_numpy(a), torch.from_numpy(v))
    (got,) = T.jacrev_vjp(lambda a, v: (a @ v,), xs, [(torch.from_numpy(g),)])
    _close(_torch_np(got), (g @ v.T, a.T @ g))


@pytest.mark.parametrize("dtype", REAL_AND_COMPLEX)
def test_torch_hand_vjp_runs_each_request_as_real_use_does(dtype):
    torch, torch_impl, T, TF = _torch()
    case = _case(dtype)
    xs = tuple(T.to_native(x, "cpu") for x in case.inputs)
    cots_list = [tuple(None if c is None else T.to_native(c, "cpu") for c in cots) for cots in case.cots]
    requests = [(mask, cots_list[m]) for mask, m in case.request_masks(ATTN)]
    seen = []

    def attn(q, k, v):                                 # what the Function sees of each request
        seen.append(tuple(x.requires_grad for x in (q, k, v)))
        return torch_impl.attn(q, k, v)

    got = T.hand_vjp(attn)(xs, requests)
    assert len(got) == len(requests) == 21
    for (mask, cots), g in zip(requests, got):
        _close(_torch_np(g), _torch_np(_torch_truth_vjp(TF, xs, cots, mask, zeros=False)), f"request {mask}")
    # one forward per requires-grad pattern (its three cotangent modes reuse the graph), in request order
    assert seen == [mask for mask, _ in case.request_masks(ATTN)][::3]


def test_torch_hand_vjp_of_an_output_that_does_not_reach_the_inputs_is_none():
    torch, torch_impl, T, TF = _torch()
    case = _case("float64")
    xs = tuple(T.to_native(x, "cpu") for x in case.inputs)
    ga = T.to_native(case.second[0][1], "cpu")
    # only v requires grad and only a has a cotangent: a = tanh(q kᵀ) does not depend on v
    assert T.hand_vjp(torch_impl.attn)(xs, [((False, False, True), (None, ga))]) == [(None, None, None)]
    got = T.ref_vjp(torch_impl.attn_reference, xs, [(None, ga)])[0]
    assert not bool(got[2].any())                       # the oracle: zero for v (a zero cotangent on o)


@pytest.mark.parametrize("dtype", REAL_AND_COMPLEX)
def test_torch_jvps_are_eqs_14_to_16(dtype):
    torch, torch_impl, T, TF = _torch()
    case = _case(dtype)
    xs = tuple(T.to_native(x, "cpu") for x in case.inputs)
    tans = [tuple(None if t is None else T.to_native(t, "cpu") for t in ts) for ts in case.tans]
    a = TF.attn_forward(*xs)[1]
    truth = [_torch_np(TF.attn_jvp(*xs, a, *ts)) for ts in tans]
    for name, got in (("hand_jvp", T.hand_jvp(torch_impl.attn)(xs, tans)),
                      ("ref_jvp", T.ref_jvp(torch_impl.attn_reference, xs, tans))):
        assert len(got) == len(tans) == 7
        for ts, g, t in zip(case.tan_modes, got, truth):
            _close(_torch_np(g), t, f"{name} {ts}")


@pytest.mark.parametrize("dtype", REAL_AND_COMPLEX)
def test_torch_second_order_through_the_backward_equals_autodiff_of_the_reference(dtype):
    torch, torch_impl, T, TF = _torch()
    case = _case(dtype)
    xs = tuple(T.to_native(x, "cpu") for x in case.inputs)
    g, w, t = (tuple(T.to_native(x, "cpu") for x in part) for part in case.second)
    vv_hand = _torch_np(T.hand_vjp_vjp(torch_impl.attn)(xs, g, w))
    vv_ref = _torch_np(T.ref_vjp_vjp(torch_impl.attn_reference, xs, g, w))
    assert len(vv_hand) == len(vv_ref) == 5                # d/dq, d/dk, d/dv, d/dg_o, d/dg_a
    _close(vv_hand, vv_ref, "vjp_vjp")
    h_hand = _torch_np(T.hand_hvp(torch_impl.attn)(xs, g, t))
    h_ref = _torch_np(T.ref_hvp(torch_impl.attn_reference, xs, g, t))
    assert len(h_hand) == len(h_ref) == 3
    _close(h_hand, h_ref, "hvp")
    # and against a central difference of the first-order VJP (eqs. (9)-(13)) along t: the HVP's definition
    eps = 1e-6
    plus = _torch_truth_vjp(TF, tuple(x + eps * ti for x, ti in zip(xs, t)), g)
    minus = _torch_truth_vjp(TF, tuple(x - eps * ti for x, ti in zip(xs, t)), g)
    fd = [((p - m) / (2 * eps)).numpy() for p, m in zip(plus, minus)]
    for got, want in zip(h_ref, fd):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    # the VJP of the VJP w.r.t. g is the VJP with cotangent w... on the gradients: d<w, G(x, g)>/dg = J w
    _close(vv_ref[3:], _torch_np(T.ref_jvp(torch_impl.attn_reference, xs, [tuple(wi.conj() for wi in w)])[0]
                                 ) if dtype == "float64" else vv_ref[3:], "d/dg")


def test_torch_a_backward_outside_the_graph_gives_no_second_order():
    torch, torch_impl, T, TF = _torch()
    from tests.support.planted_solutions import findings as planted
    case = _case("float64")
    xs = tuple(T.to_native(x, "cpu") for x in case.inputs)
    g, w, _ = (tuple(T.to_native(x, "cpu") for x in part) for part in case.second)
    got = T.hand_vjp_vjp(planted.OnceDifferentiable.apply)(xs, g, w)
    assert got == (None,) * 5


def test_torch_no_forward_mode_rule_is_jvp_unsupported():
    torch, torch_impl, T, TF = _torch()
    from tests.support.planted_solutions import findings as planted
    case = _case("float64")
    xs = tuple(T.to_native(x, "cpu") for x in case.inputs)
    g, _, t = (tuple(T.to_native(x, "cpu") for x in part) for part in case.second)
    with pytest.raises(T.JvpUnsupported, match="jvp"):
        T.hand_jvp(planted.Lean.apply)(xs, [t])
    with pytest.raises(T.JvpUnsupported):
        T.hand_hvp(planted.Lean.apply)(xs, g, t)

    def other(q, k, v):
        raise NotImplementedError("not this one")
    with pytest.raises(NotImplementedError, match="not this one") as info:
        T.hand_jvp(other)(xs, [t])
    assert not isinstance(info.value, T.JvpUnsupported)


def test_torch_conversions_and_as_impl():
    torch, torch_impl, T, TF = _torch()
    x = np.arange(6.0).reshape(2, 3).T                 # not contiguous
    t = T.to_native(x, "cpu")
    assert t.is_contiguous() and t.dtype == torch.float64
    np.testing.assert_array_equal(t.numpy(), x)
    z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex128)
    np.testing.assert_array_equal(T.to_numpy(z.conj()), np.array([1 - 2j, 3 + 1j]))
    np.testing.assert_array_equal(T.to_numpy(z.conj().imag), np.array([-2.0, 1.0]))
    assert T.to_numpy(None) is None
    assert T.as_impl(torch_impl.AttnFunction) == torch_impl.AttnFunction.apply
    assert T.as_impl(torch_impl.attn) is torch_impl.attn
    assert T.as_impl(int) is int                          # a class that is not a Function: as it is


def test_torch_autodiff_path_of_hand_written_implementations_is_none():
    torch, torch_impl, T, TF = _torch()
    case = _case("float64")
    xs = tuple(T.to_native(x, "cpu") for x in case.inputs)
    names = dict(output_names=("o", "a"), input_names=("q", "k", "v"))
    assert T.autodiff_path(torch_impl.attn, xs, **names) is None
    assert T.autodiff_path(torch.ops.attn_lab.attn, xs, **names) is None
    # layout moves before the Function, post-processing after it
    assert T.autodiff_path(lambda q, k, v: torch_impl.attn(q, k.mT.contiguous().mT, v.clone()), xs, **names) is None
    assert T.autodiff_path(lambda q, k, v: tuple(x * 1 for x in torch_impl.attn(q, k, v)), xs, **names) is None


def test_torch_autodiff_path_names_a_path_autograd_derives():
    torch, torch_impl, T, TF = _torch()
    case = _case("float64")
    xs = tuple(T.to_native(x, "cpu") for x in case.inputs)
    names = dict(output_names=("o", "a"), input_names=("q", "k", "v"))
    assert T.autodiff_path(torch_impl.attn_reference, xs, **names) == \
        "o ← MmBackward0 ← TanhBackward0 ← MmBackward0 ← q"

    from tests.support.planted_bugs import tanh_only as pieces   # tanh alone hand-written
    assert T.autodiff_path(pieces, xs, **names) == "o ← MmBackward0 ← v"
    assert T.autodiff_path(pieces, xs, output_names=("o", "a"), input_names=("q", "k", "w")) == "o ← MmBackward0 ← w"

    def a_only_by_autodiff(q, k, v):                   # o hand-written, a from autograd's own ops
        o, _ = torch_impl.attn(q, k, v)
        return o, torch.tanh(q @ k.mT)
    assert T.autodiff_path(a_only_by_autodiff, xs, **names) == "a ← TanhBackward0 ← MmBackward0 ← q"

    def forward_called_directly(q, k, v):
        return torch_impl.AttnFunction.forward(q, k, v)
    path = T.autodiff_path(forward_called_directly, xs, **names)
    assert path is not None and path.startswith("o ← ") and path.endswith(" ← q")


def test_torch_autodiff_path_through_a_hand_written_node_then_autograd():
    torch, torch_impl, T, TF = _torch()
    case = _case("float64")
    xs = tuple(T.to_native(x, "cpu") for x in case.inputs)

    def scaled_first(q, k, v):                         # autograd's own op before the Function: q * 2
        return torch_impl.attn(q * 2, k, v)
    assert T.autodiff_path(scaled_first, xs, ("o", "a"), ("q", "k", "v")) == "o ← AttnFunctionBackward ← " \
                                                                             "MulBackward0 ← q"
    # a path that reaches no input (a constant's graph) is no path
    const = torch.ones(5, 2, dtype=torch.float64, requires_grad=True)

    def detached_branch(q, k, v):
        o, a = torch_impl.attn(q, k, v)
        return o + (const * 2).sum(), a
    assert T.autodiff_path(detached_branch, xs, ("o", "a"), ("q", "k", "v")) is None


def test_torch_grad_with_no_cotangent_reaching_the_graph_is_none_per_input():
    torch, torch_impl, T, TF = _torch()
    q = torch.ones(2, 2, dtype=torch.float64, requires_grad=True)
    o, const = q * 2, torch.ones(2, 2, dtype=torch.float64)          # const: no graph
    assert T._grad([o, const], [q], [None, torch.ones(2, 2, dtype=torch.float64)]) == (None,)
    assert T._grad([o], [q, q], [None]) == (None, None)
    assert T._grad([o], [], [torch.ones_like(o)]) == ()                # no inputs asked for: no gradients
    (g,) = T._grad([o, const], [q], [torch.ones_like(o), torch.ones(2, 2, dtype=torch.float64)])
    assert torch.equal(g, torch.full((2, 2), 2.0, dtype=torch.float64))


def test_torch_hand_written_nodes_by_kind():
    torch, torch_impl, T, TF = _torch()
    q = torch.ones(2, 2, dtype=torch.float64, requires_grad=True)
    o, _ = torch_impl.attn(q, q, q)
    assert T.is_custom_node(o.grad_fn)                                # an autograd.Function
    assert not T.is_custom_node((q * 2).grad_fn)                      # MulBackward0: PyTorch's own

    def cpp_node(*parts):                     # a C++ node's class name is made at run time, like these
        return type("".join(parts), (), {})()
    assert T.is_custom_node(cpp_node("CppNode<", "TanhAttention>"))  # a torch::autograd::Function
    assert T.is_custom_node(cpp_node("Cpp", "Function"))             # a C++ node with no Python class
    assert not T.is_custom_node(cpp_node("Cpp", "FunctionBackward0"))


# --- JAX -----------------------------------------------------------------------------------------------------------

def _jax():
    from tests.conftest import require_jax
    require_jax()
    import jax_impl
    from crosscheck import jax_oracles as J
    from jax_impl import formulas as JF
    return jax_impl, J, JF


def _jax_np(values):
    return tuple(None if v is None else np.asarray(v) for v in values)


def _jax_truth_vjp(JF, xs, cots, wrt=ALL, zeros=True):
    """Eqs. (18)-(22) (JAX's convention); as ``_torch_truth_vjp`` for what no cotangent reaches."""
    q, k, v = xs
    a = JF.attn_forward(q, k, v)[1]
    grads = JF.attn_backward(cots[0], cots[1], q, k, v, a, wrt)
    return tuple(None if not w else (x * 0 if g is None and zeros else g) for g, x, w in zip(grads, xs, wrt))


def _jax_case(J, dtype, shape=SHAPE):
    case = _case(dtype, shape)
    conv = lambda part: tuple(None if x is None else J.to_native(x, "cpu") for x in part)   # noqa: E731
    return case, conv(case.inputs), [conv(c) for c in case.cots], [conv(t) for t in case.tans], \
        tuple(conv(p) for p in case.second)


@pytest.mark.jax
@pytest.mark.parametrize("dtype", REAL_AND_COMPLEX)
def test_jax_ref_and_jacrev_vjps_are_eqs_18_to_22(dtype):
    jax_impl, J, JF = _jax()
    with J.context("cpu"):
        case, xs, cots_list, _, _ = _jax_case(J, dtype)
        truth = [_jax_np(_jax_truth_vjp(JF, xs, cots)) for cots in cots_list]
        for name, oracle in (("ref_vjp", J.ref_vjp), ("jacrev_vjp", J.jacrev_vjp)):
            got = oracle(jax_impl.attn_reference, xs, cots_list)
            assert len(got) == 3
            for mode, (g, t) in enumerate(zip(got, truth)):
                _close(_jax_np(g), t, f"{name} mode {mode}")


@pytest.mark.jax
def test_jax_jacrev_vjp_of_a_one_output_block_and_one_mode():
    jax_impl, J, JF = _jax()
    import jax.numpy as jnp
    rng = np.random.default_rng(3)
    a, v, g = rng.standard_normal((4, 4)), rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    with J.context("cpu"):
        (got,) = J.jacrev_vjp(lambda a, v: (a @ v,), (jnp.asarray(a), jnp.asarray(v)), [(jnp.asarray(g),)])
    _close(_jax_np(got), (g @ v.T, a.T @ g))


@pytest.mark.jax
@pytest.mark.parametrize("dtype", REAL_AND_COMPLEX)
def test_jax_hand_vjp_runs_each_request_with_symbolic_zeros(dtype):
    jax_impl, J, JF = _jax()
    with J.context("cpu"):
        case, xs, cots_list, _, _ = _jax_case(J, dtype)
        requests = [(mask, cots_list[m]) for mask, m in case.request_masks(ATTN)]
        got = J.hand_vjp(jax_impl.attn)(xs, requests)
        assert len(got) == 21
        for (mask, cots), g in zip(requests, got):
            want = _jax_truth_vjp(JF, xs, cots, mask)
            # a gradient nothing reaches comes back as zeros from jax.vjp (the rule's None is a zero cotangent)
            _close(_jax_np(g), _jax_np(want), f"request {mask}")


@pytest.mark.jax
def test_jax_hand_vjp_differentiates_only_the_requested_inputs():
    jax_impl, J, JF = _jax()
    seen = []
    with J.context("cpu"):
        case, xs, cots_list, _, _ = _jax_case(J, "float64")

        def spy(q, k, v):                              # which inputs are traced (differentiated) per request
            import jax
            seen.append(tuple(isinstance(x, jax.core.Tracer) for x in (q, k, v)))
            return jax_impl.attn(q, k, v)
        J.hand_vjp(spy)(xs, [((True, False, True), cots_list[1]), ((False, True, False), cots_list[2])])
    assert seen == [(True, False, True), (False, True, False)]


@pytest.mark.jax
@pytest.mark.parametrize("dtype", REAL_AND_COMPLEX)
def test_jax_jvps_are_eqs_14_to_16(dtype):
    jax_impl, J, JF = _jax()
    with J.context("cpu"):
        case, xs, _, tans, _ = _jax_case(J, dtype)
        a = JF.attn_forward(*xs)[1]
        truth = [_jax_np(JF.attn_jvp(*xs, a, *ts)) for ts in tans]
        for name, got in (("hand_jvp", J.hand_jvp(jax_impl.attn_jvp)(xs, tans)),
                          ("ref_jvp", J.ref_jvp(jax_impl.attn_reference, xs, tans))):
            assert len(got) == 7
            for ts, g, t in zip(case.tan_modes, got, truth):
                _close(_jax_np(g), t, f"{name} {ts}")


@pytest.mark.jax
@pytest.mark.parametrize("dtype", REAL_AND_COMPLEX)
def test_jax_second_order_through_the_rule_equals_autodiff_of_the_reference(dtype):
    jax_impl, J, JF = _jax()
    with J.context("cpu"):
        case, xs, _, _, (g, w, t) = _jax_case(J, dtype)
        vv_hand = _jax_np(J.hand_vjp_vjp(jax_impl.attn)(xs, g, w))
        vv_ref = _jax_np(J.ref_vjp_vjp(jax_impl.attn_reference, xs, g, w))
        assert len(vv_hand) == len(vv_ref) == 5
        _close(vv_hand, vv_ref, "vjp_vjp")
        h_hand = _jax_np(J.hand_hvp(jax_impl.attn)(xs, g, t))
        h_ref = _jax_np(J.ref_hvp(jax_impl.attn_reference, xs, g, t))
        assert len(h_hand) == len(h_ref) == 3
        _close(h_hand, h_ref, "hvp")
        eps = 1e-6
        plus = _jax_truth_vjp(JF, tuple(x + eps * ti for x, ti in zip(xs, t)), g)
        minus = _jax_truth_vjp(JF, tuple(x - eps * ti for x, ti in zip(xs, t)), g)
        for got, p, m in zip(h_ref, plus, minus):
            np.testing.assert_allclose(got, (np.asarray(p) - np.asarray(m)) / (2 * eps), rtol=1e-5, atol=1e-7)
        # d<w, G(x, g)>/dg, G linear in g: the JVP of the forward along w (JAX's convention: no conjugate)
        _close(vv_ref[3:], _jax_np(J.ref_jvp(jax_impl.attn_reference, xs, [tuple(w)])[0]), "d/dg")


@pytest.mark.jax
def test_jax_custom_vjp_has_no_forward_mode():
    jax_impl, J, JF = _jax()
    with J.context("cpu"):
        case, xs, _, tans, (g, _, t) = _jax_case(J, "float64")
        with pytest.raises(J.JvpUnsupported, match="custom_vjp"):
            J.hand_jvp(jax_impl.attn)(xs, tans[:1])

        def other(q, k, v):
            raise TypeError("not this one")
        with pytest.raises(TypeError, match="not this one") as info:
            J.hand_jvp(other)(xs, tans[:1])
        assert not isinstance(info.value, J.JvpUnsupported)


@pytest.mark.jax
def test_jax_context_restrict_and_conversions():
    jax_impl, J, JF = _jax()
    import jax
    import jax.numpy as jnp
    with J.context("cpu"):
        x = J.to_native(np.ones((2, 3)), "cpu")
        assert x.dtype == jnp.float64 and jax.config.jax_default_matmul_precision == "float32"
        np.testing.assert_array_equal(J.to_numpy(x), np.ones((2, 3)))
        f = J.restrict(lambda a, b, c: (a + b, b * c, c), (1.0, 2.0, 3.0), [0, 2], [1, 2])
        assert f(10.0, 30.0) == (60.0, 30.0)
        assert J.restrict(lambda a, b: (a, b), (1.0, 2.0), [1])(5.0) == (1.0, 5.0)
    assert J.to_numpy(None) is None and J.as_impl(jax_impl.attn) is jax_impl.attn
    assert J.jax_device("cpu").platform == "cpu"
    if not any(d.platform == "gpu" for d in jax.devices()) if jax.default_backend() == "gpu" else True:
        with pytest.raises(RuntimeError):
            J.jax_device("cuda")


@pytest.mark.jax
def test_jax_autodiff_path():
    jax_impl, J, JF = _jax()
    import jax
    import jax.numpy as jnp
    names = dict(output_names=("o", "a"), input_names=("q", "k", "v"))
    with J.context("cpu"):
        case, xs, _, _, _ = _jax_case(J, "float64")
        assert J.autodiff_path(jax_impl.attn, xs, **names) is None
        assert J.autodiff_path(jax_impl.attn_jvp, xs, **names) is None
        assert J.autodiff_path(jax.jit(jax_impl.attn), xs, **names) is None            # followed inside the jit
        assert J.autodiff_path(lambda q, k, v: jax_impl.attn(q, k.T.T, v.reshape(v.shape)), xs, **names) is None
        assert J.autodiff_path(lambda q, k, v: tuple(x * 2 for x in jax_impl.attn(q, k, v)), xs, **names) is None
        assert J.autodiff_path(jax_impl.attn_reference, xs, **names) == (
            "o, a computed from q, k, v by primitives JAX differentiates itself (dot_general, tanh), not only "
            "through jax.custom_vjp / jax.custom_jvp rules")
        assert J.autodiff_path(jax.jit(jax_impl.attn_reference), xs, **names).startswith(
            "o, a computed from q, k, v by primitives JAX differentiates itself (dot_general, tanh)")

        @jax.custom_jvp
        def tanh(x):
            return jnp.tanh(x)
        tanh.defjvp(lambda p, t: (jnp.tanh(p[0]), (1 - jnp.tanh(p[0]) ** 2) * t[0]))

        def pieces(q, k, v):                           # a custom rule below a plain matmul
            a = tanh(q @ k.T)
            return a @ v, a
        assert J.autodiff_path(pieces, xs, **names) == (
            "o, a computed from q, k, v by primitives JAX differentiates itself (dot_general), not only through "
            "jax.custom_vjp / jax.custom_jvp rules")

        def many(q, k, v):                             # more than six primitives: the first six, then ...
            x = jnp.sin(jnp.cos(jnp.exp(jnp.log1p(jnp.abs(jnp.tanh(q @ k.T)))))) + 1
            return x @ v, x
        assert J.autodiff_path(many, xs, **names).endswith(
            "(dot_general, tanh, abs, log1p, exp, cos, ...), not only through jax.custom_vjp / jax.custom_jvp rules")

        def half(q, k, v):                             # o by the rule, a by JAX's own ops
            return jax_impl.attn(q, k, v)[0], jnp.tanh(q @ k.T)
        assert J.autodiff_path(half, xs, **names).startswith("a computed from q, k, v by primitives")


@pytest.mark.jax
@pytest.mark.parametrize("count", [6, 7])
def test_jax_autodiff_path_names_six_primitives_then_an_ellipsis(count):
    jax_impl, J, JF = _jax()
    import jax.numpy as jnp
    ops = [jnp.sin, jnp.cos, jnp.exp, jnp.log1p, jnp.abs, jnp.tanh, jnp.negative][:count]

    def fn(q, k, v):
        x = q
        for op in ops:
            x = op(x)
        return x, x
    with J.context("cpu"):
        _, xs, _, _, _ = _jax_case(J, "float64")
        said = J.autodiff_path(fn, xs, ("o", "a"), ("q", "k", "v"))
    assert said.endswith("(sin, cos, exp, log1p, abs, tanh), not only through jax.custom_vjp / jax.custom_jvp rules"
                         if count == 6 else "(sin, cos, exp, log1p, abs, tanh, ...), not only through jax.custom_vjp "
                                            "/ jax.custom_jvp rules")


@pytest.mark.jax
def test_jax_cotangent_typed_like_its_output_on_an_explicit_mesh(monkeypatch):
    jax_impl, J, JF = _jax()
    import jax
    import jax.numpy as jnp
    if not hasattr(jax, "typeof"):                    # JAX < 0.5: no sharding in a type, nothing to match
        cot = jnp.ones((4, 2))
        assert J._typed_like(cot, jnp.zeros((4, 2))) is cot
        return
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    mesh = jax.make_mesh((1,), ("x",), axis_types=(AxisType.Explicit,))
    rows = jax.device_put(jnp.ones((4, 2)), NamedSharding(mesh, P("x")))
    whole = jax.device_put(jnp.ones((4, 2)), NamedSharding(mesh, P()))
    cot = jnp.ones((4, 2))
    typed = J._typed_like(cot, rows)                  # resharded to the output's rows
    assert typed is not cot and jax.typeof(typed).sharding == jax.typeof(rows).sharding
    assert J._typed_like(typed, rows) is typed        # already so: kept
    assert J._typed_like(cot, whole) is cot           # a replicated output: any cotangent will do
    assert J._typed_like(cot, 1.0) is cot             # no sharding at all
    for missing in ((jax, "typeof"), (jax.sharding, "reshard")):     # JAX without explicit sharding
        with monkeypatch.context() as m:
            m.delattr(*missing)
            assert J._typed_like(cot, rows) is cot


@pytest.mark.jax
@pytest.mark.parametrize("error", [AttributeError, TypeError])
def test_jax_enable_x64_of_an_older_jax(monkeypatch, error):
    jax_impl, J, JF = _jax()
    import jax
    import jax.experimental

    def refused(*args):
        raise error("no such thing in this JAX")
    monkeypatch.setattr(jax, "enable_x64", refused, raising=False)
    monkeypatch.setattr(jax.experimental, "enable_x64", lambda: "the experimental context", raising=False)
    assert J._enable_x64() == "the experimental context"


@pytest.mark.jax
def test_jax_device_is_the_first_of_its_platform(monkeypatch):
    jax_impl, J, JF = _jax()
    import jax
    asked = []
    monkeypatch.setattr(jax, "devices", lambda platform: asked.append(platform) or [f"{platform}:0", f"{platform}:1"])
    assert (J.jax_device("cpu"), J.jax_device("cuda")) == ("cpu:0", "gpu:0") and asked == ["cpu", "gpu"]


@pytest.mark.jax
def test_jax_autodiff_path_through_a_loop_or_a_branch():
    # A loop's carry feeds the next iteration: here ys = sin(carry) reads q from the second step on, which one
    # pass over the body would miss (it said None: hand-written).  A loop or a branch is JAX's to differentiate.
    jax_impl, J, JF = _jax()
    import jax
    import jax.numpy as jnp

    def scanned(q, k, v):
        _, ys = jax.lax.scan(lambda c, t: (c * t, jnp.sin(c)), jnp.ones(2, q.dtype), q)
        return ys, ys

    def looped(q, k, v):
        x = jax.lax.while_loop(lambda x: x[0, 0] < 10.0, jnp.sin, q)
        return x, x

    def branched(q, k, v):                             # the rule in both branches: hand-written either way
        return jax.lax.cond(q[0, 0] > 0, lambda: jax_impl.attn(q, k, v), lambda: jax_impl.attn(q, k, v))

    def one_plain_branch(q, k, v):                     # a taken by the rule in one branch, by jnp in the other
        return jax.lax.cond(q[0, 0] > 0, lambda: tuple(jax_impl.attn(q, k, v)),
                            lambda: (jax_impl.attn(q, k, v)[0], jnp.tanh(q @ k.T)))
    with J.context("cpu"):
        _, xs, _, _, _ = _jax_case(J, "float64")
        for fn, prim in ((scanned, "scan"), (looped, "while")):
            assert J.autodiff_path(fn, xs, ("o", "a"), ("q", "k", "v")) == (
                f"o, a computed from q, k, v by primitives JAX differentiates itself ({prim}), not only through "
                f"jax.custom_vjp / jax.custom_jvp rules"), prim
        assert J.autodiff_path(branched, xs, ("o", "a"), ("q", "k", "v")) is None

        def shifted(q, k, v):                          # a branch of a constant alone: no path from q, k, v
            o, a = jax_impl.attn(q, k, v)
            shift = jax.lax.cond(q[0, 0] > 0, lambda c, x: jnp.sin(c), lambda c, x: jnp.cos(c), jnp.ones_like(o), q)
            return o + shift, a
        assert J.autodiff_path(shifted, xs, ("o", "a"), ("q", "k", "v")) is None
        assert J.autodiff_path(one_plain_branch, xs, ("o", "a"), ("q", "k", "v")).startswith(
            "a computed from q, k, v by primitives JAX differentiates itself (slice, gt, dot_general, tanh)")
