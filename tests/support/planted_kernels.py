"""Planted wrong kernels for tests/crosscheck/test_kernels.py: each must fail crosscheck's kernel rows.

``torch_drop_ga`` runs in crosscheck's torch kernel subprocess (``CROSSCHECK_KERNELS_SETUP``): the fused backward
called without the cotangent of ``a``, i.e. without the G_A term of (9) / (33).  ``jax_fused_backward_drop_ga``
replaces ``jax_impl.kernels.pallas_attn.fused_backward`` with the same bug.
"""


def torch_drop_ga() -> None:
    """``torch_impl.kernels.fused_backward`` (what ``AttnFunction.backward`` calls on the kernels) without G_A."""
    from torch_impl import kernels

    real = kernels.fused_backward

    def fused_backward(grad_o, grad_a, q, k, v, a, output_mask):
        return real(grad_o, None, q, k, v, a, output_mask)

    kernels.fused_backward = fused_backward


def jax_fused_backward_drop_ga(real):
    """``pallas_attn.fused_backward`` without G_A (given the real one)."""

    def fused_backward(g_o, g_a, q, k, v, a, **kwargs):
        return real(g_o, None, q, k, v, a, **kwargs)

    return fused_backward
