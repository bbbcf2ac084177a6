"""upstream/: the pytorch/pytorch patch series (lab parts II-IV), validated without building PyTorch.

1. The committed patches are what ``upstream/make_patches.py`` generates from ``upstream/src`` (no hand-kept copy),
   and they apply in order with ``git am`` to the pristine files the installed wheel ships.
2. PyTorch's own codegen accepts the tree after each part, and the generated code says what the lab asks.
3. The C++ the series adds compiles against the wheel's headers and is right: gradcheck, gradgradcheck, forward
   AD, agreement with ``torch_impl.formulas``, the input contract, and ``python -m crosscheck`` on it.
4. The decomposition part IV adds (what test_decomp.py's HasDecompTest asks of an explicit op) is registered,
   listed among the core ATen decompositions, and agrees with the compiled kernel.

Needs git and (for 3) a C++ compiler; the series' base is the commit the torch 2.13.0 wheel was built from.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck
from torch.testing import assert_close

from torch_impl import formulas
from upstream import make_patches as mp
from upstream import validate as v
from tests.conftest import ROOT, attn_inputs


pytestmark = [
    pytest.mark.skipif(torch.version.git_version != mp.PYTORCH_COMMIT,
                       reason=f"the series is based on pytorch/pytorch@{mp.PYTORCH_COMMIT[:12]}, the commit torch "
                              f"2.13.0 was built from; this torch is {torch.version.git_version[:12]}"),
    pytest.mark.skipif(shutil.which("git") is None, reason="git is needed to apply the series"),
]

PART_FILES = {   # what each commit of the series touches
    "II": {"test/test_tanh_attention.py"},
    "III": {"aten/src/ATen/native/TanhAttention.cpp", "aten/src/ATen/native/native_functions.yaml",
            "torch/testing/_internal/common_methods_invocations.py", "test/test_namedtuple_return_api.py"},
    "IV": {"aten/src/ATen/native/native_functions.yaml", "aten/src/ATen/native/TanhAttention.cpp",
           "tools/autograd/derivatives.yaml",
           "tools/autograd/gen_variable_type.py",
           "torch/csrc/autograd/FunctionsManual.h", "torch/csrc/autograd/FunctionsManual.cpp",
           "torch/_decomp/decompositions.py", "torch/_decomp/__init__.py"},
}


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def series(tmp_path_factory):
    """The series applied with ``git am``; ``trees[part]`` holds the files after that part."""
    base = tmp_path_factory.mktemp("series")
    commits = v.apply_series(base / "repo")
    trees = {part: v.export(base / "repo", rev, base / part) for part, rev in zip(("II", "III", "IV"), commits[1:])}
    return types.SimpleNamespace(repo=base / "repo", commits=commits, trees=trees)


@pytest.fixture(scope="module")
def codegen(series, tmp_path_factory):
    """Autograd codegen output after part III and after part IV (computed once each, on demand)."""
    cache = {}

    def get(part):
        if part not in cache:
            cache[part] = v.run_autograd_codegen(series.trees[part], tmp_path_factory.mktemp(f"gen{part}"))
        return cache[part]
    return get


@pytest.fixture(scope="module")
def ext(series, codegen):
    """The series' C++ built as a torch extension, with the autograd codegen's generated node and kernel for
    the op (``validate.generated_autograd_tu``); the build directory survives sessions (under build/), so
    only changed sources recompile."""
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler: cannot build the series' C++ (CI has g++ and ninja)")
    from torch.utils import cpp_extension
    if not cpp_extension.is_ninja_available():
        pytest.skip("ninja is not available: torch.utils.cpp_extension needs it")
    work = ROOT / "build" / "upstream"
    kwargs = v.extension_sources(series.trees["IV"], work, codegen("IV"))
    # The module name carries a hash of the sources: a changed series never reuses a stale .so.
    digest = hashlib.sha256(b"".join(Path(s).read_bytes() for s in kwargs["sources"]) + torch.__version__.encode()
                            + (work / "include/FunctionsManual_added.inc").read_bytes()).hexdigest()[:10]
    build = work / "ext"
    build.mkdir(parents=True, exist_ok=True)
    module = cpp_extension.load(name=f"upstream_attn_{digest}", build_directory=str(build), verbose=False,
                                **kwargs)
    from upstream.harness import cpp_attn
    cpp_attn._ext = None
    cpp_attn.load(module.__file__)
    return types.SimpleNamespace(module=module, path=module.__file__, attn=cpp_attn.attn, op=cpp_attn.generated)


# --------------------------------------------------------------------------------------- 1. the series
def test_committed_patches_are_generated_from_upstream_src():
    stale = mp.check()
    assert stale == [], f"run `python -m upstream.make_patches`: {stale} differ from what upstream/src gives"


def test_series_applies_in_order_with_git_am(series):
    log = mp.git(series.repo, "log", "--reverse", "--format=%s", f"{series.commits[0]}..HEAD").stdout.splitlines()
    assert [re.search(r"part (II|III|IV)\b", s).group(1) for s in log] == ["II", "III", "IV"]
    for (part, files), parent, rev in zip(PART_FILES.items(), series.commits[:-1], series.commits[1:]):
        touched = set(mp.git(series.repo, "diff", "--name-only", parent, rev).stdout.split())
        assert touched == files, part


def test_upstream_readme_matches_the_series():
    """upstream/README.md names the series' base commit, one row per patch, and the files part IV touches."""
    text = (ROOT / "upstream" / "README.md").read_text(encoding="utf-8")
    assert f"**`{mp.PYTORCH_COMMIT}`**" in text and f"git checkout -b tanh-attention {mp.PYTORCH_COMMIT}" in text
    rows = re.findall(r"^\| `(\d{4})-…part-(II|III|IV)…` \|", text, flags=re.M)
    assert [(p.name[:4], part) for p, part in zip(v.patch_files(), PART_FILES)] == rows
    assert all(f"`{path}`" in text for path in ("torch/_decomp/decompositions.py", "torch/_decomp/__init__.py"))
    assert "python test/test_decomp.py -k" in text and "git am " in text and "--reset-author" in text


def test_hunks_on_files_the_wheel_lacks_apply_wherever_their_context_is(tmp_path):
    """FunctionsManual.cpp and test_namedtuple_return_api.py are not in the wheel: the series carries only
    their context lines (make_patches.STUBS).  git am must find them by content, not line number: here they
    sit 500 lines further down than in the stubs the patches were made from."""
    mp.pristine_tree(tmp_path)
    for path in mp.STUBS:
        f = tmp_path / path
        f.write_text("".join(f"# line {i}\n" for i in range(500)) + f.read_text())
    mp.git(tmp_path, "commit", "-q", "-am", "context moved")
    mp.git(tmp_path, "am", "--quiet", *map(str, v.patch_files()))
    assert "tanh_attention_backward" in (tmp_path / "torch/csrc/autograd/FunctionsManual.cpp").read_text()


def test_apply_to_checkout_makes_the_same_commits_as_git_am(series, tmp_path):
    """``make_patches --apply-to``, the fallback when git am stops, gives the tree git am gives, one commit a
    part, under the git identity of whoever runs it."""
    mp.pristine_tree(tmp_path)
    for key, value in (("user.name", "A Student"), ("user.email", "student@example.com")):
        subprocess.run(["git", "config", key, value], cwd=tmp_path, check=True)
    commits = mp.apply_to_checkout(tmp_path)
    assert len(commits) == 3
    tree = lambda repo, rev: mp.git(repo, "rev-parse", f"{rev}^{{tree}}").stdout.strip()  # noqa: E731
    for ours, theirs in zip(commits, series.commits[1:]):
        assert tree(tmp_path, ours) == tree(series.repo, theirs)
    assert mp.git(tmp_path, "log", "-1", "--format=%an <%ae>").stdout.strip() == "A Student <student@example.com>"
    (tmp_path / "dirty").write_text("")
    mp.git(tmp_path, "add", "dirty")
    with pytest.raises(ValueError, match="uncommitted changes"):
        mp.apply_to_checkout(tmp_path)


@pytest.mark.upstream
def test_part_ii_test_file_passes_on_the_installed_torch(series):
    """The part II file needs nothing the series adds elsewhere: run it as PyTorch's CI would (``python
    test/test_tanh_attention.py``, unittest under run_tests)."""
    test = series.trees["II"] / "test/test_tanh_attention.py"
    # Without CI in the environment: with CI=true (as our own CI sets it) run_tests switches to PyTorch CI's mode,
    # which writes XML reports through xmlrunner and reads PyTorch CI's disabled-test lists.
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    done = subprocess.run([sys.executable, str(test), "-v"], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = int(re.search(r"Ran (\d+) tests?", done.stderr).group(1))
    assert ran >= 20 and "skipped" not in done.stderr.splitlines()[-1], done.stderr[-2000:]


# ----------------------------------------------------------------------------------------- 2. codegen
def test_part_iii_is_composite_implicit_with_no_derivative(series, codegen):
    from torchgen.packaged.autograd.load_derivatives import load_derivatives
    tree = series.trees["III"]
    _, f = v.parse(tree)
    assert str(f.func) == "_tanh_attention(Tensor q, Tensor k, Tensor v) -> (Tensor o, Tensor a)"
    assert f.has_composite_implicit_autograd_kernel and not f.has_composite_explicit_autograd_kernel
    infos, _ = load_derivatives(str(tree / "tools/autograd/derivatives.yaml"), *v.native_yaml(tree))
    assert not any(str(sig.name) == "_tanh_attention" for sig in infos)
    out = codegen("III")
    assert "TanhAttentionBackward0" not in (out / "Functions.h").read_text()
    variable_type = v.read_generated(out, "VariableType_*.cpp")
    assert " _tanh_attention(c10::DispatchKeySet ks," not in variable_type   # a composite: autograd sees through it
    assert " _unique(c10::DispatchKeySet ks," in variable_type                # (the needle's form is the real one)
    python = v.read_generated(out, "python_torch_functions_*.cpp")
    assert '"_tanh_attention(Tensor q, Tensor k, Tensor v)"' in python        # torch._tanh_attention
    assert '{"o", ""}, {"a", ""}' in (out / "python_return_types.cpp").read_text()   # named (o, a)


def test_part_iv_is_explicit_and_its_node_saves_only_a_and_what_gradients_read(series, codegen):
    from torchgen.packaged.autograd.load_derivatives import load_derivatives
    tree = series.trees["IV"]
    _, f = v.parse(tree)
    assert f.has_composite_explicit_autograd_kernel and not f.has_composite_implicit_autograd_kernel
    infos, _ = load_derivatives(str(tree / "tools/autograd/derivatives.yaml"), *v.native_yaml(tree))
    [info] = [i["Default"] for sig, i in infos.items() if str(sig.name) == "_tanh_attention"]
    assert {str(s.nctype.name) for s in info.all_saved_inputs} == {"q", "k", "v"}
    assert {str(s.nctype.name) for s in info.all_saved_outputs} == {"a"}           # the output, never x
    out = codegen("IV")
    node = v.node_struct((out / "Functions.h").read_text())
    assert sorted(re.findall(r"SavedVariable (\w+);", node)) == ["a_", "k_", "q_", "v_"]
    kernel = v.kernel_body(v.read_generated(out, "VariableType_*.cpp"))
    # wrap_opt_if: k is saved only for grad q (output 0), q only for grad k, v for either; a as an output.
    assert re.search(r"if \(grad_fn->should_compute_output\(0\)\) \{\s*grad_fn->k_ = SavedVariable\(k, false\)", kernel)
    assert re.search(r"if \(grad_fn->should_compute_output\(1\)\) \{\s*grad_fn->q_ = SavedVariable\(q, false\)", kernel)
    assert re.search(r"if \(grad_fn->should_compute_output\(0\) \|\| grad_fn->should_compute_output\(1\)\) "
                     r"\{\s*grad_fn->v_ = SavedVariable\(v, false\)", kernel)
    assert "grad_fn->a_ = SavedVariable(a, true)" in kernel
    assert "throw_error_for_complex_autograd" not in kernel          # GRADIENT_IMPLEMENTED_FOR_COMPLEX
    # backward: both incoming gradients as they are (undefined when unused), and the mask
    functions = (out / "Functions.cpp").read_text()
    assert ("tanh_attention_backward(grads[0], grads[1], wrap_opt_if(q, grad_input_mask[1]), "
            "wrap_opt_if(k, grad_input_mask[0]), wrap_opt_if(v, grad_input_mask[0] || grad_input_mask[1]), "
            "a, grad_input_mask)") in functions
    # forward AD: one formula for both outputs, each tangent set only when defined
    assert "o_a_new_fw_grad_opt = tanh_attention_jvp(q_p, k_p, v_p, a, q_t, k_t, v_t);" in kernel
    for name, index in (("o", 0), ("a", 1)):
        assert re.search(rf"std::get<{index}>\(o_a_new_fw_grad_opt.value\(\)\).defined\(\)\s*&& {name}.defined\(\)\) "
                         rf"\{{\s*{name}._set_fw_grad\(", kernel), name


def test_opinfo_entry_samples_and_errors_hold_for_the_kernel(series, ext):
    """The OpInfo the series adds to common_methods_invocations.py, built with its op bound to the compiled
    kernel (``torch._tanh_attention`` exists only in a build): its samples gradcheck, its error inputs raise
    what they claim."""
    from torch.testing._internal.common_methods_invocations import (  # noqa: F401  (names the snippet uses)
        DecorateInfo, ErrorInput, OpInfo, SampleInput, floating_and_complex_types_and, make_tensor, partial)
    patch = v.patch_of("III")
    added = v.added_lines(patch, "torch/testing/_internal/common_methods_invocations.py")
    namespace = dict(DecorateInfo=DecorateInfo, ErrorInput=ErrorInput, OpInfo=OpInfo, SampleInput=SampleInput,
                     floating_and_complex_types_and=floating_and_complex_types_and, make_tensor=make_tensor,
                     partial=partial, torch=torch)
    functions, entry = added.split("    OpInfo(", 1)
    exec(compile(functions, "common_methods_invocations.py (series)", "exec"), namespace)
    in_tree = types.SimpleNamespace(**{**vars(torch), "_tanh_attention": torch.ops.upstream_attn.tanh_attention})
    op = eval(compile(ast.parse("OpInfo(" + entry.rstrip().rstrip(","), mode="eval"), "entry", "eval"),
              {**namespace, "torch": in_tree})
    assert op.supports_autograd and op.supports_gradgrad and op.supports_forward_ad and op.supports_fwgrad_bwgrad
    assert not op.supports_out
    samples = list(op.sample_inputs("cpu", torch.float64, requires_grad=True))
    assert len(samples) >= 10
    for s in samples:     # the OpInfo's own op: the compiled kernel behind the codegen's generated Autograd kernel
        inputs = (s.input, *s.args)
        assert gradcheck(lambda *x: op(*x), inputs, check_forward_ad=True, check_batched_grad=True)
        assert gradgradcheck(lambda *x: op(*x), inputs, check_fwd_over_rev=True)
    errors = list(op.error_inputs("cpu"))
    assert len(errors) == 7
    for e in errors:
        with pytest.raises(e.error_type, match=e.error_regex):
            op(e.sample_input.input, *e.sample_input.args)


# ------------------------------------------------------------------------------------------- 3. the C++
SHAPES = ((2, 3, 4), (1, 1, 1), (4, 2, 5), (0, 3, 4), (3, 0, 4), (3, 3, 0))


def _inputs(n, d, e, dtype, requires_grad=True, seed=0):
    return tuple(attn_inputs(n, d, e, dtype, requires_grad=requires_grad, seed=seed, uniform=True))


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
@pytest.mark.parametrize("shape", SHAPES)
def test_cpp_gradcheck_gradgradcheck_forward_ad(ext, dtype, shape):
    inputs = _inputs(*shape, dtype)
    assert gradcheck(ext.attn, inputs, check_forward_ad=True, check_batched_grad=True)
    assert gradgradcheck(ext.attn, inputs, check_fwd_over_rev=True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_cpp_backward_and_jvp_agree_with_torch_impl_formulas(ext, dtype):
    q, k, v_, = _inputs(3, 2, 4, dtype, (False, False, False))
    a = torch.tanh(q @ k.mT)
    g_o, g_a = torch.randn(3, 4, dtype=dtype), torch.randn(3, 3, dtype=dtype)
    masks = [(m >> 2 & 1 == 1, m >> 1 & 1 == 1, m & 1 == 1) for m in range(1, 8)]
    # With grad mode on (as under create_graph) and off (the in-place tanh_backward branch may run).
    for grad_mode in (True, False):
        with torch.set_grad_enabled(grad_mode):
            for grads in ((g_o, g_a), (g_o, None), (None, g_a), (None, None)):
                for mask in masks:
                    kept = [g.clone() for g in grads if g is not None]
                    cpp = ext.module.backward(*grads, q if mask[1] else None, k if mask[0] else None,
                                              v_ if (mask[0] or mask[1]) else None, a, list(mask))
                    py = formulas.attn_backward(*grads, q, k, v_, a, mask)
                    # defined exactly when requested and reached by an incoming gradient: never zeros
                    reached = (grads[0] is not None or grads[1] is not None,) * 2 + (grads[0] is not None,)
                    for c, p, wanted, reach in zip(cpp, py, mask, reached):
                        assert (c is not None) == (wanted and reach), (grads, mask)
                        if c is not None:
                            assert_close(c, p, rtol=1e-12, atol=1e-12)
                    # the caller's gradients are never written to (only the formula's own buffers are)
                    assert all(torch.equal(g, k_) for g, k_ in zip((g for g in grads if g is not None), kept))
    tangents = [torch.randn_like(t) for t in (q, k, v_)]
    for present in masks:
        t = [x if keep else None for x, keep in zip(tangents, present)]
        o_dot, a_dot = ext.module.jvp(q, k, v_, a, *t)
        ref_o, ref_a = formulas.attn_jvp(q, k, v_, a, *t)
        assert_close(o_dot, ref_o, rtol=1e-12, atol=1e-12)
        if present[0] or present[1]:
            assert_close(a_dot, ref_a, rtol=1e-12, atol=1e-12)
        else:
            assert a_dot is None            # the generated kernel then leaves a's tangent unset: no zeros
        # The generated kernel passes _efficientzerotensor for an input without a tangent: same result.
        zt = [x if keep else torch._efficientzerotensor(y.shape, dtype=dtype)
              for x, y, keep in zip(t, (q, k, v_), present)]
        o_z, a_z = ext.module.jvp(q, k, v_, a, *zt)
        assert_close(o_z, o_dot, rtol=0, atol=0)
        assert (a_z is None) == (a_dot is None)


def test_cpp_backward_in_place_path_and_graph_path_agree(ext):
    """With create_graph=False tanh_backward runs in place on the addmm buffer; with create_graph=True it
    must not (the graph would see the write): both give the same gradients."""
    inputs = _inputs(4, 3, 5, torch.float64)
    o, a = ext.attn(*inputs)
    loss = (o * torch.randn_like(o)).sum() + (a * torch.randn_like(a)).sum()
    plain = torch.autograd.grad(loss, inputs, retain_graph=True)
    graphed = torch.autograd.grad(loss, inputs, create_graph=True)
    assert all(g.grad_fn is not None for g in graphed)
    for p, g in zip(plain, graphed):
        assert_close(p, g.detach(), rtol=0, atol=0)


def test_cpp_kernel_runs_on_meta(ext):
    """CompositeExplicitAutograd is one kernel for every backend, Meta included (FakeTensor, compile, export)."""
    q, k, v_ = (torch.empty(s, device="meta") for s in ((5, 3), (5, 3), (5, 7)))
    o, a = torch.ops.upstream_attn.tanh_attention(q, k, v_)
    assert (o.shape, a.shape, o.device.type) == ((5, 7), (5, 5), "meta")


BAD = [
    ((2, 3, 1), (2, 3), (2, 4), {}, ValueError, r"argument 'q' must be 2-D \(n, d\), got 3-D with shape \[2, 3, 1\]"),
    ((2, 3), (3,), (2, 4), {}, ValueError, r"argument 'k' must be 2-D \(n, d\), got 1-D"),
    ((2, 3), (2, 3), (), {}, ValueError, r"argument 'v' must be 2-D \(n, e\), got 0-D"),
    ((2, 3), (2, 5), (2, 4), {}, ValueError,
     r"q and k must have the same second dimension d, got q \[2, 3\] and k \[2, 5\]"),
    ((2, 3), (3, 3), (2, 4), {}, ValueError, r"must have the same first dimension n"),
    ((2, 3), (2, 3), (5, 4), {}, ValueError, r"must have the same first dimension n"),
    ((2, 3), (2, 3), (2, 4), {"q": torch.int64}, TypeError,
     r"argument 'q' must have a floating-point or complex dtype"),
    ((2, 3), (2, 3), (2, 4), {"v": torch.bool}, TypeError, r"argument 'v' must have a floating-point or complex dtype"),
    ((2, 3), (2, 3), (2, 4), {"k": torch.complex32}, TypeError, r"argument 'k' must have a floating-point"),
    ((2, 3), (2, 3), (2, 4), {"k": torch.float64}, TypeError, r"q, k and v must have the same dtype"),
]


@pytest.mark.parametrize("q_shape,k_shape,v_shape,dtypes,error,message", BAD)
def test_cpp_kernel_rejects_bad_input_naming_the_argument(ext, q_shape, k_shape, v_shape, dtypes, error, message):
    args = [torch.zeros(s, dtype=dtypes.get(n, torch.float32)) for n, s in zip("qkv", (q_shape, k_shape, v_shape))]
    with pytest.raises(error, match=r"^_tanh_attention\(\): .*" + message):
        torch.ops.upstream_attn.tanh_attention(*args)


def test_cpp_kernel_rejects_mixed_devices(ext):
    with pytest.raises(ValueError, match=r"^_tanh_attention\(\): q, k and v must be on the same device, "
                                         r"got q cpu, k cpu and v meta"):
        torch.ops.upstream_attn.tanh_attention(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 4, device="meta"))


def _crosscheck(ext, attr):
    """``python -m crosscheck --torch-impl upstream/harness/cpp_attn.py:<attr>`` on the built extension."""
    env = {**os.environ, "ATTN_UPSTREAM_EXT": ext.path}
    done = subprocess.run([sys.executable, "-m", "crosscheck", "--torch-impl", f"upstream/harness/cpp_attn.py:{attr}",
                           "--frameworks", "torch", "-q"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    compared = int(re.search(r"OK: all (\d+) comparisons agree", done.stdout).group(1))
    assert compared > 1000, done.stdout[-2000:]          # the default run, not an empty one


def test_crosscheck_accepts_the_cpp_implementation(ext):
    """The project's independent check, as a student would run it on their solution."""
    _crosscheck(ext, "CppAttn")

# ---------------------------------------------------------- 4. the generated node and kernel, end to end
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
@pytest.mark.parametrize("shape", SHAPES)
def test_generated_autograd_gradcheck_gradgradcheck_forward_ad(ext, dtype, shape):
    """The derivatives.yaml entry end to end: the op's Autograd kernel is the codegen's VariableType kernel,
    its node the generated TanhAttentionBackward0, which calls tanh_attention_backward; forward AD runs the
    generated call to tanh_attention_jvp."""
    inputs = _inputs(*shape, dtype)
    o, a = ext.op(*inputs)
    assert o.grad_fn.name() == "TanhAttentionBackward0" and a.grad_fn is o.grad_fn
    assert gradcheck(ext.op, inputs, check_forward_ad=True, check_batched_grad=True)
    assert gradgradcheck(ext.op, inputs, check_fwd_over_rev=True)


@pytest.mark.parametrize("requires_grad", [(True, False, False), (False, True, False), (False, False, True),
                                           (True, True, False), (True, True, True)])
def test_generated_node_saves_a_and_only_the_inputs_gradients_read(ext, requires_grad):
    q, k, v_ = _inputs(3, 2, 4, torch.float64, requires_grad)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        o, a = ext.op(q, k, v_)
    need_q, need_k, _ = requires_grad
    expected = [t for t, keep in ((k, need_q), (q, need_k), (v_, need_q or need_k)) if keep] + [a]
    assert [(t.data_ptr(), t.shape) for t in saved] == [(t.data_ptr(), t.shape) for t in expected]
    grads = torch.autograd.grad((o.sum() + a.sum()), [t for t in (q, k, v_) if t.requires_grad])
    assert len(grads) == sum(requires_grad)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_generated_node_unused_output_and_reference_agree(ext, dtype):
    inputs = _inputs(3, 2, 4, dtype)
    for pick in (lambda o, a: o.abs().sum(), lambda o, a: a.abs().sum(), lambda o, a: (o.abs().sum() + a.abs().sum())):
        ref_a = torch.tanh(inputs[0] @ inputs[1].mT)
        ref = torch.autograd.grad(pick(ref_a @ inputs[2], ref_a), inputs, allow_unused=True)
        got = torch.autograd.grad(pick(*ext.op(*inputs)), inputs, allow_unused=True)
        for g, r in zip(got, ref):
            # a alone does not depend on v: the reference's grad of v is None, and our node's is undefined (None)
            assert (g is None) == (r is None)
            if g is not None:
                assert_close(g, r, rtol=1e-12, atol=1e-12)


def test_crosscheck_accepts_the_generated_autograd(ext):
    _crosscheck(ext, "generated")


# ------------------------------------------------------------------ 5. the decomposition (test_decomp.py)
def _core_decomposition_names(tree: Path) -> set[str]:
    """The ``aten.<name>`` entries of ``_core_aten_decompositions_post_autograd`` in the tree's torch/_decomp."""
    module = ast.parse((tree / "torch/_decomp/__init__.py").read_text(encoding="utf-8"))
    [fn] = [n for n in module.body
            if isinstance(n, ast.FunctionDef) and n.name == "_core_aten_decompositions_post_autograd"]
    return {n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "aten"}


@pytest.fixture(scope="module")
def decomposition(ext):
    """The lines patch IV adds to torch/_decomp/decompositions.py, run with ``aten._tanh_attention`` bound to the
    compiled op and registered into a table of their own (torch's global table is left alone)."""
    from torch._decomp import register_decomposition
    added = v.added_lines(v.patch_of("IV"), "torch/_decomp/decompositions.py")
    table: dict = {}
    namespace = dict(torch=torch, Tensor=torch.Tensor,
                     aten=types.SimpleNamespace(_tanh_attention=torch.ops.upstream_attn.tanh_attention),
                     register_decomposition=lambda op: register_decomposition(op, registry=table))
    exec(compile(added, "torch/_decomp/decompositions.py (series)", "exec"), namespace)   # noqa: S102
    return table


def test_decomposition_is_registered_and_core(series, decomposition):
    """HasDecompTest.test_has_decomposition: every aten op that is not CompositeImplicitAutograd needs a
    decomposition (or an expect-file line); test_aten_core_operators: a decomposition not among the core ATen
    decompositions declares its op core ATen (another expect file).  Part IV satisfies both."""
    op = torch.ops.upstream_attn.tanh_attention.default
    assert not op.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd)   # it wants one
    assert list(decomposition) == [op]
    assert "_tanh_attention" in _core_decomposition_names(series.trees["IV"])
    assert "_tanh_attention" not in _core_decomposition_names(series.trees["III"])
    text = (series.trees["IV"] / "torch/_decomp/decompositions.py").read_text(encoding="utf-8")
    ast.parse(text)
    assert text.count("@register_decomposition(aten._tanh_attention)") == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex128])
@pytest.mark.parametrize("shape", SHAPES)
def test_decomposition_traces_to_core_ops_and_agrees_with_the_kernel(ext, decomposition, dtype, shape):
    from torch.fx.experimental.proxy_tensor import make_fx
    op = torch.ops.upstream_attn.tanh_attention
    inputs = _inputs(*shape, dtype, (False, False, False))
    graph = make_fx(lambda q, k, v_: op(q, k, v_), decomposition_table=decomposition)(*inputs)
    called = {str(n.target) for n in graph.graph.nodes if n.op == "call_function"}
    assert called <= {"aten.mm.default", "aten.tanh.default", "aten.t.default", "aten.permute.default",
                      "aten.transpose.int"}, called
    assert {"aten.mm.default", "aten.tanh.default"} <= called
    for got, want in zip(graph(*inputs), op(*inputs)):
        assert_close(got, want, rtol=1e-6 if dtype == torch.float32 else 1e-13, atol=1e-6)
    # Backward through the decomposition's ops (what test_decomp's backward checks compare) = the node's
    grad_inputs = [t.detach().requires_grad_() for t in inputs]
    cotangents = (torch.randn(shape[0], shape[2], dtype=dtype), torch.randn(shape[0], shape[0], dtype=dtype))
    want = torch.autograd.grad(ext.op(*grad_inputs), grad_inputs, cotangents)
    got = torch.autograd.grad(decomposition[op.default](*grad_inputs), grad_inputs, cotangents)
    for g, w in zip(got, want):
        assert_close(g, w, rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=1e-5)


@pytest.mark.parametrize("q_shape,k_shape,v_shape,dtypes,error,message", BAD)
def test_decomposition_rejects_bad_input_as_the_kernel_does(decomposition, q_shape, k_shape, v_shape, dtypes, error,
                                                             message):
    """Same exception type as the kernel (BAD above), naming the same argument when the kernel names one."""
    args = [torch.zeros(s, dtype=dtypes.get(n, torch.float32)) for n, s in zip("qkv", (q_shape, k_shape, v_shape))]
    named = re.search(r"argument '(\w)'", message)
    with pytest.raises(error, match=r"^_tanh_attention\(\): " + (f"argument '{named.group(1)}'" if named else "")):
        decomposition[torch.ops.upstream_attn.tanh_attention.default](*args)


def test_decomposition_rejects_mixed_devices(decomposition):
    with pytest.raises(ValueError, match=r"^_tanh_attention\(\): q, k and v must be on the same device"):
        decomposition[torch.ops.upstream_attn.tanh_attention.default](
            torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 4, device="meta"))
