"""``torch_impl``'s modules import one another without a cycle, and each imports alone.

The graph: every ``import`` / ``from ... import`` of a ``torch_impl`` module in each module's source (its ``ast``),
at module level and inside functions, resolved to the module it names (``from . import ring`` names
``torch_impl.ring``; ``from .output import AttnOutput`` names ``torch_impl.output``).  It must be acyclic once the
lazy imports in ``LAZY_CYCLE_EDGES`` are taken out, and each of those must be lazy (inside a function) and needed
(closing a cycle), so that the list stays what the code is.  The result type ``AttnOutput`` lives in the leaf
``torch_impl.output``, which the entries returning it import instead of one another.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "torch_impl"

# The lazy imports that close a cycle, each with why it stays.
LAZY_CYCLE_EDGES = {
    ("torch_impl.blocks", "torch_impl.distributed"):
        "blocks' autograd formula runs distributed.block_backward_graph for create_graph=True on DTensors, and "
        "distributed imports blocks to give the block operators their sharding rules; imported at call time "
        "because torch.distributed.tensor costs seconds to import and a DTensor is there only once it was",
}


def _modules() -> dict:
    """``{dotted name: path}`` for every module of the package, subpackages included."""
    out = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> list:
    """``[(target module, lazy)]``: each ``torch_impl`` module ``name`` imports; lazy = inside a function."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []

    def resolve(dotted: str):
        """The longest prefix of ``dotted`` that is a module of the package (None: not one of ours)."""
        parts = dotted.split(".")
        for end in range(len(parts), 0, -1):
            if ".".join(parts[:end]) in MODULES:
                return ".".join(parts[:end])
        return None

    def visit(node, lazy: bool):
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((t, inner) for t in (resolve(a.name) for a in child.names) if t)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[:len(package.split(".")) - (child.level - 1)]
                    source = ".".join(base + ([child.module] if child.module else []))
                else:
                    source = child.module or ""
                for alias in child.names:       # a submodule named in the list, else the module it comes from
                    target = resolve(f"{source}.{alias.name}")
                    target = target if target == f"{source}.{alias.name}" else resolve(source)
                    if target:
                        found.append((target, inner))
            visit(child, inner)

    visit(tree, False)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycle(edges: dict):
    """One cycle of the directed graph ``{node: set of nodes}`` as a list of nodes, or None."""
    state, stack = {}, []

    def dfs(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = dfs(nxt)
                if found:
                    return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(edges):
        if node not in state:
            found = dfs(node)
            if found:
                return found
    return None


def test_the_graph_is_read():
    """The walk sees the package's imports, lazy ones included (else an empty graph would pass)."""
    assert {"torch_impl.function", "torch_impl.distributed", "torch_impl.ring", "torch_impl.output",
            "torch_impl.kernels", "torch_impl.kernels.o_only"} <= set(MODULES)
    assert ("torch_impl.formulas", False) in GRAPH["torch_impl.blocks"]
    assert ("torch_impl.distributed", True) in GRAPH["torch_impl.function"]        # in attn(), on DTensors
    assert ("torch_impl.formulas", False) in GRAPH["torch_impl.kernels.o_only"]    # from .. import formulas
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycle_apart_from_the_documented_lazy_imports():
    edges = {name: {t for t, _ in found} - {t for (s, t) in LAZY_CYCLE_EDGES if s == name}
             for name, found in GRAPH.items()}
    assert _cycle(edges) is None, f"import cycle: {' -> '.join(_cycle(edges))}"
    for (source, target), why in LAZY_CYCLE_EDGES.items():
        kinds = {lazy for t, lazy in GRAPH[source] if t == target}
        assert kinds == {True}, f"{source} -> {target} must be imported inside a function only ({why})"
        edges[source].add(target)
        assert _cycle(edges), f"{source} -> {target} closes no cycle: take it out of LAZY_CYCLE_EDGES"
        edges[source].discard(target)


def test_attn_output_lives_in_a_leaf():
    """``torch_impl.output`` imports nothing of the package; the entries returning an ``AttnOutput`` take it
    from there, and it is the class re-exported as ``torch_impl.AttnOutput`` and ``torch_impl.function``'s."""
    assert GRAPH["torch_impl.output"] == []
    for entry in ("torch_impl.function", "torch_impl.distributed", "torch_impl.ring"):
        assert ("torch_impl.output", False) in GRAPH[entry], entry
    assert not {t for t, _ in GRAPH["torch_impl.ring"]} & {"torch_impl.function", "torch_impl.distributed"}
    assert not {t for t, _ in GRAPH["torch_impl.distributed"]} & {"torch_impl.function", "torch_impl.ops"}

    import torch_impl
    import torch_impl.function
    import torch_impl.output
    assert torch_impl.AttnOutput is torch_impl.function.AttnOutput is torch_impl.output.AttnOutput
    assert "AttnOutput" in torch_impl.__all__ and "AttnOutput" in torch_impl.function.__all__
    assert torch_impl.AttnOutput._fields == ("o", "a")


_IMPORT_EACH = r"""
import os, sys, traceback
import torch                                   # once, shared by the forked children
failed = []

def alone(name):
    pid = os.fork()
    if pid == 0:                               # no torch_impl module imported yet in this child
        try:
            __import__(name)
            os._exit(0)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
    if os.waitpid(pid, 0)[1] != 0:
        failed.append(name)

plain, with_dtensor = sys.argv[1].split(","), sys.argv[2].split(",")
for name in plain:                             # torch.distributed.tensor not imported
    alone(name)
import torch.distributed.tensor                # (seconds) then the modules that import it, and the package
for name in with_dtensor:                      # with DTensor in use (its __init__ then imports distributed)
    alone(name)
print("FAILED", failed)
sys.exit(1 if failed else 0)
"""


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_each_module_imports_alone():
    """In a process that imported no ``torch_impl`` module, ``import torch_impl.<module>`` works, for each: with
    ``torch.distributed.tensor`` not imported, and (for the modules that import it, and the package, whose
    ``__init__`` then imports ``distributed``) with it imported.  Not ``kernels.triton_attn``: it imports no
    module of the package (asserted here), only triton (seconds to import; the kernel tests import it)."""
    assert GRAPH["torch_impl.kernels.triton_attn"] == []
    dtensor = ["torch_impl.distributed", "torch_impl.ring", "torch_impl"]
    plain = [n for n in MODULES if n not in dtensor[:2] and n != "torch_impl.kernels.triton_attn"]
    run = subprocess.run([sys.executable, "-c", _IMPORT_EACH, ",".join(plain), ",".join(dtensor)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-6000:]
