"""Validate the patch series without building PyTorch: apply it, run PyTorch's codegen, compile its C++.

Used by ``tests/upstream/test_upstream.py``; each step also works by hand, e.g.::

    python -c "from upstream import validate as v; from pathlib import Path; print(v.apply_series(Path('/tmp/t')))"
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from . import make_patches as mp

HARNESS = mp.HERE / "harness"
OP = "_tanh_attention"


def patch_files() -> list[Path]:
    """The committed series, in order."""
    return sorted(mp.PATCHES.glob("*.patch"))


def patch_of(part: str) -> Path:
    """The patch of lab part ``part`` ("II", "III" or "IV")."""
    [patch] = [p for p in patch_files() if f"-part-{part}-" in p.name]
    return patch


def read_generated(out: Path, pattern: str) -> str:
    """The codegen's sharded output files matching ``pattern`` (e.g. ``VariableType_*.cpp``), concatenated."""
    return "".join(p.read_text() for p in sorted(out.glob(pattern)))


def apply_series(tree: Path) -> list[str]:
    """Pristine files at ``tree`` (a new git repository), then ``git am`` of every patch in order.  Returns the
    commit hashes: ``[pristine, part II, part III, part IV]``.  Raises ``CalledProcessError`` (with git's
    message in ``stderr``) if a patch does not apply."""
    tree.mkdir(parents=True, exist_ok=True)
    mp.pristine_tree(tree)
    mp.git(tree, "am", "--quiet", *map(str, patch_files()))
    return mp.git(tree, "rev-list", "--reverse", "HEAD").stdout.split()


def export(tree: Path, rev: str, dst: Path) -> Path:
    """The files of commit ``rev`` of ``tree``, written to ``dst``."""
    dst.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", rev], cwd=tree, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dst)], input=archive, check=True)
    return dst


def native_yaml(tree: Path) -> tuple[str, str]:
    base = tree / "aten/src/ATen/native"
    return str(base / "native_functions.yaml"), str(base / "tags.yaml")


def parse(tree: Path):
    """PyTorch's own parse of the tree's native_functions.yaml: ``(ParsedYaml, our NativeFunction)``."""
    from torchgen.gen import parse_native_yaml
    parsed = parse_native_yaml(*native_yaml(tree))
    [f] = [f for f in parsed.native_functions if str(f.func.name) == OP]
    return parsed, f


_CODEGEN = """
import sys
from tools.autograd.gen_autograd import gen_autograd, gen_autograd_python
from torchgen.selective_build.selector import SelectiveBuilder
nf, tags, out = sys.argv[1:]
gen_autograd(nf, tags, out, "tools/autograd", SelectiveBuilder.get_nop_selector())
gen_autograd_python(nf, tags, out, "tools/autograd")
"""


def run_autograd_codegen(tree: Path, out: Path) -> Path:
    """The tree's own ``tools/autograd`` codegen (as PyTorch's build runs it) on the tree's YAML: VariableType,
    the autograd nodes (Functions.h/.cpp), ADInplaceOrView, TraceType and the Python bindings, into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-c", _CODEGEN, *native_yaml(tree), str(out)], cwd=tree, check=True,
                   capture_output=True, text=True)
    return out


def native_header(tree: Path, include_dir: Path) -> Path:
    """``ATen/ops/_tanh_attention_native.h`` as PyTorch's per-operator-header codegen writes it: the kernel
    declaration the build expects TanhAttention.cpp to define."""
    import torchgen
    from torchgen import dest
    from torchgen.code_template import CodeTemplate
    from torchgen.gen import get_native_function_declarations

    parsed, f = parse(tree)
    decls = get_native_function_declarations(grouped_native_functions=[f], backend_indices=parsed.backend_indices,
                                             native_function_decl_gen=dest.compute_native_function_declaration)
    template = Path(torchgen.__file__).parent / "packaged/ATen/templates/NativeFunction.h"
    text = CodeTemplate.from_file(str(template)).substitute(
        generated_comment=f"@generated from {template.name} by upstream/validate.py",
        extra_includes="", native_function_declarations=decls)
    path = include_dir / "ATen/ops" / f"{OP}_native.h"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def added_lines(patch: Path, path: str) -> str:
    """The lines ``patch`` adds to ``path`` (the '+' lines of its hunks), as text."""
    out, current = [], None
    for line in patch.read_text(encoding="utf-8").splitlines(keepends=True):
        if line.startswith("diff --git "):
            current = line.split(" b/", 1)[1].strip()
        elif current == path and line.startswith("+") and not line.startswith("+++"):
            out.append(line[1:])
    return "".join(out)


def _write_if_changed(path: Path, text: str) -> str:
    """Write ``text`` unless ``path`` already holds it (an unchanged file keeps its mtime, so a cached ninja
    build of the extension stays valid across test sessions)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return str(path)


def extension_sources(final_tree: Path, work: Path, codegen_out: Path | None = None) -> dict:
    """Sources and flags for ``torch.utils.cpp_extension.load``, copied into ``work``: TanhAttention.cpp as the
    series leaves it, the lines the last patch adds to FunctionsManual.cpp (compiled in FunctionsManual.cpp's
    context, against the series' FunctionsManual.h, which shadows the wheel's), the generated kernel
    declaration header, and the test-only bindings; with ``codegen_out`` (the autograd codegen's output for the
    tree), also the generated node and Autograd kernel (``generated_autograd_tu``)."""
    include = work / "include"
    tmp_header = native_header(final_tree, work / "gen")
    _write_if_changed(include / "ATen/ops" / tmp_header.name, tmp_header.read_text())
    _write_if_changed(include / "torch/csrc/autograd/FunctionsManual.h",
                      (final_tree / "torch/csrc/autograd/FunctionsManual.h").read_text(encoding="utf-8"))
    part4 = patch_of("IV")
    inc = added_lines(part4, "torch/csrc/autograd/FunctionsManual.cpp")
    if not inc.strip():
        raise ValueError(f"{part4.name} adds nothing to FunctionsManual.cpp")
    _write_if_changed(include / "FunctionsManual_added.inc", inc)
    kernel = final_tree / "aten/src/ATen/native/TanhAttention.cpp"
    sources = [_write_if_changed(work / "src" / kernel.name, kernel.read_text(encoding="utf-8"))]
    for name in ("functions_manual_tu.cpp", "bindings.cpp"):
        sources.append(_write_if_changed(work / "src" / name, (HARNESS / name).read_text(encoding="utf-8")))
    if codegen_out is not None:
        sources.append(_write_if_changed(work / "src" / "generated_autograd.cpp", generated_autograd_tu(codegen_out)))
    return dict(sources=sources, extra_include_paths=[str(include)],
                extra_cflags=["-DAT_PER_OPERATOR_HEADERS", "-O1", "-Wall", "-Werror=return-type"])


def kernel_body(variable_type_cpp: str, op: str = OP) -> str:
    """The text of the generated VariableType kernel for ``op``."""
    m = re.search(rf"\n[^\n]* {op}\(c10::DispatchKeySet ks,.*?\n\}}\n", variable_type_cpp, re.S)
    if m is None:
        raise ValueError(f"no VariableType kernel for {op}")
    return m.group(0)


# ------------------------------------------------------------------ the generated autograd code, compiled
NODE = "TanhAttentionBackward0"

_REDISPATCH_SHIM = """
// A PyTorch build generates at::redispatch::_tanh_attention (RedispatchFunctions.h); the wheel has no such
// operator, so here it redispatches to the extension's upstream_attn::tanh_attention, whose only kernel is
// at::native::_tanh_attention (bindings.cpp).
namespace at::redispatch {
inline std::tuple<at::Tensor, at::Tensor> _tanh_attention(
    c10::DispatchKeySet ks, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  static auto op = c10::Dispatcher::singleton()
      .findSchemaOrThrow("upstream_attn::tanh_attention", "")
      .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&)>();
  return op.redispatch(ks, q, k, v);
}
} // namespace at::redispatch

// libtorch defines VariableType::unpack (VariableTypeManual.cpp) without exporting it; the same check here.
namespace torch::autograd::VariableType {
const at::Tensor& unpack(const at::Tensor& t, const char* name, int pos) {
  TORCH_CHECK(t.defined(), "Expected a proper Tensor but got None (or an undefined Tensor in C++) for argument #",
              pos, " '", name, "'");
  return t;
}
} // namespace torch::autograd::VariableType
"""


def node_struct(functions_h: str) -> str:
    """The generated ``struct TanhAttentionBackward0`` (with its ``_WIN32`` variant) from Functions.h."""
    m = re.search(rf"#ifdef _WIN32\nstruct {NODE} : .*?\n\}};\n", functions_h, re.S)
    if m is None:
        raise ValueError(f"no struct {NODE} in the generated Functions.h")
    return m.group(0)


def _functions_cpp_prelude(functions_cpp: str) -> str:
    """Functions.cpp's own text before its first node: the using-declarations, the opening of its namespace
    and the file-local helpers every node's apply uses."""
    start = functions_cpp.index("using namespace")
    end = re.search(r"\nstatic variable_list \w+_apply_functional\(", functions_cpp).start() + 1
    return functions_cpp[start:end]


def _node_methods(functions_cpp: str) -> str:
    start = functions_cpp.index(f"static variable_list {NODE}_apply_functional(")
    m = re.compile(r"\nstatic variable_list (?!" + NODE + r")\w+_apply_functional\(").search(functions_cpp, start)
    return functions_cpp[start:m.start() + 1 if m else len(functions_cpp)]


def _variable_type_helpers(variable_type_cpp: str) -> str:
    m = re.search(r"namespace\{\n\[\[maybe_unused\]\] void reset_grad_accumulator.*?\n\}\n\}\n", variable_type_cpp,
                  re.S)
    if m is None:
        raise ValueError("no helper block in the generated VariableType")
    return m.group(0)


def _includes(*generated: str) -> list[str]:
    """The ``#include`` lines the generated files start with, in order, once each."""
    seen: dict[str, None] = {}
    for text in generated:
        for line in text.splitlines():
            if line.startswith("namespace"):
                break
            if line.startswith("#include"):
                seen.setdefault(line)
    return list(seen)


def generated_autograd_tu(codegen_out: Path) -> str:
    """One C++ translation unit holding, verbatim, what the codegen generated for the op: the autograd node
    (its struct from Functions.h; apply, compiled_args, apply_with_saved from Functions.cpp) and the Autograd
    kernel from VariableType_*.cpp, registered for ``upstream_attn::tanh_attention``."""
    functions_h = (codegen_out / "Functions.h").read_text()
    functions_cpp = (codegen_out / "Functions.cpp").read_text()
    variable_type = read_generated(codegen_out, "VariableType_*.cpp")
    return "\n".join([
        "// @generated by upstream/validate.py from the autograd codegen's output for _tanh_attention",
        *_includes(functions_cpp, variable_type),
        '#include "torch/csrc/autograd/generated/Functions.h"',
        "#include <ATen/core/dispatch/Dispatcher.h>",
        _REDISPATCH_SHIM,
        "namespace torch::autograd::generated {",
        "using namespace torch::autograd::generated::details;",
        node_struct(functions_h),
        "} // namespace torch::autograd::generated",
        _functions_cpp_prelude(functions_cpp),
        _node_methods(functions_cpp),
        "} // namespace torch::autograd::generated",
        "using namespace at;",
        "using namespace torch::autograd::generated;",
        "using namespace torch::autograd::generated::details;",
        "namespace torch::autograd {",
        "namespace VariableType {",
        _variable_type_helpers(variable_type),
        "namespace {",
        kernel_body(variable_type),
        "} // namespace",
        "} // namespace VariableType",
        "} // namespace torch::autograd",
        "TORCH_LIBRARY_IMPL(upstream_attn, Autograd, m) {",
        '  m.impl("tanh_attention", TORCH_FN(torch::autograd::VariableType::_tanh_attention));',
        "}",
        "",
    ])
