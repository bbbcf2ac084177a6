"""The shape of crosscheck's code (issue 31): no module over 300 lines, no function over 60; no site that parses
crosscheck's own strings back (labels, joined names, error lines); no lookup built from a framework's name, no
per-framework table outside ``crosscheck/frameworks.py`` and ``crosscheck/drivers.py``, no code looked up by a
computed name but where ``NAME_RESOLVED`` says why.  Pure text and ``ast``: no torch, no JAX.

String methods that take text apart (``split``, ``partition``, ``startswith`` ...) are allowed only where the text
comes from outside crosscheck — the command line, a module path the user gave, an environment variable, a version
string, torch's own names — each listed in ``EXTERNAL`` with why; a new one fails here until it is listed (or, if
it reads crosscheck's own output, replaced by a field).
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "crosscheck"
MODULES = sorted(ROOT.rglob("*.py"))
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 60

# (module relative to crosscheck/, the call's source text) -> where the text comes from
EXTERNAL = {
    ("cli.py", "text.split(',')"): "--op / --dtype / --frameworks / --shapes as typed",
    ("cli.py", "text.partition(':')"): "--n-range LOW:HIGH as typed",
    ("cli.py", "item.lower().split('x')"): "--shapes NxDxE as typed",
    ("runner.py", "text.partition(':')"): "--torch-layouts / --jax-layouts MODULE:ATTR as typed",
    ("impls.py", "module.endswith('.py')"): "--torch-impl / --jax-impl MODULE:ATTR as typed",
    ("impls.py", "text.partition(':')"): "MODULE:ATTR as typed",
    ("impls.py", "attr.split('.')"): "MODULE:ATTR as typed",
    ("impls.py", "b.__module__.split('.')"): "the user's class's bases, named in a message",
    ("impls.py", "module.startswith('jax')"): "the module of the user's object's type",
    ("parts.py", "type(o).__module__.split('.')"): "the types a user's forward returned, named in a message",
    ("frameworks.py", "version.split('.')"): "triton's installed version",
    ("remote/process.py", "env.get('PYTHONPATH', '').split(os.pathsep)"): "the environment's PYTHONPATH",
    ("shards/rows.py", "env.get('XLA_FLAGS', '').split()"): "the environment's XLA_FLAGS",
    ("shards/rows.py", "f.startswith(flag)"): "the environment's XLA_FLAGS",
    ("torch_oracles.py", "name.startswith('CppNode')"): "torch's autograd node names",
    ("torch_oracles.py", "name.startswith(_LAYOUT_NODES)"): "torch's autograd node names",
}
TAKING_APART = ("split", "rsplit", "partition", "rpartition", "startswith", "endswith")

# Lookups built from a framework's name, and per-framework tables or branches outside Framework.
# (in ``ast.unparse``'s spelling: strings in single quotes)
BY_NAME = (r"\{fw\}_", r"\{framework\}", r"_\{fw\}", r"getattr\([^)]*, f'", r"import_module\(f'", r"__import__\(f'",
           r"\('torch', 'jax'\)", r"\('jax', 'torch'\)", r"[=!]= '(torch|jax)'", r"'(torch|jax)' (not )?in\b",
           r"\{'torch':", r"\{'jax':")


def _rel(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _code(path: pathlib.Path) -> str:
    """The module's source without its docstrings and comments (they may quote what the code must not do)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            body[0] = ast.Pass()
    return ast.unparse(tree)


def test_there_are_modules_to_check():
    assert len(MODULES) > 20 and (ROOT / "frameworks.py") in MODULES


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_no_module_over_300_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{_rel(path)}: {lines} lines (at most {MAX_MODULE_LINES})"


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_no_function_over_60_lines(path):
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{_rel(path)}: functions over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"


def _taking_apart(path: pathlib.Path):
    """The source (``ast.unparse``) of every split / partition / startswith ... call."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in TAKING_APART:
            yield ast.unparse(node)


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_no_string_of_its_own_is_taken_apart(path):
    """Every split / partition / startswith / endswith reads text from outside crosscheck (``EXTERNAL``): a label,
    a comma-joined set of names, an error line or a path that crosscheck wrote is a field to read instead."""
    calls = [c for c in _taking_apart(path) if (_rel(path), c) not in EXTERNAL]
    assert not calls, f"{_rel(path)}: takes text apart: {calls} (read a field instead, or list it in EXTERNAL)"


def test_every_external_text_is_still_there():
    """EXTERNAL lists no call that is gone (a stale entry would let a new one in unnoticed)."""
    found = {(_rel(p), c) for p in MODULES for c in _taking_apart(p)}
    assert set(EXTERNAL) <= found, sorted(set(EXTERNAL) - found)


# The two per-framework tables: the words and the code below ``parts`` (frameworks.py), the code above it
# (drivers.py: executors, reviews, --shards children, which import modules that import frameworks.py).
TABLES = ("frameworks.py", "drivers.py")


@pytest.mark.parametrize("path", [p for p in MODULES if _rel(p) not in TABLES], ids=_rel)
def test_no_lookup_or_table_by_framework_name(path):
    """Outside ``frameworks.py`` and ``drivers.py``: no name built from a framework's name (``f"{fw}_impl"``), no
    getattr / import by an f-string, no literal ("torch", "jax") list, branch on, or table keyed by a framework's
    name."""
    code = _code(path)
    hits = [m.group(0) for pattern in BY_NAME for m in re.finditer(pattern, code)]
    assert not hits, f"{_rel(path)}: {hits} (a field of Framework, or a loop over frameworks.NAMES)"


# Code named by a string and looked up at run time: ``globals()[name]``, ``import_module(name)`` /
# ``__import__(name)``, and ``getattr(obj, name)`` / ``setattr`` with a name that is not a literal.  Every site left
# is listed with what the name is; none takes it from a record of crosscheck's (Framework and Driver hold functions:
# loaders with a written-out import, lambdas reading a field).  A new site fails until it is listed here.
NAME_RESOLVED = {
    ("impls.py", "importlib.import_module(module)"): "the user's --torch-impl / --jax-impl MODULE:ATTR",
    ("impls.py", "getattr(obj, part)"): "the ATTR path of the user's MODULE:ATTR",
    # a literal, so not a lookup from a record: ``import torch_impl`` written as an expression (compare.py is a
    # mutation target; the statement form would move its lines and need its 15-minute run again)
    ("compare.py", "__import__('torch_impl')"): "a literal package name (the float64 ground truth's torch_impl)",
    ("specs.py", "getattr(formulas, name)"): "each name in the formulas module's own __all__",
    ("environment.py", "getattr(obj, name)"): "torch's precision settings, saved and restored",
    ("remote/process.py", "f'import sys; from {module} import {function}; {function}(*sys.argv[1:])'"):
        "the child's code: the entry function's own __module__ and __name__ (run_child refuses any other entry)",
    ("environment.py", "setattr(obj, name, 'ieee')"): "torch's precision settings, pinned",
    ("environment.py", "setattr(obj, name, value)"): "torch's precision settings, restored",
}


def _computed_keys(node: ast.Call) -> bool:
    """A call given ``**{key: ...}`` with a key that is not a literal (``replace(c, **{field: fn})``)."""
    return any(k.arg is None and (isinstance(k.value, ast.DictComp) or isinstance(k.value, ast.Dict) and not all(
        isinstance(key, ast.Constant) for key in k.value.keys)) for k in node.keywords)


def _resolved_by_name(path: pathlib.Path) -> list:
    """``[source]`` of every run-time lookup of code by a name in the module (see ``NAME_RESOLVED``): getattr /
    setattr / attrgetter / import_module / __import__ by a computed name, keyword arguments by computed names,
    ``vars(...)[n]`` / ``sys.modules[n]`` / ``x.__dict__[n]``, an import written into a code string, globals()[...]."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and (
                ast.unparse(node.value).endswith(("sys.modules", "__dict__")) or
                isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "vars"):
            if not isinstance(node.slice, ast.Constant):
                found.append(ast.unparse(node))
        elif isinstance(node, ast.JoinedStr):
            text = "".join(str(v.value) for v in node.values if isinstance(v, ast.Constant))
            if "from " in text and " import " in text:                 # code for a child, naming a module
                found.append(ast.unparse(node))
        if not isinstance(node, ast.Call):
            continue
        func = ast.unparse(node.func)
        named = node.args[1] if func in ("getattr", "setattr") and len(node.args) > 1 else \
            node.args[0] if func in ("importlib.import_module", "import_module", "__import__", "attrgetter",
                                     "operator.attrgetter") and node.args else None
        if named is not None and not (func in ("getattr", "setattr", "attrgetter", "operator.attrgetter")
                                      and isinstance(named, ast.Constant)):
            found.append(ast.unparse(node))
        elif _computed_keys(node):
            found.append(ast.unparse(node))
    found += ["globals()[...]"] * _code(path).count("globals()[")
    return found


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_no_code_resolved_from_a_name(path):
    """No ``globals()[...]``, no ``import_module`` / ``__import__`` and no ``getattr`` / ``setattr`` by a computed
    name, but where ``NAME_RESOLVED`` lists the site with what the name is."""
    unlisted = [c for c in _resolved_by_name(path) if (_rel(path), c) not in NAME_RESOLVED]
    assert not unlisted, f"{_rel(path)}: {unlisted} (refer to the code by object: a field holding the function)"


def test_every_name_resolved_site_is_still_there():
    """NAME_RESOLVED lists no site that is gone (a stale entry would let a new one in unnoticed)."""
    found = {(_rel(p), c) for p in MODULES for c in _resolved_by_name(p)}
    assert set(NAME_RESOLVED) <= found, sorted(set(NAME_RESOLVED) - found)


def test_a_name_resolved_callable_is_seen():
    """The walk finds each form (so the test above can fail)."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        planted = pathlib.Path(tmp) / "planted.py"
        planted.write_text("import importlib, sys, dataclasses\n"
                           "def f(fw, rec):\n    globals()[rec.check](fw)\n"
                           "    importlib.import_module(rec.module)\n    getattr(rec, rec.field)()\n"
                           "    getattr(rec, 'fine')\n    dataclasses.replace(rec, **{rec.field: 1})\n"
                           "    dataclasses.replace(rec, **{'fine': 1})\n    sys.modules[rec.module]\n"
                           "    code = f'from {rec.module} import main'\n")
        assert sorted(_resolved_by_name(planted)) == sorted([
            "importlib.import_module(rec.module)", "getattr(rec, rec.field)", "globals()[...]",
            "dataclasses.replace(rec, **{rec.field: 1})", "sys.modules[rec.module]",
            "f'from {rec.module} import main'"])
