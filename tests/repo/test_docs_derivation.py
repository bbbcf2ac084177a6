"""derivation.md's checkable claims, computed with the project's public functions (its section 14 lists them).

The worked numbers of sections 9 and 12 are read from derivation.md itself, so the text and the code cannot drift
apart; the identities (9)-(13), (14)-(16), (17), (18)-(22) and (23)-(27) are checked on random complex128 inputs
(real dtypes are the special case without conjugates); the temporaries of section 10 are counted with a
``TorchDispatchMode``.  The JAX checks skip where JAX is not installed.
"""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest
import torch
from torch.testing import assert_close
from torch.utils._python_dispatch import TorchDispatchMode

import torch_impl
from torch_impl import formulas, performance

from tests.conftest import require_jax

DERIVATION = (pathlib.Path(__file__).resolve().parents[2] / "derivation.md").read_text(encoding="utf-8")


def _section(title_start: str) -> str:
    start = DERIVATION.index(f"\n## {title_start}")
    end = DERIVATION.find("\n## ", start + 1)
    return DERIVATION[start:end if end != -1 else len(DERIVATION)]


def _agrees(value: float, shown: str) -> bool:
    """``value`` shown to the digits of ``shown``: rounded, or cut off where the text ends in '…'."""
    digits = shown.rstrip("…").replace("−", "-")
    places = len(digits.split(".")[1])
    if shown.endswith("…"):
        full = f"{value:.15f}"
        return full[:full.index(".") + 1 + places] == digits
    return f"{value:.{places}f}" == digits


# --------------------------------------------------------------------------- sections 9 and 12: the numbers
def _scalar_derivatives_torch():
    """Everything section 12 (and the scalar check of section 9) computes, at q = 0.5, k = 2, v = 3."""
    q, k, v = (torch.tensor([[x]], dtype=torch.float64, requires_grad=True) for x in (0.5, 2.0, 3.0))
    o, a = torch_impl.attn(q, k, v)
    d_o = torch.autograd.grad(o.sum(), (q, k, v), create_graph=True)
    d_both = torch.autograd.grad(o.sum() + a.sum(), (q, k, v), retain_graph=True)
    d2_o_dq2 = torch.autograd.grad(d_o[0].sum(), q)[0]
    a_, o_ = a.item(), o.item()
    return {
        "a": a_, "1 − a²": 1 - a_ ** 2, "o": o_,
        "∂o/∂q": d_o[0].item(), "∂o/∂k": d_o[1].item(), "∂o/∂v": d_o[2].item(),
        "g_x (o)": 3 * (1 - a_ ** 2),
        "g_q (o + a)": d_both[0].item(), "g_k (o + a)": d_both[1].item(), "g_v (o + a)": d_both[2].item(),
        "g_x (o + a)": 4 * (1 - a_ ** 2),
        "∂²o/∂q²": d2_o_dq2.item(),
    }


# Where each number stands in section 12, as the text shows it.
SECTION_12 = {
    "a": "a = tanh 1 = 0.7615941559…", "1 − a²": "1 − a² = 0.4199743416…", "o": "o = a v = 2.2847824678…",
    "∂o/∂q": "**2.5198460497**", "∂o/∂k": "**0.6299615124**", "∂o/∂v": "**0.7615941560**",
    "g_x (o)": "g_x = 3 · 0.41997434 = 1.25992302",
    "g_q (o + a)": "**3.3597947329**", "g_k (o + a)": "**0.8399486832**", "g_v (o + a)": "g_v = a = 0.7615941560",
    "g_x (o + a)": "g_x = 4(1 − a²) = 1.67989737",
    "∂²o/∂q²": "**−7.6764001014**",
}


def _number(snippet: str) -> str:
    return re.findall(r"−?\d+\.\d+…?", snippet)[-1]


def test_section_12_numbers_are_what_torch_impl_computes():
    text = _section("12.")
    got = _scalar_derivatives_torch()
    for name, snippet in SECTION_12.items():
        assert snippet in text, f"section 12 no longer says {snippet!r}"
        assert _agrees(got[name], _number(snippet)), (name, got[name], snippet)


def test_section_9_scalar_second_derivative():
    text = _section("9.")
    [shown] = re.findall(r"this\s+is (−\d+\.\d+…)", text)
    assert _agrees(_scalar_derivatives_torch()["∂²o/∂q²"], shown)


@pytest.fixture
def x64():
    jax = require_jax()
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield jax
    jax.config.update("jax_enable_x64", previous)


def test_section_12_numbers_in_jax(x64):
    jax, jnp = x64, require_jax("jax.numpy")
    import jax_impl
    q, k, v = (jnp.array([[x]], dtype=jnp.float64) for x in (0.5, 2.0, 3.0))
    (o, a), pullback = jax.vjp(jax_impl.attn, q, k, v)
    one = jnp.ones((1, 1))
    by_o = pullback(jax_impl.AttnOutput(one, jnp.zeros((1, 1))))
    by_both = pullback(jax_impl.AttnOutput(one, one))
    d2 = jax.grad(lambda q: jax.grad(lambda q: jax_impl.attn(q, k, v).o.sum())(q).sum())(q)
    want = _scalar_derivatives_torch()
    got = {"∂o/∂q": by_o[0], "∂o/∂k": by_o[1], "∂o/∂v": by_o[2], "g_q (o + a)": by_both[0],
           "g_k (o + a)": by_both[1], "g_v (o + a)": by_both[2], "∂²o/∂q²": d2, "a": a, "o": o}
    for name, value in got.items():
        assert _agrees(float(np.asarray(value).item()), _number(SECTION_12[name])), name
        assert float(np.asarray(value).item()) == pytest.approx(want[name], rel=1e-14, abs=1e-15), name


# ------------------------------------------------------------------------------------- section 8: examples
def test_section_8_convention_examples(x64):
    jax = x64
    z = torch.tensor(1 + 2j, dtype=torch.complex128, requires_grad=True)
    (z * z.conj()).real.backward()
    assert z.grad == 2 + 4j                                            # PyTorch: 2 ∂L/∂z̄
    assert complex(jax.grad(lambda z: (z * z.conjugate()).real)(1 + 2j)) == 2 - 4j   # JAX: its conjugate
    c = 3 - 1j
    z = torch.tensor(0.5 + 0.25j, dtype=torch.complex128, requires_grad=True)
    (c * z).backward(torch.tensor(1 + 0j, dtype=torch.complex128))
    assert z.grad == 3 + 1j                                            # c̄
    assert complex(jax.vjp(lambda z: c * z, 0.5 + 0.25j)[1](1 + 0j)[0]) == 3 - 1j     # c


# ---------------------------------------------------------------------------------- the identities, complex128
def _random(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.complex(torch.randn(s, generator=g, dtype=torch.float64),
                          torch.randn(s, generator=g, dtype=torch.float64)) * 0.5 for s in shapes]


N, D, E = 4, 3, 5


def test_9_to_13_are_autograds_vjp_of_the_composite():
    q, k, v, g_o, g_a = _random((N, D), (N, D), (N, E), (N, E), (N, N))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(torch_impl.attn_reference(*leaves), leaves, (g_o, g_a))
    a = torch.tanh(q @ k.mT)
    for got, w in zip(formulas.attn_backward(g_o, g_a, q, k, v, a, (True, True, True)), want):
        assert_close(got, w, rtol=1e-12, atol=1e-12)


def test_14_to_16_are_forward_mode_of_the_composite():
    q, k, v, q_t, k_t, v_t = _random((N, D), (N, D), (N, E), (N, D), (N, D), (N, E))
    _, want = torch.func.jvp(lambda *x: tuple(torch_impl.attn_reference(*x)), (q, k, v), (q_t, k_t, v_t))
    got = formulas.attn_jvp(q, k, v, torch.tanh(q @ k.mT), q_t, k_t, v_t)
    for g, w in zip(got, want):
        assert_close(g, w, rtol=1e-12, atol=1e-12)


def test_17_and_18_to_22_relate_the_two_conventions(x64):
    jax, jnp = x64, require_jax("jax.numpy")
    import jax_impl
    from jax_impl import formulas as jf
    q, k, v, g_o, g_a, q_t, k_t, v_t = _random((N, D), (N, D), (N, E), (N, E), (N, N), (N, D), (N, D), (N, E))
    a = torch.tanh(q @ k.mT)
    J = lambda t: jnp.asarray(t.resolve_conj().numpy())                 # noqa: E731
    torch_vjp = formulas.attn_backward(g_o, g_a, q, k, v, a, (True, True, True))             # (9)-(13)
    jax_vjp = jf.attn_backward(J(g_o), J(g_a), J(q), J(k), J(v), J(a))                      # (18)-(22)
    # (18)-(22) is what jax.vjp of the composite computes ...
    _, pullback = jax.vjp(jax_impl.attn_reference, J(q), J(k), J(v))
    for got, want in zip(jax_vjp, pullback(jax_impl.AttnOutput(J(g_o), J(g_a)))):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # ... and the transpose of the JVP (14)-(16) with respect to the bilinear pairing (section 7)
    linear = lambda *t: jf.attn_jvp(J(q), J(k), J(v), J(a), *t)    # noqa: E731
    transposed = jax.linear_transpose(linear, J(q_t), J(k_t), J(v_t))((J(g_o), J(g_a)))
    for got, want in zip(jax_vjp, transposed):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # (17): vjp_torch(g) = conj(vjp_jax(conj(g)))
    conj_jax = jf.attn_backward(J(g_o.conj()), J(g_a.conj()), J(q), J(k), J(v), J(a))
    for t, j in zip(torch_vjp, conj_jax):
        np.testing.assert_allclose(t.numpy(), np.conj(np.asarray(j)), rtol=1e-12, atol=1e-12)
    # jax.grad of a real loss is the conjugate of PyTorch's gradient (section 8.2)
    loss = lambda q, k, v: sum(jnp.sum(jnp.abs(x) ** 2) for x in jax_impl.attn(q, k, v))   # noqa: E731
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    torch_grads = torch.autograd.grad(sum((x.abs() ** 2).sum() for x in torch_impl.attn(*leaves)), leaves)
    for t, j in zip(torch_grads, jax.grad(loss, argnums=(0, 1, 2))(J(q), J(k), J(v))):
        np.testing.assert_allclose(t.numpy(), np.conj(np.asarray(j)), rtol=1e-12, atol=1e-12)


def test_23_to_27_are_autograds_double_backward_of_attn():
    """The second backward pass written out in section 9, against autograd differentiating the first."""
    q, k, v, g_o, g_a, gam_q, gam_k, gam_v = _random((N, D), (N, D), (N, E), (N, E), (N, N), (N, D), (N, D), (N, E))
    leaves = [t.clone().requires_grad_() for t in (q, k, v, g_o, g_a)]
    first = torch.autograd.grad(torch_impl.attn(*leaves[:3]), leaves[:3], leaves[3:], create_graph=True)
    want = torch.autograd.grad(first, leaves, (gam_q, gam_k, gam_v))
    a = torch.tanh(q @ k.mT)
    g_hat = g_o @ v.mH + g_a                                                   # (9)
    g_x = g_hat * (1 - a * a).conj()                                           # (10)
    gam_x = gam_q @ k.mT + q @ gam_k.mT                                        # (23)
    gam_ga = (1 - a * a) * gam_x
    gam_go = gam_ga @ v + a @ gam_v
    gam_a = g_o @ gam_v.mH - 2 * gam_x.conj() * g_hat * a.conj()               # (24)
    bracket_q, bracket_k, _ = formulas.attn_backward(None, gam_a, q, k, v, a, (True, True, False))
    gam2_q = g_x @ gam_k.conj() + bracket_q                                    # (25)
    gam2_k = g_x.mT @ gam_q.conj() + bracket_k                                 # (26)
    gam2_v = gam_ga.mH @ g_o                                                   # (27)
    for got, w in zip((gam2_q, gam2_k, gam2_v, gam_go, gam_ga), want):
        assert_close(got, w, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------ section 10: the temporaries
class _NewSquareBuffers(TorchDispatchMode):
    """Counts op outputs of shape (n, n) whose storage is not one of the op's inputs' (in place / out= excluded)."""

    def __init__(self, n):
        super().__init__()
        self.n, self.count = n, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in torch.utils._pytree.tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        self.count += sum(1 for t in torch.utils._pytree.tree_leaves(out)
                          if isinstance(t, torch.Tensor) and tuple(t.shape) == (self.n, self.n)
                          and t.untyped_storage().data_ptr() not in inputs)
        return out


@pytest.mark.parametrize("fn,n,create_graph,forward,backward",
                         [(torch_impl.attn, 256, False, 1, 1), (torch_impl.attn, 255, False, 1, 3),
                          (torch_impl.attn, 256, True, 1, 3), (torch_impl.attn_reference, 8, False, 2, 3)],
                         ids=["attn", "attn_small", "attn_create_graph", "attn_reference"])
def test_section_10_new_square_buffers(fn, n, create_graph, forward, backward):
    """The table of section 10, A under the blocked size, both output gradients given, every input needing grad:
    ``attn`` in place from 256 KiB of A (n = 256 in float32) on, as written below."""
    assert performance.IN_PLACE_FROM_BYTES == 256 * 1024 == 256 * 256 * 4
    q, k, v = (torch.randn(s, dtype=torch.float32, requires_grad=True) for s in ((n, 3), (n, 3), (n, 5)))
    g_o, g_a = torch.randn(n, 5), torch.randn(n, n)
    with _NewSquareBuffers(n) as fwd:
        o, a = fn(q, k, v)
    with _NewSquareBuffers(n) as bwd:
        torch.autograd.grad((o, a), (q, k, v), (g_o, g_a), create_graph=create_graph)
    assert (fwd.count, bwd.count) == (forward, backward)
    assert "| `torch_impl.attn`, grad mode off in backward, A of 256 KiB or more | **1**" in _section("10.")
    assert "| same, backward with `create_graph=True`, or A under 256 KiB | 1 | 3" in _section("10.")


def test_section_14_cites_tests_that_exist():
    cited = set(re.findall(r"`(?:test_docs_derivation\.py::)?(test_\w+)`", _section("14.")))
    assert cited and cited <= set(globals()), cited - set(globals())
