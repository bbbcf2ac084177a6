"""crosscheck on what students hand in during their first hour (issue 31): the review of what is saved looks at
every subset of inputs requiring grad; ``-q`` labels a student's rows "(yours)" as the table does; a first-order
crash is reported once, as the cause, and the review finding / complex probe that stop on the same error point
at it instead of repeating it.  The solutions: ``tests/support/first_hour.py``.
"""

from __future__ import annotations

import itertools
import os
import re

from crosscheck.review import review
from crosscheck.review.common import SUBSETS
from tests.support import first_hour
from tests.support.console import logical_lines
from tests.crosscheck.test_run import BUGS, cli

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))      # tests/
FIRST_HOUR = os.path.join(HERE, "support", "first_hour.py")
# torch only, one path shape: these tests are about the console's lines, not coverage
ONE_SHAPE = ["--frameworks", "torch", "--trials", "1", "--random-shapes", "0", "--shapes", "5x2x3"]


# --- the review of what is saved: every subset of the inputs requiring grad ------------------------------------------

def test_review_looks_at_every_subset_of_inputs_requiring_grad():
    proper = [tuple(i in c for i in range(3)) for r in (1, 2) for c in itertools.combinations(range(3), r)]
    assert sorted(SUBSETS) == sorted(proper)


def test_saving_q_k_v_whenever_two_inputs_require_grad_is_flagged():
    found = review("torch", first_hour.SavesAllWhenTwo.apply, "SavesAllWhenTwo")
    assert [f.key for f in found.findings] == ["saves_unneeded"], found
    evidence = found.findings[0].evidence
    assert "with only q, v requiring grad: q" in evidence and "with only k, v requiring grad: k" in evidence
    assert "with only q, k requiring grad" not in evidence        # G_Q reads k, G_K reads q: nothing extra


# --- -q: the student's rows read "(yours)" ---------------------------------------------------------------------------

def _quiet(*args):
    """``-q``'s output with its wrapped lines joined back (tests/support/console.py)."""
    code, out, err, doc = cli(*args, "-q")
    return code, "\n".join(logical_lines(out)), err, doc


def test_quiet_output_labels_the_students_side_in_raised_lines():
    code, out, err, doc = _quiet("--torch-impl", f"{FIRST_HOUR}:ReadmeSession", "--dtype", "float64", *ONE_SHAPE)
    assert code == 1
    first = [line for line in out.splitlines() if line.strip().startswith("first: ")]
    assert first and all("torch hand VJP (yours), float64" in line for line in first), first
    # the JSON keeps the oracle labels of its rows (a label with "(yours)" only where a cross label says so)
    assert all("(yours)" not in f["oracle"] for f in doc["failures"])


def test_quiet_output_labels_the_students_side_in_disagreements():
    code, out, err, doc = _quiet("--torch-impl", f"{BUGS}:DroppedGA", "--dtype", "float64", *ONE_SHAPE)
    assert code == 1
    worst = [line for line in out.splitlines() if "the worst: " in line or " disagrees — " in line]
    assert len(worst) == 4 and all(line.split("the worst: ")[1].startswith(("torch hand VJP (yours) vs ",
                                                                          "torch hand VJP of VJP (yours) vs ",
                                                                          "torch hand HVP (yours) vs "))
                                   for line in worst), worst
    full = cli("--torch-impl", f"{BUGS}:DroppedGA", "--dtype", "float64", *ONE_SHAPE)[1]
    section = lambda text: text[text.index("DISAGREEMENTS ("):text.index("review (torch")]
    assert section(full) == section(out)                          # the same lines as under the full table


# --- a first-order crash: one cause, the consequences point at it ----------------------------------------------------

NONE_AT = "TypeError: unsupported operand type(s) for @: 'NoneType' and 'Tensor'"


def test_first_order_crash_is_the_cause_the_review_points_at():
    code, out, err, doc = _quiet("--torch-impl", f"{FIRST_HOUR}:ReadmeSession", "--dtype", "float64", *ONE_SHAPE)
    assert code == 1
    raised = out[out.index("RAISED ("):out.index("review (torch")]
    review_part = out[out.index("review (torch"):out.index("crosscheck: FAIL")]
    # the error in full once, in RAISED (its group header and its first message), with what it also stops
    assert out.count(NONE_AT) == 2 and raised.count(NONE_AT) == 2
    assert ("the same error also stops the review's \"backward is not differentiable (no second order)\" (not a "
            "separate problem)") in raised
    assert ("  - backward is not differentiable (no second order): the first-order TypeError under RAISED (the same "
            "error; fix that first)") in review_part.splitlines()
    # the other findings keep their evidence; the JSON keeps every finding as it was
    assert "  - saves inputs the requested gradients do not read: with only q requiring grad: q" in review_part
    finding = {f["key"]: f for f in doc["review"]["torch"]["findings"]}["not_twice_differentiable"]
    assert finding["evidence"] == f"create_graph=True, then grad of the gradients: {NONE_AT}"


def test_crash_on_every_request_is_not_reported_as_missing_complex_support():
    # no --dtype: the complex probe runs, and its backward raises what every first-order request raised
    code, out, err, doc = _quiet("--torch-impl", f"{FIRST_HOUR}:UnpacksFourSavesThree", *ONE_SHAPE)
    assert code == 1
    error = "ValueError: not enough values to unpack (expected 4, got 3)"
    assert doc["failures"] and all(f["error"] == error for f in doc["failures"] if f["kind"] == "vjp")
    raised = out[out.index("RAISED ("):out.index("review (torch")]
    assert ("the same error also stops the review's \"backward is not differentiable (no second order)\"; the "
            "complex probe (not a separate problem)") in raised
    assert (f"complex (torch, {FIRST_HOUR}:UnpacksFourSavesThree): not probed: its backward raises the first-order "
            f"ValueError under RAISED (the same error; fix that first)") in out.splitlines()
    assert out.count(error) == 2                                  # RAISED's header and first message only
    assert doc["complex"]["torch"] == {"status": "unsupported", "detail": f"the backward raises {error}"}


def test_a_review_finding_with_its_own_error_is_not_folded():
    # the validation finding quotes TypeErrors of bad inputs, not the crash: it keeps its evidence
    code, out, err, doc = _quiet("--torch-impl", f"{FIRST_HOUR}:ReadmeSession", "--dtype", "float64", *ONE_SHAPE)
    line = next(l for l in out.splitlines() if l.startswith("  - no input validation"))
    assert "q is not a tensor (a nested list): TypeError: unsupported operand type(s) for @: 'list'" in line


# --- -q: lines that fit a terminal ------------------------------------------------------------------------------------

def test_quiet_lines_fit_120_columns_and_keep_the_closing_lines_whole():
    code, out, err, doc = cli("-q", "--torch-impl", f"{FIRST_HOUR}:ReadmeSession", "--dtype", "float64", *ONE_SHAPE)
    full = cli("--torch-impl", f"{FIRST_HOUR}:ReadmeSession", "--dtype", "float64", *ONE_SHAPE)[1]
    assert max(len(line) for line in full.splitlines()) > 1000         # the review's validation evidence
    rows = out.splitlines()
    assert max(len(row) for row in rows) <= 120, max(rows, key=len)
    elapsed = lambda line: re.sub(r"; \d+(\.\d+)? s\)$", "; _ s)", line)      # the two runs' times differ
    lines = [elapsed(line) for line in logical_lines(out)]
    # the verdict, failing and hint lines (no indent) come back whole, word for word as in the full run
    closing = [elapsed(line) for line in full.splitlines() if line.startswith(("crosscheck: ", "failing", "hint ("))]
    assert any(len(line) > 120 for line in closing) and all(line in lines for line in closing), closing
    assert doc["hints"][0] in lines
    # a detail line is cut after 3 rows, ending "…"; its head survives
    (validation,) = [i for i, row in enumerate(rows) if row.startswith("  - no input validation")]
    assert rows[validation + 2].endswith(" …") and rows[validation + 3].startswith("  - ")
    assert all(row.startswith(" " * 6) for row in rows[validation + 1:validation + 3])


# --- --help: usage and your own solution first, the error model last ------------------------------------------------

def test_help_puts_checking_your_own_solution_first_and_the_error_model_last():
    import contextlib
    import io

    from crosscheck.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["--help"]) == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == "usage: python -m crosscheck [--torch-impl MODULE:ATTR] [--jax-impl MODULE:ATTR] [options]"
    assert max(len(line) for line in lines) <= 120
    command = "    python -m crosscheck --torch-impl my_attn.py:MyAttn          # JAX: --jax-impl my_attn_jax.py:attn"
    heads = [line for line in lines if line and not line.startswith(" ") and line.endswith(":")]
    order = ["options:", "your own solution:", "output:", "what to check:", "sharded and kernel entries:",
             "your own implementation (--torch-impl / --jax-impl MODULE:ATTR):", "exit codes:", "what is checked:",
             "error measure and tolerances:"]
    assert [h for h in heads if h in order] == order, heads
    assert lines.index(command) < lines.index("options:")               # the command before any option
    assert lines.index("error measure and tolerances:") > len(lines) - 12   # the error model is the last section
