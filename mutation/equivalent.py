"""Surviving mutants that cannot change behaviour, each with the reason: ``EQUIVALENT[target][(operator, original
line, mutated line)] = why``.  A survivor not listed here is a missing test (kill it) or dead code (delete it)."""

EQUIVALENT = {
    "torch_formulas": {},
    "jax_formulas": {},
    "metrics": {},
    "compare": {},
}
