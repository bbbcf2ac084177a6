"""Surviving mutants that cannot change behaviour, each with the reason: ``EQUIVALENT[target][(operator, original
line, mutated line)] = why`` (lines stripped, as in mutation/results/*.json).  A survivor not listed here is a
missing test (kill it) or dead code (delete it; in a module another change owns, report it)."""

_TYPE = "core/ReplaceComparisonOperator_"

EQUIVALENT = {
    "torch_formulas": {},
    "jax_formulas": {},
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

# Code no caller reaches, found by the runs, is deleted rather than listed here: target -> [(code, why dead)].
DEAD_CODE = {"torch_formulas": [], "jax_formulas": [], "metrics": []}
