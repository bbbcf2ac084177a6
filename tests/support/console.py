"""The console's lines as tests read them: ``-q`` wraps a long line at ``crosscheck.report.QUIET_WIDTH`` columns,
its continuation rows indented 4 past it (``crosscheck.report.fit``); :func:`logical_lines` joins them back."""

from __future__ import annotations

from typing import List


def logical_lines(text: str) -> List[str]:
    """The lines of ``text`` with each wrapped line's continuation rows (indented 4 or more past the row that
    began it) joined back to it by a space; a detail line (indented 2 past its head) stays a line of its own."""
    out: List[str] = []
    start = 0                                          # the indent of the row that began the last line
    for row in text.splitlines():
        indent = len(row) - len(row.lstrip(" "))
        if out and row.strip() and indent >= start + 4:
            out[-1] += " " + row.strip()
        else:
            out.append(row)
            start = indent
    return out
