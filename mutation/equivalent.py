"""Surviving mutants that cannot change behaviour, each with the reason: ``EQUIVALENT[target][(operator, original
line, mutated line)] = why`` (lines stripped, as in mutation/results/*.json).  A survivor not listed here is a
missing test (kill it) or dead code (delete it; in a module another change owns, report it)."""

_TYPE = "core/ReplaceComparisonOperator_"

EQUIVALENT = {
    "torch_formulas": {},
    "jax_formulas": {
        ("core/ReplaceUnaryOperator_USub_UAdd",
         "o_dot = jnp.zeros(a.shape[:-1] + v.shape[-1:], jnp.result_type(a, v))",
         "o_dot = jnp.zeros(a.shape[:+1] + v.shape[-1:], jnp.result_type(a, v))"):
            "a is 2-D in every call of the JAX formulas (jax.vmap batches by tracing 2-D arrays; `.T` would be "
            "wrong on a stack anyway), and for 2-D a.shape[:1] == a.shape[:-1].  The line is in attn_jvp's "
            "no-tangent-at-all branch, which JAX never calls (reported to the lead: dead code)",
        ("core/ReplaceUnaryOperator_Delete_USub",
         "o_dot = jnp.zeros(a.shape[:-1] + v.shape[-1:], jnp.result_type(a, v))",
         "o_dot = jnp.zeros(a.shape[:-1] + v.shape[1:], jnp.result_type(a, v))"):
            "v is 2-D in every call of the JAX formulas, where v.shape[1:] == v.shape[-1:]; the same dead branch",
        ("core/ReplaceUnaryOperator_USub_UAdd",
         "o_dot = jnp.zeros(a.shape[:-1] + v.shape[-1:], jnp.result_type(a, v))",
         "o_dot = jnp.zeros(a.shape[:-1] + v.shape[+1:], jnp.result_type(a, v))"):
            "v is 2-D in every call of the JAX formulas, where v.shape[1:] == v.shape[-1:]; the same dead branch",
        ("core/ReplaceUnaryOperator_Delete_USub",
         "o_dot = jnp.zeros(a.shape[:-1] + v.shape[-1:], jnp.result_type(a, v))",
         "o_dot = jnp.zeros(a.shape[:1] + v.shape[-1:], jnp.result_type(a, v))"):
            "a is 2-D in every call of the JAX formulas, where a.shape[:1] == a.shape[:-1]; the same dead branch",
    },
    "metrics": {
        ("core/NumberReplacer", "return Diff(0.0, 0.0)", "return Diff(0.0, -1.0)"):
            "a max_abs of -1 for absent or empty results: max_abs is reported, not judged, and a row's max_abs "
            "is a maximum that starts at 0, so no verdict, row or failure can show it",
        ("core/NumberReplacer", "return Diff(0.0, 0.0)", "return Diff( -1.0, 0.0)"):
            "two absent results: a relative error of -1 passes like 0 (rel_err <= tol), and a row's rel_err is a "
            "maximum that starts at 0, so no verdict, row or failure can show it",
        (_TYPE + "NotEq_Gt", "if actual.shape != expected.shape:", "if actual.shape > expected.shape:"):
            "no caller can hand diff() arrays of different shapes: torch autograd and JAX's custom_vjp / "
            "custom_jvp reject a wrong-shaped gradient or tangent inside the request (a raised request: "
            "tests/support/planted_solutions/strictness.py:GradKTransposed), and a forward of the wrong shape is refused "
            "before the run (exit 2); for equal shapes `>` is False like `!=`",
        (_TYPE + "Eq_LtE", "if a.size == 0:", "if a.size <= 0:"):
            "an array's size is never negative",
        (_TYPE + "NotEq_Lt", "if actual.shape != expected.shape:", "if actual.shape < expected.shape:"):
            "as for `>`: no caller can hand diff() arrays of different shapes (torch autograd and JAX's custom "
            "rules reject them inside the request; a wrong forward shape is refused before the run)",
        (_TYPE + "NotEq_Is", "if actual.shape != expected.shape:", "if actual.shape is expected.shape:"):
            "as for `>`: shapes never differ here, and two equal shape tuples are never the same object, so `is` "
            "is False like `!=`",
        ("core/ReplaceTrueWithFalse", "@dataclass(frozen=True)", "@dataclass(frozen=False)"):
            "nothing assigns to a Diff after construction; frozen only forbids that",
        ("core/AddNot",
         "a = actual.astype(np.complex128 if np.iscomplexobj(actual) or np.iscomplexobj(expected) else np.float64)",
         "a = actual.astype(np.complex128 if not np.iscomplexobj(actual) or np.iscomplexobj(expected) else np.float64)"):
            "real arrays compared in complex128 give the same norms and maxima as in float64 (zero imaginary "
            "parts), and complex ones are still compared as complex",
        ("core/ReplaceFalseWithTrue",
         "def diff(actual: Optional[np.ndarray], expected: Optional[np.ndarray], symmetric: bool = False) -> Diff:",
         "def diff(actual: Optional[np.ndarray], expected: Optional[np.ndarray], symmetric: bool = True) -> Diff:"):
            "the default is never used: diff's one caller (compare.Collector.compare) always passes symmetric",
    },
    "compare": {},
}

# Code no caller reaches, found by the runs: to be deleted by the module's owner (the formulas modules and
# crosscheck are being changed by other branches of issue 23 / 24 right now, so it is reported, not deleted here).
# target -> [(code, where it should go)]
DEAD_CODE = {
    "torch_formulas": [
        ("attn_jvp: `if o_dot is None: o_dot = a.new_zeros(...)`",
         "autograd calls Function.jvp only when some input has a tangent, so (q, k, v) without any tangent never "
         "reaches it; its mutants die only because tests/test_formulas_mutants.py calls attn_jvp directly"),
    ],
    "jax_formulas": [
        ("attn_jvp: `if o_dot is None: o_dot = jnp.zeros(...)`",
         "JAX never calls a custom_jvp rule with every tangent a symbolic zero (its docstring says so); two of its "
         "mutants are equivalent on 2-D arrays (listed above)"),
    ],
    "metrics": [
        ("diff: `if actual is None and expected is None: return Diff(0.0, 0.0)`",
         "no oracle gives None on both sides (the expected side is None only for the project's torch VJP in a "
         "torch-vs-JAX row, whose JAX side is always an array), so no run of the pins reaches it; its "
         "Diff(1.0, ·) / Diff(·, 1.0) mutants survive for that reason"),
    ],
}
