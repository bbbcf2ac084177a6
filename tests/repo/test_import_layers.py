"""``torch_impl``'s and ``jax_impl``'s modules import one another without a cycle, on at most four floors, and
each imports alone.

The graph: every ``import`` / ``from ... import`` of a package module in each module's source (its ``ast``), at
module level and inside functions, resolved to the module it names (``from . import ring`` in
``torch_impl/sharded/layouts.py`` names ``torch_impl.sharded.ring``; ``from ..output import AttnOutput`` names
``torch_impl.output``).  It must be acyclic, lazy imports included (no ``LAZY_CYCLE_EDGES`` is left: the block
operators' DTensor backward imports ``sharded.rules``, which imports no block), so every arrow points down.  A
module's floor is the length of its longest import chain (a module importing none of the package is floor 1); the
package ``__init__`` (the façade re-exporting the entries) stands above them and is not counted.  The result type
``AttnOutput`` lives in each package's leaf ``output``, which the entries returning it import instead of one
another.

``crosscheck`` is held to the same rule (:func:`test_crosscheck_is_layered`): no cycle among its modules, lazy
imports and ``if TYPE_CHECKING:`` imports counted, and at most ``CROSSCHECK_FLOORS`` floors.  Its data modules
(``specs``, ``cases``, ``config``, ``results``) stand below the comparison (``compare``), which stands below the
runs (``kernels``, ``shards``, ``runner``); the package ``__init__`` (the façade) is not counted in
the floors but is in the cycle: a module importing ``from . import x`` reaches it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("torch_impl", "jax_impl")
MAX_FLOORS = 4
CROSSCHECK = "crosscheck"
# crosscheck's longest chain: jaxpr < jax_oracles < frameworks < specs < cases < config < results < compare <
# remote.outcome < shards.rows < shards < runner < cli < __main__.  Set to the floors it has, so a longer chain fails.
CROSSCHECK_FLOORS = 14
# The sharded layer, file for file the same in both frameworks.
SHARDED_FILES = ("__init__", "blocks", "rules", "layouts", "ring")


def _modules() -> dict:
    """``{dotted name: path}`` for every module of both packages and of ``crosscheck``, subpackages included."""
    out = {}
    for path in sorted(p for package in PACKAGES + (CROSSCHECK,) for p in (ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> list:
    """``[(target module, lazy)]``: each module of ours ``name`` imports; lazy = inside a function."""
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


def _floors(package: str) -> dict:
    """``{module: floor}`` for the modules of ``package`` but its ``__init__``: 1 + the highest floor it imports
    (of ``package``'s modules: another package's count as none)."""
    edges = {n: {t for t, _ in GRAPH[n] if t.startswith(package + ".") and t != n}
             for n in MODULES if n.startswith(package + ".")}
    floors: dict = {}

    def floor(n):
        if n not in floors:
            floors[n] = 1 + max((floor(t) for t in edges.get(n, ())), default=0)
        return floors[n]

    for n in edges:
        floor(n)
    return floors


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
    """The walk sees the packages' imports, lazy ones included (else an empty graph would pass)."""
    assert {"torch_impl.function", "torch_impl.sharded.rules", "torch_impl.sharded.ring", "torch_impl.output",
            "torch_impl.kernels", "torch_impl.kernels.o_only", "jax_impl.core",
            "jax_impl.sharded.layouts"} <= set(MODULES)
    assert ("torch_impl.formulas", False) in GRAPH["torch_impl.sharded.blocks"]     # from .. import formulas
    assert ("torch_impl.sharded.rules", True) in GRAPH["torch_impl.function"]      # in attn(), on DTensors
    assert ("torch_impl.sharded.rules", True) in GRAPH["torch_impl.sharded.blocks"]   # DTensor backward
    assert ("torch_impl.formulas", False) in GRAPH["torch_impl.kernels.o_only"]    # from .. import formulas
    assert ("jax_impl.sharded.ring", False) in GRAPH["jax_impl.sharded.layouts"]   # from .ring import ...
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert {"crosscheck.specs", "crosscheck.kernels.candidates", "crosscheck.shards.rows",
            "crosscheck.review.common"} <= set(MODULES)
    assert ("crosscheck.torch_oracles", True) in GRAPH["crosscheck.compare"]       # in truth(), lazy
    assert ("crosscheck.specs", True) in GRAPH["crosscheck.probe"]                 # in _inputs(), lazy
    assert ("crosscheck.specs", False) in GRAPH["crosscheck.review.common"] or \
        ("crosscheck.specs", True) in GRAPH["crosscheck.review.common"]            # from ..specs import SPECS


def test_no_import_cycle():
    """No cycle, lazy imports included: every arrow points down a floor."""
    edges = {name: {t for t, _ in found} - {name} for name, found in GRAPH.items()}
    assert _cycle(edges) is None, f"import cycle: {' -> '.join(_cycle(edges))}"


def test_crosscheck_is_layered():
    """No import cycle among ``crosscheck``'s modules (lazy imports counted: the 7-file circle of cases, compare,
    kernels, parts, results, sampling and specs ran through function-local imports), and at most
    ``CROSSCHECK_FLOORS`` floors; the data modules stand low."""
    edges = {n: {t for t, _ in found if t.split(".")[0] == CROSSCHECK} - {n}
             for n, found in GRAPH.items() if n.split(".")[0] == CROSSCHECK}
    cycle = _cycle(edges)
    assert cycle is None, f"import cycle in crosscheck: {' -> '.join(cycle)}"
    floors = _floors(CROSSCHECK)
    assert len(floors) > 20, floors
    assert max(floors.values()) <= CROSSCHECK_FLOORS, sorted(floors.items(), key=lambda kv: -kv[1])[:6]
    assert floors["crosscheck.errors"] == 1 and floors["crosscheck.oracles"] == 1
    assert floors["crosscheck.specs"] < floors["crosscheck.cases"] < floors["crosscheck.config"]
    assert floors["crosscheck.config"] < floors["crosscheck.results"] < floors["crosscheck.compare"]
    # the kernel candidates' sides stand with the specs, their run above the comparison; a remote check's process
    # module below it (it imports no comparison module), the outcome's rows above it
    assert floors["crosscheck.kernels.candidates"] < floors["crosscheck.compare"] < floors["crosscheck.kernels.rows"]
    assert floors["crosscheck.remote.process"] < floors["crosscheck.compare"] < floors["crosscheck.remote.outcome"]
    assert floors["crosscheck.remote.outcome"] < min(floors["crosscheck.kernels.rows"], floors["crosscheck.shards.rows"])
    # --kernels and --shards: packages of one shape (payload below the comparison, rows above it, a child)
    for package in ("kernels", "shards"):
        assert floors[f"crosscheck.{package}.payload"] < floors["crosscheck.compare"] < floors[f"crosscheck.{package}.rows"]


@pytest.mark.parametrize("package", PACKAGES)
def test_at_most_four_floors(package):
    floors = _floors(package)
    assert len(floors) > 5, floors
    worst = max(floors.values())
    assert worst <= MAX_FLOORS, {n: f for n, f in floors.items() if f > MAX_FLOORS - 1}
    assert floors[f"{package}.formulas"] == 1 and floors[f"{package}.output"] == 1
    assert worst >= 3                                # the count is real: layers stand above the leaves


def test_floors_count_the_longest_chain():
    """A chain of five modules is five floors (so the test above can fail)."""
    real = dict(GRAPH)
    try:
        for name, target in (("torch_impl.output", "torch_impl.support"),):
            GRAPH[name] = [*GRAPH[name], (target, True)]
        assert max(_floors("torch_impl").values()) > MAX_FLOORS
    finally:
        GRAPH.clear()
        GRAPH.update(real)


def test_the_sharded_layer_is_mirrored():
    """``torch_impl.sharded`` and ``jax_impl.sharded`` hold the same files, and no module is left at the
    former homes (``torch_impl.ring``, ``distributed``, ``blocks``; ``jax_impl.ring``, ``sharding``)."""
    for package in PACKAGES:
        files = sorted(p.stem for p in (ROOT / package / "sharded").glob("*.py"))
        assert files == sorted(SHARDED_FILES), (package, files)
    assert not {"torch_impl.ring", "torch_impl.distributed", "torch_impl.blocks", "jax_impl.ring",
                "jax_impl.sharding"} & set(MODULES)


# What spelling (1)-(3) or (9)-(13) out would take: matrix products and tanh.
_MATH_CALLS = {"mm", "matmul", "bmm", "addmm", "addmm_", "baddbmm", "dot", "einsum", "tanh", "tanh_"}


def _calls(path: Path):
    """``(called attribute or name, has a matrix-product operator)`` over ``path``'s code."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {(f"{n.func.value.id}." if isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
              else "") + (n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", ""))
             for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return names, any(isinstance(n, ast.MatMult) for n in ast.walk(tree))


@pytest.mark.parametrize("package, per_block", [
    ("torch_impl", {"performance.attn_forward_into", "performance.attn_backward", "formulas.attn_backward"}),
    ("jax_impl", {"formulas.attn_forward", "formulas.attn_backward", "formulas.attn_jvp"}),
])
def test_the_rings_run_the_formulas_per_block(package, per_block):
    """Both rings call the formulas (or their schedule, ``torch_impl.performance``) on each block and spell none
    of the math themselves: no matrix product, no tanh in ``sharded/ring.py``."""
    names, matmul = _calls(ROOT / package / "sharded" / "ring.py")
    assert per_block <= names, per_block - names
    assert not matmul and not {n.rpartition(".")[2] for n in names} & _MATH_CALLS, sorted(names)


def test_attn_output_lives_in_a_leaf():
    """``torch_impl.output`` / ``jax_impl.output`` import nothing of their package; the entries returning an
    ``AttnOutput`` take it from there, and it is the class re-exported as ``torch_impl.AttnOutput`` and
    ``torch_impl.function``'s (``jax_impl.AttnOutput``, ``jax_impl.core``'s)."""
    assert GRAPH["torch_impl.output"] == [] and GRAPH["jax_impl.output"] == []
    for entry in ("torch_impl.function", "torch_impl.sharded.rules", "torch_impl.sharded.ring", "jax_impl.core",
                  "jax_impl.sharded.blocks", "jax_impl.sharded.ring", "jax_impl.sharded.layouts"):
        assert (entry.split(".")[0] + ".output", False) in GRAPH[entry], entry
    assert not {t for t, _ in GRAPH["torch_impl.sharded.ring"]} & {"torch_impl.function", "torch_impl.sharded.rules"}
    assert not {t for t, _ in GRAPH["torch_impl.sharded.rules"]} & {"torch_impl.function", "torch_impl.ops",
                                                                     "torch_impl.sharded.blocks"}

    import torch_impl
    import torch_impl.function
    import torch_impl.output
    assert torch_impl.AttnOutput is torch_impl.function.AttnOutput is torch_impl.output.AttnOutput
    assert "AttnOutput" in torch_impl.__all__ and "AttnOutput" in torch_impl.function.__all__
    assert torch_impl.AttnOutput._fields == ("o", "a")


_IMPORT_EACH = r"""
import os, sys, traceback
import torch                                   # once, shared by the forked children
import jax
failed = []

def alone(name):
    pid = os.fork()
    if pid == 0:                               # no torch_impl module imported yet in this child
        try:
            __import__(name)
            os._exit(0)
        except ImportError as err:             # on a JAX older than the Pallas kernels' MIN_JAX: refused, by design
            if name.startswith("jax_impl.kernels") and "for its Pallas kernels; this is JAX" in str(err):
                os._exit(0)
            traceback.print_exc()
            os._exit(1)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
    if os.waitpid(pid, 0)[1] != 0:
        failed.append(name)

plain, with_dtensor = sys.argv[1].split(","), sys.argv[2].split(",")
for name in plain:                             # torch.distributed.tensor not imported
    alone(name)
import torch.distributed.tensor                # (seconds) then the modules that import it, and the package
for name in with_dtensor:                      # with DTensor in use (its __init__ then imports sharded.rules)
    alone(name)
print("FAILED", failed)
sys.exit(1 if failed else 0)
"""


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_each_module_imports_alone():
    """In a process that imported no module of the packages, ``import <module>`` works, for each: with
    ``torch.distributed.tensor`` not imported, and (for the modules that import it, and the package, whose
    ``__init__`` then imports ``sharded.rules``) with it imported.  Not ``kernels.triton_attn``: it imports no
    module of the package (asserted here), only triton (seconds to import; the kernel tests import it)."""
    assert GRAPH["torch_impl.kernels.triton_attn"] == []
    dtensor = ["torch_impl.sharded.rules", "torch_impl.sharded.ring", "torch_impl.sharded.layouts", "torch_impl"]
    plain = [n for n in MODULES if n.split(".")[0] in PACKAGES and n not in dtensor[:3]
             and n != "torch_impl.kernels.triton_attn"]
    run = subprocess.run([sys.executable, "-c", _IMPORT_EACH, ",".join(plain), ",".join(dtensor)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-6000:]
