"""The project's cosmic-ray operators (mutation/operators.py) make the mutations they claim: each operator's
examples, and on the formulas modules at least one mutant of each kind the issue asks for."""

from __future__ import annotations


import pytest

import cosmic_ray  # noqa: E402,F401  (in the test extra: a missing install fails, it does not skip)
from cosmic_ray.mutating import mutate_code  # noqa: E402

from mutation.operators import OPERATORS, OperatorProvider  # noqa: E402

from tests.conftest import ROOT  # noqa: E402


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_operator_examples(name):
    op = OPERATORS[name]
    for ex in op.examples():
        assert mutate_code(ex.pre_mutation_code, op(), ex.occurrence) == ex.post_mutation_code


def test_provider_lists_every_operator():
    provider = OperatorProvider()
    assert sorted(provider) == sorted(OPERATORS) and all(provider[n] is OPERATORS[n] for n in OPERATORS)


def _mutants(path, name):
    with open(ROOT / path) as f:
        src = f.read()
    out, i = [], 0
    while (got := mutate_code(src, OPERATORS[name](), i)) is not None:
        out.append(got)
        compile(got, path, "exec")                     # every mutant is valid Python
        i += 1
    return out


@pytest.mark.parametrize("path", ["torch_impl/formulas.py", "jax_impl/formulas.py"])
def test_domain_operators_reach_the_formulas(path):
    """Every formulas module gets mutants of its matmuls and transposes, its sums and its tanh factor."""
    for name in ("DropTranspose", "AddTranspose", "SwapMatmulOperands", "DropSumTerm", "FirstPowerDerivative"):
        assert _mutants(path, name), f"{name} makes no mutant of {path}"
    if path.startswith("torch"):
        assert _mutants(path, "DropConjugate")         # torch's convention conjugates; JAX's has none
