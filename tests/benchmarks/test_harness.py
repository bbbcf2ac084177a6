"""``benchmarks.harness``, the pieces every benchmark program shares: the rule that only ``--update-results``
writes the committed results, the JSON and markdown it writes, and the ratios of timing samples."""

import json
import os

import numpy as np
import pytest

from benchmarks import harness as H

from tests.conftest import ROOT


def _args(argv, scratch="/scratch/x"):
    p = H.parser("python -m benchmarks.x", "First paragraph.\n\nSecond.")
    H.out_or_update(p, out_help="output", update_help="the committed results")
    args = p.parse_args(argv)
    return H.chosen_out(args, H.RESULTS, scratch)


def test_only_update_results_writes_the_committed_results(capsys):
    assert H.RESULTS == str(ROOT / "benchmarks" / "results") and H.SCRATCH == str(ROOT / "benchmarks" / "scratch")
    assert _args([]) == "/scratch/x"
    assert _args(["--update-results"]) == H.RESULTS
    assert _args(["--out", "elsewhere"]) == "elsewhere"
    with pytest.raises(SystemExit) as info:
        _args(["--out", "elsewhere", "--update-results"])
    assert info.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_parser_describes_the_command_by_its_first_paragraph():
    assert H.parser("p", "First paragraph.\n\nSecond.").description == "First paragraph."
    assert H.parser("p", "First.\n\nSecond.", whole_doc=True).description == "First.\n\nSecond."


def test_markdown_tables():
    assert H.md_table(["a", "b"], [["1", "2"], ["3", "4"]]) == ["| a | b |", "|---|---|", "| 1 | 2 |", "| 3 | 4 |"]
    targets = [{"target": "t1", "met": True, "detail": "d1"}, {"target": "t2", "met": False, "detail": "d2"},
               {"target": "t3", "met": None, "detail": "d3"}]
    assert H.targets_table(targets, "met") == ["| target | met | measured |", "|---|---|---|", "| t1 | met | d1 |",
                                               "| t2 | **not met** | d2 |", "| t3 | — | d3 |"]
    assert H.counts({"c10d.all_gather_into_tensor": 2, "all-reduce": 1}) == "2× all_gather_into_tensor, 1× all-reduce"
    assert H.counts({}) == "0"


def test_print_targets(capsys):
    H.print_targets([{"target": "t", "met": False, "detail": "d"}], "Targets: x")
    assert capsys.readouterr().out == "\nTargets: x\n  [NOT MET] t: d\n"


def test_json_files_make_their_folder_and_numpy_scalars_stay_numbers(tmp_path):
    path = tmp_path / "a" / "b.json"
    H.write_json({"x": np.float32(0.5), "y": object}, str(path), default=H.numpy_default)
    got = json.loads(path.read_text())
    assert got["x"] == 0.5 and isinstance(got["y"], str)
    H.write_text(str(tmp_path / "c" / "d.md"), "text\n")
    assert os.path.isfile(tmp_path / "c" / "d.md")


def test_ratios_paired_per_repetition_or_over_the_median():
    num, den = [2.0, 3.0, 10.0], [1.0, 3.0, 2.0]          # per-repetition ratios 2, 1, 5
    assert H.paired_ratio(num, den) == {"median": 2.0, "q1": 1.5, "q3": 3.5}
    assert H.unpaired_ratio(num, den) == {"median": 1.5, "q1": 1.25, "q3": 3.25, "paired": False}
    s = H.summarize([3.0, 1.0, 2.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.0, 1.0, 3.0, 3)
