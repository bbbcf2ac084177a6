"""The two frameworks reject the same bad input with the same exception type and the same text, and each
framework's package imports without the other.

The bad inputs are built once with numpy and handed to ``torch_impl.check_inputs`` (as tensors, via
``torch.from_numpy``) and to ``jax_impl.check_inputs`` (as numpy arrays and as ``jax.Array``); the block
contract's cases to both ``check_block_inputs``.  The texts come from one module (``attn_contract``), so what is
tested here is behaviour: the same bad input gives the same exception and text in both frameworks, at every
entry point.

Every template of ``attn_contract.MESSAGES`` is exercised here; two are torch's alone: ``same_device`` (JAX has
no counterpart check: tracers and numpy arrays carry no device; see ``jax_impl.validation``; tests/impl/test_function.py
has the torch one) and ``nested`` (JAX has no nested tensors: ``test_torch_refuses_nested_tensors`` below).
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from tests.conftest import require_jax  # noqa: E402

jax = require_jax()

import jax.numpy as jnp  # noqa: E402

import attn_contract  # noqa: E402
import jax_impl  # noqa: E402
import jax_impl.validation  # noqa: E402
import torch_impl  # noqa: E402
import torch_impl.validation  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _f(*shape, dtype=np.float32):
    return np.zeros(shape, dtype)


# Each case: (q, k, v) as numpy arrays or non-array Python objects; every key of MESSAGES except same_device.
BAD_INPUTS = {
    "type-list": ([[0.0]], _f(1, 1), _f(1, 1)),
    "type-float": (_f(1, 1), 1.0, _f(1, 1)),
    "type-None": (_f(1, 1), _f(1, 1), None),
    "type-numpy-scalar": (np.float64(1.0), _f(1, 1), _f(1, 1)),
    "ndim-0": (np.array(1.0, np.float32), _f(1, 1), _f(1, 1)),
    "ndim-1": (_f(3), _f(3, 3), _f(3, 2)),
    "ndim-3": (_f(4, 3), _f(2, 4, 3), _f(4, 2)),
    "ndim-3-v": (_f(4, 3), _f(4, 3), _f(1, 4, 2)),
    "dtype-int64": (_f(4, 3, dtype=np.int64), _f(4, 3), _f(4, 2)),
    "dtype-uint8": (_f(4, 3), _f(4, 3, dtype=np.uint8), _f(4, 2)),
    "dtype-bool": (_f(4, 3), _f(4, 3), _f(4, 2, dtype=bool)),
    "d": (_f(4, 3), _f(4, 2), _f(4, 2)),
    "n-k": (_f(4, 3), _f(5, 3), _f(4, 2)),
    "n-v": (_f(4, 3), _f(4, 3), _f(0, 2)),
    "same_dtype-64": (_f(4, 3), _f(4, 3, dtype=np.float64), _f(4, 2)),
    "same_dtype-complex": (_f(4, 3, dtype=np.complex128), _f(4, 3, dtype=np.complex64), _f(4, 2)),
    "same_dtype-half": (_f(4, 3, dtype=np.float16), _f(4, 3), _f(4, 2)),
}


def _as_torch(x):
    return torch.from_numpy(x) if isinstance(x, np.ndarray) else x


def _raw_error(check, args):
    with pytest.raises((TypeError, ValueError)) as info:
        check(*args)
    return type(info.value), str(info.value)


def _error(check, args):
    """(exception type, text) with the one framework-specific field, the accepted array type, normalised."""
    exc, text = _raw_error(check, args)
    for framework in (torch_impl.validation.FRAMEWORK, jax_impl.validation.FRAMEWORK):
        text = text.replace(framework.accepted, "{accepted}")
    return exc, text


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_same_error_both_frameworks(case):
    args = BAD_INPUTS[case]
    torch_error = _error(torch_impl.check_inputs, [_as_torch(x) for x in args])
    assert _error(jax_impl.check_inputs, args) == torch_error
    # jax.Array inputs, where jnp can represent them (int64 / float64 need x64, so keep to numpy there).
    if all(isinstance(x, np.ndarray) and x.dtype.itemsize <= 4 and x.dtype != np.complex128 for x in args):
        assert _error(jax_impl.check_inputs, [jnp.asarray(x) for x in args]) == torch_error
    # And through the public entry points, not only check_inputs.
    assert _error(jax_impl.attn, args) == _error(torch_impl.attn, [_as_torch(x) for x in args])


# --- the block contract: q (m, d) has its own rows; k (n, d) and v (n, e) share theirs ------------------------

BAD_BLOCK_INPUTS = {
    "kv_rows": ((_f(2, 3), _f(4, 3), _f(5, 2)),
                "attn_block(): k and v must have the same first dimension n (the key/value rows: q is (m, d), k is "
                "(n, d), v is (n, e)), got k (4, 3) and v (5, 2)"),
    "d": ((_f(2, 3), _f(4, 2), _f(4, 2)),
          "attn_block(): q and k must have the same second dimension d, got q (2, 3) and k (4, 2)"),
    "ndim": ((_f(3), _f(4, 3), _f(4, 2)), "attn_block(): argument 'q' must be 2-D (m, d), got 1-D with shape (3,)"),
    "type": ((_f(2, 3), [[0.0]], _f(4, 2)), "attn_block(): argument 'k' must be a {accepted}, got list"),
    "same_dtype": ((_f(2, 3), _f(4, 3), _f(4, 2, dtype=np.float64)),
                   "attn_block(): q, k and v must have the same dtype, got q float32, k float32 and v float64"),
}


@pytest.mark.parametrize("case", sorted(BAD_BLOCK_INPUTS))
def test_block_contract_same_error_both_frameworks(case):
    args, text = BAD_BLOCK_INPUTS[case]
    exc = TypeError if case in ("type", "same_dtype") else ValueError
    assert _error(torch_impl.validation.check_block_inputs, [_as_torch(x) for x in args]) == (exc, text)
    assert _error(jax_impl.validation.check_block_inputs, args) == (exc, text)


def test_block_contract_lets_q_rows_differ_and_lab_contract_does_not():
    args = (_f(2, 3), _f(5, 3), _f(5, 4))
    assert torch_impl.validation.check_block_inputs(*map(_as_torch, args)) is None
    assert jax_impl.validation.check_block_inputs(*args) is None
    assert jax_impl.validation.check_block_inputs(_f(0, 3), _f(0, 3), _f(0, 0)) is None   # empty sizes are valid
    assert _raw_error(torch_impl.check_inputs, list(map(_as_torch, args)))[1].startswith("attn(): q, k and v must")
    assert _raw_error(jax_impl.check_inputs, args)[1].startswith("attn(): q, k and v must")


def test_every_template_is_exercised():
    """A new check in attn_contract must come with a case here (same_device: torch only, tests/impl/test_function.py;
    nested: torch only, below)."""
    keys = {case.split("-")[0] for case in BAD_INPUTS} | set(BAD_BLOCK_INPUTS)
    assert keys | {"same_device", "nested"} == set(attn_contract.MESSAGES)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage:UserWarning")
@pytest.mark.parametrize("layout", ["strided", "jagged"])
def test_torch_refuses_nested_tensors(layout):
    """A nested tensor has no sizes to check: refused naming the argument at every torch entry point, before
    any check reads its shape (red before: "Internal error: NestedTensorImpl doesn't support sizes", or for the
    jagged layout an indeterminate symbolic relation).  Torch only: JAX has no nested arrays."""
    nested = torch.nested.nested_tensor([torch.zeros(3, 4), torch.zeros(5, 4)], layout=getattr(torch, layout))
    dense = torch.zeros(2, 4)
    entry_points = {"attn": [torch_impl.check_inputs, torch_impl.attn, torch_impl.attn_reference,
                             torch.ops.attn_lab.attn, torch.ops.attn_lab.attn_composite],
                    "attn_block": [torch_impl.validation.check_block_inputs]}
    for fn, checks in entry_points.items():
        for index, name in enumerate("qkv"):
            args = [dense, dense, dense]
            args[index] = nested
            text = attn_contract.message("nested", fn, name=name, layout=layout)
            for check in checks:
                assert _raw_error(check, args) == (TypeError, text), check


# Dtypes that are floating point or complex to the framework (so an `is_floating_point` / `issubdtype` check let
# them through) but have no matmul / tanh kernels, plus integer and bool ones; each framework's, where it has it.
REJECTED_TORCH = ["complex32", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                  "float8_e8m0fnu", "int8", "uint8", "int32", "bool"]
REJECTED_JAX = ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz",
                "float8_e3m4", "float8_e4m3", "float8_e8m0fnu", "float4_e2m1fn", "int4", "uint4", "int8", "uint8",
                "int32", "bool"]


def _dtype_message(name, dtype):
    return ("attn(): argument '" + name + "' must have a floating-point or complex dtype (float16, bfloat16, "
            "float32, float64, complex64 or complex128), got " + dtype)


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental:UserWarning")
@pytest.mark.parametrize("dtype", REJECTED_TORCH)
def test_torch_rejects_dtypes_outside_the_allowlist(dtype):
    if not hasattr(torch, dtype):
        pytest.skip(f"torch {torch.__version__} has no {dtype}")
    bad = torch.zeros(2, 3, dtype=getattr(torch, dtype))
    ok = torch.zeros(2, 3)
    entry_points = [torch_impl.check_inputs, torch_impl.attn, torch_impl.attn_reference,
                    torch.ops.attn_lab.attn, torch.ops.attn_lab.attn_composite]
    for fn in entry_points:      # before any compute: not the NotImplementedError of an aten kernel
        assert _raw_error(fn, (ok, bad, ok)) == (TypeError, _dtype_message("k", dtype)), fn


@pytest.mark.parametrize("dtype", REJECTED_JAX)
def test_jax_rejects_dtypes_outside_the_allowlist(dtype):
    if not hasattr(jnp, dtype):
        pytest.skip(f"jax {jax.__version__} has no {dtype}")
    bad = jnp.zeros((2, 3), getattr(jnp, dtype))
    ok = jnp.zeros((2, 3), jnp.float32)
    for fn in (jax_impl.check_inputs, jax_impl.attn, jax_impl.attn_jvp, jax_impl.attn_reference):
        assert _raw_error(fn, (ok, ok, bad)) == (TypeError, _dtype_message("v", dtype)), fn


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64", "complex64", "complex128"])
def test_allowlisted_dtypes_pass_both(dtype):
    t = torch.zeros(2, 3, dtype=getattr(torch, dtype))
    assert torch_impl.check_inputs(t, t, t) is None
    o, a = torch_impl.attn(t, t, t)
    assert o.dtype == a.dtype == t.dtype
    x = np.zeros((2, 3), getattr(jnp, dtype))          # numpy (ml_dtypes for bfloat16): no x64 needed
    assert jax_impl.check_inputs(x, x, x) is None


def test_other_frameworks_array_is_named_in_the_type_error():
    """A student passing a torch tensor to JAX (or the reverse) is told what they passed and what is accepted."""
    t, j = torch.zeros(2, 3), jnp.zeros((2, 3))
    assert _raw_error(jax_impl.attn, (t, j, j)) == (
        TypeError, "attn(): argument 'q' must be a jax.Array or numpy.ndarray, got torch.Tensor")
    assert _raw_error(torch_impl.attn, (t, j, t)) == (
        TypeError, "attn(): argument 'k' must be a torch.Tensor, got jax.Array")


def test_valid_inputs_pass_both():
    args = (_f(0, 3), _f(0, 3), _f(0, 0))                           # empty sizes are valid
    assert torch_impl.check_inputs(*map(_as_torch, args)) is None
    assert jax_impl.check_inputs(*args) is None


# --- each framework's package imports without the other ------------------------------------------------------

BLOCKER = textwrap.dedent("""
    import sys

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name == {blocked!r} or name.startswith({blocked!r} + "."):
                raise ImportError("blocked for this test: " + name)
            return None

    sys.meta_path.insert(0, Block())
""")


def _run_without(blocked, body):
    code = BLOCKER.format(blocked=blocked) + textwrap.dedent(body)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok", result.stdout


def test_jax_impl_imports_and_runs_without_torch():
    _run_without("torch", """
        import numpy as np, jax
        import jax_impl
        out = jax_impl.attn(np.ones((2, 3), np.float32), np.ones((2, 3), np.float32), np.ones((2, 4), np.float32))
        jax.grad(lambda v: jax_impl.attn(np.ones((2, 3), np.float32), np.ones((2, 3), np.float32), v).o.sum())(
            np.ones((2, 4), np.float32))
        assert "torch" not in sys.modules
        assert not jax.config.jax_enable_x64, "importing jax_impl must not switch x64 on"
        print("ok")
    """)


def test_torch_impl_imports_and_runs_without_jax():
    _run_without("jax", """
        import torch
        import torch_impl
        q = torch.ones(2, 3, requires_grad=True)
        torch_impl.attn(q, torch.ones(2, 3), torch.ones(2, 4)).o.sum().backward()
        assert "jax" not in sys.modules
        print("ok")
    """)


def test_x64_not_leaked_by_earlier_test_modules():
    # tests/impl/test_jax_impl.py (collected before this file) switches x64 on for its own tests only; its fixture must
    # restore the flag, or float32 expectations in later modules would silently run in float64.
    if os.environ.get("JAX_ENABLE_X64", "").lower() in ("1", "true"):
        pytest.skip("x64 enabled by the environment")
    assert not jax.config.jax_enable_x64
