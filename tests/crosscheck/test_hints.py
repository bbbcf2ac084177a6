"""crosscheck's hint table (``crosscheck.hints``: observed pattern → cause → equation, the most specific row
wins), one test per row; and the hint / UX defects of issue 24, each shown on a solution written the way a
student writes it (``tests/support/planted_bugs.py``, section "solutions written the way a student writes them")."""

from __future__ import annotations

import pytest

from crosscheck.hints import RULES, Observed, choose, hint_text
from tests.support import planted_bugs
from tests.support.console import logical_lines
from tests.support.planted_solutions import findings, return_order
from tests.crosscheck.test_run import BUGS, SMALL, cli

TORCH_ONLY = SMALL + ["--frameworks", "torch"]
QK, QKV = frozenset("qk"), frozenset("qkv")
ALL_MODES = frozenset({"o,a", "o", "a"})


def _o(**kw) -> Observed:
    kw.setdefault("fw", "torch")
    for name in ("grads", "modes", "wrts", "dtypes"):
        if name in kw:                                 # modes, wrts: names as "o,a" for short
            kw[name] = frozenset(tuple(m.split(",")) if name in ("modes", "wrts") else m for m in kw[name])
    kw.setdefault("dtypes", frozenset({"float64"}) if kw.get("grads") else frozenset())
    return Observed(**kw)


# One observed pattern per row of the table, chosen to match that row AND a less specific row below it (where
# there is one), so the test also pins the order: the row named must win.
SWAP_QK = (("q", ("k",), "matches"), ("k", ("q",), "matches"))
EXAMPLES = {
    "returns_count": _o(grads=QKV, modes=ALL_MODES, returned=(2, 3), slips=SWAP_QK),   # beats the slips
    "return_order": _o(grads=QK, modes=ALL_MODES, slips=SWAP_QK,                       # beats "q and k fail"
                       review=(("a_not_differentiable", "returns a non-differentiable a"),)),
    "a_not_differentiable": _o(grads=QK, modes={"o,a", "a"}, second=True,
                               review=(("a_not_differentiable", "returns a non-differentiable a"),)),
    "forward": _o(forward=True, grads=QKV, modes=ALL_MODES),
    "complex_only": _o(grads={"q"}, modes=ALL_MODES, dtypes={"complex128"}),
    "v_only": _o(grads={"v"}, modes={"o,a", "o"}),
    "both_cotangents": _o(grads=QK, modes={"o,a"}),                           # beats "q and k fail"
    "o_absent": _o(grads=QK, modes={"a"}),                                    # beats "the G_A term"
    "one_absent": _o(grads=QKV, modes={"o", "a"}),
    "a_absent": _o(grads=QK, modes={"o"}),
    "ga_term": _o(grads=QK, modes={"o,a", "a"}),                              # beats "q and k fail"
    "tanh_factor": _o(grads=QK, modes=ALL_MODES),
    "q_or_k": _o(grads={"k"}, modes=ALL_MODES),
    "jvp_only": _o(jvp=True, second=True),
    "subsets_only": _o(wrts={"q,k"}, second=True),
    "once_differentiable": _o(second=True, review=(("not_twice_differentiable", "backward is not differentiable"),
                                                   ("saves_nxn", "saves an n x n tensor other than a"))),
    "saves_intermediate": _o(second=True, review=(("saves_nxn", "saves an n x n tensor other than a"),
                                                  ("recomputes", "recomputes tanh in backward"))),
    "second_only": _o(second=True, review=(("recomputes", "recomputes tanh in backward"),)),
}


def test_every_row_of_the_table_has_its_pattern():
    assert [rule.key for rule in RULES] == list(EXAMPLES)


@pytest.mark.parametrize("key", list(EXAMPLES))
def test_the_most_specific_row_wins(key):
    assert choose(EXAMPLES[key]).key == key


def test_hints_cite_each_frameworks_equations_and_the_jvp():
    torch_text = hint_text(EXAMPLES["both_cotangents"])
    jax_text = hint_text(_o(fw="jax", grads=QK, modes={"o,a"}))
    assert torch_text.endswith(", (9)") and "G_O Vᴴ" in torch_text
    assert jax_text.endswith(", (18)") and "G_O Vᵀ" in jax_text
    assert hint_text(_o(grads=QK, modes=ALL_MODES, jvp=True)).endswith("; the JVP fails too → (14)–(16)")
    assert hint_text(_o(second=True, verb="raises TypeError")).startswith("raises TypeError only in second order")
    assert hint_text(_o()) is None                       # nothing observed: no hint


# --- the defects of issue 24, on student-written solutions ---------------------------------------------------------

def test_classic_dropped_ga_points_at_9_not_the_tanh_factor():
    code, out, err, doc = cli("--torch-impl", f"{BUGS}:StudentDroppedGA", *TORCH_ONLY)
    assert code == 1
    assert ("failing (with cotangent on (o,a); agrees with cotangent on (o), (a)): attn: grad of q [float64]; "
            "attn: grad of k [float64]") in out
    (hint,) = doc["hints"]
    assert "fails only when both cotangents arrive" in hint and hint.endswith(", (9) in derivation.md")
    assert "tanh factor" not in hint and "(10)" not in hint


def test_saved_x_second_order_hint_names_the_reviews_finding():
    code, out, err, doc = cli("--torch-impl", f"{BUGS}:student_saves_x", *TORCH_ONLY)
    assert code == 1
    assert {f["kind"] for f in doc["failures"]} <= {"vjp_vjp", "hvp"}      # first order is right
    assert "saves_nxn" in {f["key"] for f in doc["review"]["torch"]["findings"]}
    (hint,) = doc["hints"]
    assert "fails only in second order" in hint and "\"saves an n x n tensor other than a" in hint
    assert "save the output a instead" in hint and ".detach()" not in hint


def test_zeros_finding_sees_a_materialised_g_o_whose_g_v_has_os_shape():
    from crosscheck.review import review
    r = review("torch", planted_bugs.StudentMaterialised.apply, "StudentMaterialised", "float64")
    (zeros,) = [f for f in r.findings if f.key == "zeros"]
    assert "of o's shape (5, 3)" in zeros.evidence, zeros.evidence
    # a zero G_V returned without a product (zeros_like) is the returns_zeros finding's, not a materialisation
    clean = review("torch", findings.ReturnsZeros.apply, "ReturnsZeros", "float64")
    assert not clean.has("zeros") and clean.has("returns_zeros")


def test_console_names_every_second_order_failure_the_json_has():
    code, out, err, doc = cli("-q", "--torch-impl", f"{BUGS}:DroppedGA", *TORCH_ONLY)
    out = "\n".join(logical_lines(out))                # -q wraps at 120 columns
    assert code == 1
    kinds = {f["kind"] for f in doc["failures"]}
    assert {"vjp", "vjp_vjp", "hvp"} <= kinds                  # first and second order fail
    closing = out[out.index("crosscheck: FAIL"):].splitlines()
    assert "failing in second order too (torch; first order fails too): attn: VJP of the VJP [float64]" in closing
    assert "failing in second order too (torch; first order fails too): attn: HVP [float64]" in closing
    assert doc["failing"] == [line for line in closing if line.startswith("failing")]


def test_quiet_collapses_near_duplicate_disagreements():
    code, out, err, doc = cli("-q", "--torch-impl", f"{BUGS}:DroppedGA", *TORCH_ONLY)
    lines = logical_lines(out)                         # -q wraps at 120 columns
    start = next(i for i, line in enumerate(lines) if line.startswith("DISAGREEMENTS ("))
    block = [line for line in lines[start + 1:] if line.startswith("  ")][:50]
    block = block[:next((i for i, line in enumerate(block) if line.startswith("  - ")), len(block))]
    wrong = [f for f in doc["failures"] if not f["error"]]
    assert lines[start] == f"DISAGREEMENTS ({len(wrong)} comparisons, {len(block)} distinct):"
    assert len(wrong) >= 20 and len(block) == 4, block   # q and k, 6 input subsets, 3 oracles: one line
    assert block[0].startswith("  attn: grad of q,k (cotangent on o,a) disagrees in 10 comparisons (float64; "
                               "3 oracles; 1 shape; 6 input subsets); the worst: torch hand VJP (yours) vs")


def test_a_class_that_is_not_a_function_is_named_as_such():
    code, out, err, doc = cli("--torch-impl", f"{BUGS}:StudentNotAFunction", *TORCH_ONLY, json_doc=False)
    assert code == 2
    assert "'StudentNotAFunction' is a class deriving from object, not a torch.autograd.Function subclass" in err
    assert "derive it from torch.autograd.Function" in err and "raises on" not in err


def test_not_callable_is_named_with_its_article():
    code, out, err, doc = cli("--torch-impl", f"{BUGS}:STUDENT_N_HEADS", *TORCH_ONLY, json_doc=False)
    assert code == 2 and "'STUDENT_N_HEADS' is an int, not a callable" in err, err


@pytest.mark.parametrize("argv, text", [
    (["--trials", "x"], "argument --trials: expected an integer, got 'x'"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
])
def test_argparse_errors_are_one_line(argv, text):
    code, out, err, doc = cli(*argv, json_doc=False)
    assert code == 2 and out == ""
    assert err.splitlines() == [err.strip()] and err.startswith("crosscheck: error: ") and text in err, err
    assert "usage:" not in err


# --- return-order slips (issue 37): right gradients returned in the wrong order, or two of them ----------------------

ORDER = return_order.__file__
# d = e (4x3x3): every slip shows in the numbers; d ≠ e (5x2x3): a slip with v shows as a gradient of v's shape
BOTH_SHAPES = ["--dtype", "float64", "--trials", "1", "--random-shapes", "0", "--shapes", "4x3x3,5x2x3"]
WRONG_ORDER = "your {b} returns the gradients in the wrong order: "
AGREE = " → return (G_Q, G_K, G_V), in the order of the inputs q, k, v; the gradients themselves agree with autodiff"


@pytest.mark.parametrize("name, says", [
    ("SwapsQK", "what you return as g_q matches G_K, what you return as g_k matches G_Q"),
    ("SwapsQV", "what you return as g_q matches G_V, what you return as g_v matches G_Q"),
    ("SwapsKV", "what you return as g_k matches G_V, what you return as g_v matches G_K"),
    ("Rotates", "what you return as g_q matches G_K, what you return as g_k matches G_V, what you return as g_v "
                "matches G_Q"),
])
def test_a_slip_in_the_return_order_is_named(name, says):
    code, out, err, doc = cli("--torch-impl", f"{ORDER}:{name}", "--frameworks", "torch", *BOTH_SHAPES)
    assert code == 1
    (hint,) = doc["hints"]
    assert hint == f"hint (torch, {ORDER}:{name}): {WRONG_ORDER.format(b='backward')}{says}{AGREE}, as (9)–(13) in " \
                   f"derivation.md", hint
    assert "tanh factor" not in out and hint in out.splitlines()


def test_a_slip_with_v_seen_only_by_shape():
    code, out, err, doc = cli("--torch-impl", f"{ORDER}:SwapsQV", *TORCH_ONLY)       # d ≠ e: torch refuses it
    # torch refuses the wrong shapes; with a unused, g_q is G_V = None, which torch lets through: zero, no evidence
    errors = {f["error"].split(" - got")[0] for f in doc["failures"] if f["kind"] == "vjp" and f["error"]}
    assert code == 1 and errors == {"RuntimeError: Function SwapsQVBackward returned an invalid gradient at index 0",
                                    "RuntimeError: Function SwapsQVBackward returned an invalid gradient at index 2"}
    (hint,) = doc["hints"]
    assert ("what you return as g_q has the shape of G_V, what you return as g_v has the shape of G_Q or G_K → "
            "return (G_Q, G_K, G_V), in the order of the inputs q, k, v; (9)–(13) in derivation.md") in hint


def test_two_gradients_returned_for_three_inputs():
    code, out, err, doc = cli("--torch-impl", f"{ORDER}:ReturnsTwo", *TORCH_ONLY)
    assert code == 1
    assert doc["hints"] == [f"hint (torch, {ORDER}:ReturnsTwo): your backward returns 2 gradients for 3 inputs → "
                            f"return one per input, in their order (G_Q, G_K, G_V); section 5 and (9)–(13) in "
                            f"derivation.md"]


@pytest.mark.parametrize("name", ["DroppedGA", "OneMinusA", "WrongTranspose", "GradVNoTranspose"])
def test_formula_bugs_on_square_shapes_keep_their_hints(name):
    # d = e: q's, k's and v's gradients share a shape, and a zero G_Q (G_A dropped, o unused) equals the zero G_V
    code, out, err, doc = cli("--torch-impl", f"{BUGS}:{name}", "--frameworks", "torch", "--dtype", "float64",
                              "--trials", "1", "--random-shapes", "0", "--shapes", "4x3x3,1x1x1,3x2x2")
    assert doc["hints"] == [f"hint (torch, {BUGS}:{name}): {planted_bugs.TORCH_HINTS[name]} in derivation.md"]


@pytest.mark.slow                  # two JAX runs (~55 s on 2 busy cores); the torch slips and the JAX messages'
@pytest.mark.jax                   # parsing (tests/crosscheck/modules/test_hints.py) stay in the README's test command
def test_jax_slips_in_the_bwd_rule():
    code, out, err, doc = cli("--jax-impl", f"{ORDER}:jax_swaps_qk", "--frameworks", "jax", *BOTH_SHAPES)
    assert code == 1
    assert doc["hints"] == [f"hint (jax, {ORDER}:jax_swaps_qk): {WRONG_ORDER.format(b='bwd rule')}what you return "
                            f"as g_q matches G_K, what you return as g_k matches G_Q{AGREE}, as (18)–(22) in "
                            f"derivation.md"]
    code, out, err, doc = cli("--jax-impl", f"{ORDER}:jax_returns_two", "--frameworks", "jax", *TORCH_ONLY[:-2])
    assert doc["hints"] == [f"hint (jax, {ORDER}:jax_returns_two): your bwd rule returns 2 gradients for 3 inputs "
                            f"→ return one per input, in their order (G_Q, G_K, G_V); section 5 and (18)–(22) in "
                            f"derivation.md"]
