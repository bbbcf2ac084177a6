"""Claims of the README's "Use" section and of docs/operators.md's differences between the entry points: the
snippets run, the JAX ``jax.vjp`` one with an ``AttnOutput`` cotangent (a plain tuple is rejected), and what a
non-tensor argument to the operators gets (a number: the dispatcher's RuntimeError; ``None``: the contract's
TypeError)."""

from __future__ import annotations

import os
import re

import pytest
import torch

import torch_impl  # noqa: F401  (registers the operators)
from tests.conftest import ROOT, require_jax

README = os.path.join(ROOT, "README.md")
OPERATORS = os.path.join(ROOT, "docs", "operators.md")


def _use_blocks():
    text = open(README, encoding="utf-8").read()
    section = text.split("\n## Use\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_readme_torch_snippet_runs():
    (block,) = [b for b in _use_blocks() if "torch_impl" in b]
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)                 # noqa: S102 - the README's own code
    assert scope["o"].shape == (2, 4) and scope["a"].shape == (2, 2)


def test_readme_jax_snippet_runs_and_uses_an_attn_output_cotangent():
    jax = require_jax()
    (block,) = [b for b in _use_blocks() if "jax_impl" in b]
    assert "jax_impl.AttnOutput(" in block and "jax.vjp(jax_impl.attn" in block
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)                 # noqa: S102 - the README's own code
    assert [g.shape for g in (scope["g_q"], scope["g_k"], scope["g_v"])] == [(2, 3), (2, 3), (2, 4)]
    with pytest.raises((ValueError, TypeError), match="tree structure"):       # what the README warns about
        scope["pullback"]((scope["jnp"].ones((2, 4)), scope["jnp"].ones((2, 2))))


@pytest.mark.parametrize("op", ["attn", "attn_composite"])
def test_operator_non_tensor_arguments(op):
    fn = getattr(torch.ops.attn_lab, op)
    k, v = torch.ones(2, 3), torch.ones(2, 4)
    with pytest.raises(RuntimeError, match="Expected a value of type 'Tensor' for argument 'q'"):
        fn(3, k, v)                                                   # the dispatcher's schema check
    with pytest.raises(TypeError, match="argument 'q' must be a torch.Tensor, got NoneType"):
        fn(None, k, v)                                                # None passes the schema: the contract's error
    text = open(OPERATORS, encoding="utf-8").read()
    assert "`None` passes the schema" in text and "contract's\n  `TypeError`" in text
