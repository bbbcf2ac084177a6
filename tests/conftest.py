"""What every test file shares: the repository's paths and the inputs of ``attn(q, k, v)``.

``tests/`` is a package (``tests/__init__.py``), so pytest's default ``prepend`` import mode puts the repository
root on ``sys.path`` and imports these files as ``tests.*``: test files take these names with
``from tests.conftest import ROOT, attn_inputs``, and the non-test code they use (planted bugs and solutions,
the OpInfo db) with ``from tests.support import ...``.  No file edits ``sys.path``; a subprocess started with
``cwd=ROOT`` (``python -m crosscheck``) finds ``tests.support`` the same way.
"""

from __future__ import annotations

import importlib
import os
import pathlib

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():   # before anything imports triton: its kernels then run interpreted on CPU tensors
    os.environ.setdefault("TRITON_INTERPRET", "1")

# One core's worth of torch threads per xdist worker (``-n auto``: one worker per core): two workers of two
# threads each on 2 cores made the torch tests 9 % slower (96 s against 89 s, test_opinfo / function / batched /
# ops); JAX's tests gained nothing from one XLA thread, so XLA keeps its default.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

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


# The switch CI sets (.ci/run, .ci/matrix): there JAX must import, so a test needing it fails instead of skipping.
REQUIRE_JAX = "TANH_ATTN_REQUIRE_JAX"


def require_jax(module: str = "jax"):
    """Import and return ``module`` (JAX or a submodule: ``"jax.numpy"``, ``"jax.experimental.pallas"``) for a
    test that needs it; the one way to say so, with the ``jax`` marker for a whole test.  Where it does not
    import, the test skips (a user without the JAX extra), or, under ``TANH_ATTN_REQUIRE_JAX=1`` (CI), fails in
    one line, so a broken JAX cannot turn the crosscheck suite into skips.  At module level the skip or failure
    covers the file (under the switch: an error collecting it)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        error = exc
    # outside the except: a collection error would print the ImportError's traceback above the line
    if os.environ.get(REQUIRE_JAX, "") not in ("", "0"):
        pytest.fail(f"JAX is required here ({REQUIRE_JAX}=1) but does not import: {error}", pytrace=False)
    pytest.skip(f"{module} does not import: {error}", allow_module_level=True)


def optional_jax():
    """JAX, or ``None`` where it does not import, for a test that also checks the torch-only install (JAX
    contenders absent); under ``TANH_ATTN_REQUIRE_JAX=1`` (CI) a missing JAX fails the file instead, as
    :func:`require_jax` does."""
    try:
        return importlib.import_module("jax")
    except ImportError as exc:
        error = exc
    if os.environ.get(REQUIRE_JAX, "") not in ("", "0"):
        pytest.fail(f"JAX is required here ({REQUIRE_JAX}=1) but does not import: {error}", pytrace=False)
    return None


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


# Fixtures of tests/upstream/test_upstream.py whose users belong to the `upstream` tier (pyproject.toml: markers).
_UPSTREAM_FIXTURES = {"codegen", "ext"}


def pytest_configure(config):
    # Registered here, not in pyproject.toml, whose markers are the tiers the default run leaves out.
    config.addinivalue_line("markers", "jax: needs JAX (tests/conftest.py: require_jax, before the test's fixtures)")


@pytest.hookimpl(tryfirst=True)     # before the fixtures are set up
def pytest_runtest_setup(item):
    if item.get_closest_marker("jax") is not None:
        require_jax()


@pytest.hookimpl(tryfirst=True)     # before pytest's own -m deselection reads the marks
def pytest_collection_modifyitems(config, items):
    """Mark every test that needs the autograd codegen or the C++ build (directly or through another fixture)
    ``upstream``, so a new test using them joins the tier without anyone remembering the mark."""
    for item in items:
        if _UPSTREAM_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.upstream)
