"""What every test file shares: the repository's paths and the inputs of ``attn(q, k, v)``.

``tests/`` is a package (``tests/__init__.py``), so pytest's default ``prepend`` import mode puts the repository
root on ``sys.path`` and imports these files as ``tests.*``: test files take these names with
``from tests.conftest import ROOT, attn_inputs``, and the non-test code they use (planted bugs and solutions,
the OpInfo db) with ``from tests.support import ...``.  No file edits ``sys.path``; a subprocess started with
``cwd=ROOT`` (``python -m crosscheck``) finds ``tests.support`` the same way.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():   # before anything imports triton: its kernels then run interpreted on CPU tensors
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = pathlib.Path(__file__).resolve().parent.parent        # the repository root
SUPPORT = ROOT / "tests" / "support"                         # planted bugs and solutions, the OpInfo db


def attn_inputs(n, d, e, dtype=torch.float64, *, batch=(), requires_grad=False, device="cpu", seed=0,
                uniform=False):
    """``[q (*batch, n, d), k (*batch, n, d), v (*batch, n, e)]`` from one seeded generator: drawn in float64
    (standard normal, or with ``uniform`` U[-1, 1)), real and imaginary parts independent for a complex
    ``dtype`` (a real-valued complex input would hide a missing conjugate), then cast to ``dtype`` and moved
    to ``device``.  ``requires_grad``: one bool for all three inputs, or one per input."""
    g = torch.Generator().manual_seed(seed)

    def draw(shape):
        if uniform:
            return torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1
        return torch.randn(shape, generator=g, dtype=torch.float64)

    grads = (requires_grad,) * 3 if isinstance(requires_grad, bool) else tuple(requires_grad)
    out = []
    for (rows, cols), rg in zip(((n, d), (n, d), (n, e)), grads):
        shape = (*batch, rows, cols)
        t = torch.complex(draw(shape), draw(shape)) if dtype.is_complex else draw(shape)
        out.append(t.to(device=device, dtype=dtype).requires_grad_(rg))
    return out


def jax_inputs(n, d, e, dtype=np.float64, seed=0):
    """``(q, k, v)`` as JAX arrays of ``dtype`` (standard normal; independent imaginary parts for complex).
    JAX is imported only here, so this file imports without it."""
    import jax.numpy as jnp

    rng = np.random.default_rng(seed)

    def draw(*shape):
        x = rng.standard_normal(shape)
        if np.issubdtype(dtype, np.complexfloating):
            x = x + 1j * rng.standard_normal(shape)
        return jnp.asarray(x.astype(dtype))

    return draw(n, d), draw(n, d), draw(n, e)


def loss(o, a):
    """A real scalar of both outputs, nonlinear in each (its cotangents cos(o), 2a vary per element, so no
    gradient term can cancel) and shape-agnostic (no size-dependent constants: dynamic-shape tests)."""
    return o.sin().sum() + (a * a).sum()


# Fixtures of tests/test_upstream.py whose users belong to the `upstream` tier (pyproject.toml: markers).
_UPSTREAM_FIXTURES = {"codegen", "ext"}


@pytest.hookimpl(tryfirst=True)     # before pytest's own -m deselection reads the marks
def pytest_collection_modifyitems(config, items):
    """Mark every test that needs the autograd codegen or the C++ build (directly or through another fixture)
    ``upstream``, so a new test using them joins the tier without anyone remembering the mark."""
    for item in items:
        if _UPSTREAM_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.upstream)
