"""Build the pytorch/pytorch patch series in ``upstream/patches/`` from the sources in ``upstream/src/``.

The series is *generated*, never edited by hand: each lab part is a list of edits (a new file, or text
inserted at an anchor of an existing file), applied to pristine copies of the files it touches and committed
with git, then written out with ``git format-patch``.  The pristine copies come from the installed torch
wheel, which ships them as of the commit it was built from (``PYTORCH_COMMIT``).  Two files the series
touches are not in the wheel; for those, ``STUBS`` holds only the lines our hunks use as context, as read
from pytorch/pytorch (see ``upstream/README.md``): ``git am`` finds them by content, at whatever line they
are in the real file.

    python -m upstream.make_patches           # rewrite upstream/patches/
    python -m upstream.make_patches --check   # exit 1 if upstream/patches/ differs from what the sources give
    python -m upstream.make_patches --apply-to ~/pytorch   # commit the edits in a checkout, when git am fails

``tests/upstream/test_upstream.py`` runs the check, applies the series with ``git am``, runs PyTorch's codegen on the
result, and compiles and tests the C++.
"""

from __future__ import annotations

import argparse
import dataclasses
import filecmp
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE / "src"
PATCHES = HERE / "patches"

# The commit the installed torch 2.13.0 wheel was built from (``torch.version.git_version``).
PYTORCH_COMMIT = "cf30153c4c131c8164ee7798e5022d810682e2cb"

# Fixed identity and dates: the series (including its commit hashes) is a pure function of its inputs.
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "Autograd Lab", "GIT_AUTHOR_EMAIL": "autograd-lab@example.com",
    "GIT_COMMITTER_NAME": "Autograd Lab", "GIT_COMMITTER_EMAIL": "autograd-lab@example.com",
    "GIT_AUTHOR_DATE": "2026-11-23T12:00:00+00:00", "GIT_COMMITTER_DATE": "2026-11-23T12:00:00+00:00",
    "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent",
}


# ------------------------------------------------------------------------------------------ pristine files
def _torch_dir() -> Path:
    import torch
    return Path(torch.__file__).resolve().parent


def _torchgen_dir() -> Path:
    import torchgen
    return Path(torchgen.__file__).resolve().parent


def _unwrap_installed_header(text: str) -> str:
    """The wheel's installer wraps every header in ``#if !defined(TORCH_STABLE_ONLY) && ...`` / ``#else
    #error ... #endif``; the source tree's header is what lies between."""
    lines = text.splitlines(keepends=True)
    if lines and lines[0].startswith("#if !defined(TORCH_STABLE_ONLY)"):
        end = max(i for i, line in enumerate(lines) if line.startswith("#else"))
        text = "".join(lines[1:end]).rstrip("\n") + "\n"
    return text


def wheel_files() -> dict[str, str]:
    """In-tree path -> pristine text, for every file of the series that the installed wheel ships."""
    tg, th = _torchgen_dir(), _torch_dir()
    read = lambda p: p.read_text(encoding="utf-8")  # noqa: E731
    return {
        "aten/src/ATen/native/native_functions.yaml": read(tg / "packaged/ATen/native/native_functions.yaml"),
        "aten/src/ATen/native/tags.yaml": read(tg / "packaged/ATen/native/tags.yaml"),
        "tools/autograd/derivatives.yaml": read(tg / "packaged/autograd/derivatives.yaml"),
        "tools/autograd/gen_variable_type.py": read(tg / "packaged/autograd/gen_variable_type.py"),
        "torch/csrc/autograd/FunctionsManual.h":
            _unwrap_installed_header(read(th / "include/torch/csrc/autograd/FunctionsManual.h")),
        "torch/testing/_internal/common_methods_invocations.py":
            read(th / "testing/_internal/common_methods_invocations.py"),
        "torch/_decomp/__init__.py": read(th / "_decomp/__init__.py"),
        "torch/_decomp/decompositions.py": read(th / "_decomp/decompositions.py"),
    }


# Files the wheel lacks: only the lines our hunks anchor on and use as context.  Read from pytorch/pytorch
# (FunctionsManual.cpp at 002ca67, test_namedtuple_return_api.py from a recent main); not checkable here.
# Each starts with a "..." line so that no hunk claims line 1 (git apply pins a hunk at line 1 to the file's
# start); "..." never lands in a hunk's three context lines.
STUBS = {
    "torch/csrc/autograd/FunctionsManual.cpp": (
        "...\n"
        "  }\n"
        "  return grad_self;\n"
        "}\n"
        "\n"
        "} // namespace torch::autograd::generated::details\n"
    ),
    "test/test_namedtuple_return_api.py": (
        "...\n"
        "path = os.path.dirname(os.path.realpath(__file__))\n"
        "aten_native_yaml = os.path.join(path, '../aten/src/ATen/native/native_functions.yaml')\n"
        "all_operators_with_namedtuple_return = {\n"
        "    'max', 'min', 'aminmax', 'median', 'nanmedian', 'mode', 'kthvalue', 'svd',\n"
        "    'qr', 'geqrf', 'slogdet', 'sort', 'topk', 'linalg_inv_ex',\n"
        "    'triangular_solve', 'cummax', 'cummin', 'linalg_eigh', \"_linalg_eigh\", \"_unpack_dual\", 'linalg_qr',\n"
        "...\n"
        "        per_channel_zp = torch.zeros(5, dtype=torch.int64)\n"
        "\n"
        "        op = namedtuple('op', ['operators', 'input', 'names', 'hasout'])\n"
        "        operators = [\n"
        "            op(operators=['max', 'min', 'median', 'nanmedian', 'mode', 'sort', 'topk', 'cummax', 'cummin'], "
        "input=(0,),\n"
        "               names=('values', 'indices'), hasout=True),\n"
        "            op(operators=['kthvalue'], input=(1, 0),\n"
    ),
}


# ------------------------------------------------------------------------------------------------ edits
@dataclasses.dataclass(frozen=True)
class NewFile:
    path: str                      # in-tree path; the text is upstream/src/<path>

    def apply(self, tree: Path) -> None:
        dst = tree / self.path
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SRC / self.path, dst)


@dataclasses.dataclass(frozen=True)
class Insert:
    """Insert ``text`` (or the text of upstream/src/<source>) right after (``before=False``) or before the one
    place where the whole lines ``anchor`` stand in ``path``."""
    path: str
    anchor: str
    text: str = ""
    source: str = ""
    before: bool = False

    def apply(self, tree: Path) -> None:
        dst = tree / self.path
        old = dst.read_text(encoding="utf-8")
        anchor = self.anchor + "\n"
        hits = [m.start() for m in re.finditer(re.escape(anchor), old) if m.start() == 0 or old[m.start() - 1] == "\n"]
        if len(hits) != 1:
            raise ValueError(f"{self.path}: anchor {self.anchor!r} found {len(hits)} times, expected once")
        text = (SRC / self.source).read_text(encoding="utf-8") if self.source else self.text
        at = hits[0] if self.before else hits[0] + len(anchor)
        dst.write_text(old[:at] + text + old[at:], encoding="utf-8")


@dataclasses.dataclass(frozen=True)
class Replace:
    """Replace the one occurrence of ``old`` in ``path`` with ``new``."""
    path: str
    old: str
    new: str

    def apply(self, tree: Path) -> None:
        dst = tree / self.path
        text = dst.read_text(encoding="utf-8")
        if text.count(self.old) != 1:
            raise ValueError(f"{self.path}: {self.old!r} found {text.count(self.old)} times, expected once")
        dst.write_text(text.replace(self.old, self.new), encoding="utf-8")


@dataclasses.dataclass(frozen=True)
class Part:
    subject: str
    body: str
    edits: tuple


NATIVE = "aten/src/ATen/native/native_functions.yaml"
OPINFO = "torch/testing/_internal/common_methods_invocations.py"
NAMEDTUPLE_TEST = "test/test_namedtuple_return_api.py"
DECOMPOSITIONS = "torch/_decomp/decompositions.py"
CORE_DECOMPOSITIONS = "torch/_decomp/__init__.py"

SERIES = (
    Part(
        "Autograd lab part II: tanh attention as a custom autograd.Function",
        "A test-only torch.autograd.Function for the lab's operator\n"
        "    x = q @ k.T; a = tanh(x); o = a @ v; return o, a\n"
        "with a hand-written backward (saves the output a, never x; no zeros for an\n"
        "unused output; only the needed gradients) and jvp, checked with gradcheck,\n"
        "gradgradcheck and forward AD in float64 and complex128 on every device.\n"
        "\n"
        "test/test_tanh_attention.py is picked up by run_test.py through\n"
        "tools/testing/discover_tests.py (every test/**/test_*.py outside the\n"
        "blocklisted prefixes), so no run_test.py change is needed.\n",
        (NewFile("test/test_tanh_attention.py"),),
    ),
    Part(
        "Autograd lab part III: _tanh_attention as CompositeImplicitAutograd, with an OpInfo",
        "_tanh_attention(Tensor q, Tensor k, Tensor v) -> (Tensor o, Tensor a)\n"
        "as a CompositeImplicitAutograd native function: autograd differentiates\n"
        "its mm/tanh/mm decomposition. The kernel checks the lab's input contract\n"
        "first (2-D q (n, d), k (n, d), v (n, e); one n; one floating or complex\n"
        "dtype; one device) and names the offending argument.\n"
        "\n"
        "The OpInfo has sample inputs (empty sizes, d != e, non-contiguous and\n"
        "transposed inputs, some inputs not requiring grad) and error inputs.\n"
        "The named returns are added to test_namedtuple_return_api.py's allowlist.\n",
        (
            NewFile("aten/src/ATen/native/TanhAttention.cpp"),
            Insert(NATIVE, "# What's a thnn_conv_ versus a slow_conv_?", before=True,
                   source="aten/src/ATen/native/native_functions.yaml.insert"),
            Insert(OPINFO, "def sample_inputs_scaled_dot_product_attention(op_info, device, dtype, requires_grad, "
                           "**kwargs):",
                   before=True, source="torch/testing/_internal/common_methods_invocations.samples.insert"),
            Insert(OPINFO, "    OpInfo(\n        'nn.functional.scaled_dot_product_attention',", before=True,
                   source="torch/testing/_internal/common_methods_invocations.opinfo.insert"),
            Insert(NAMEDTUPLE_TEST, "all_operators_with_namedtuple_return = {",
                   text="    '_tanh_attention',\n"),
            Insert(NAMEDTUPLE_TEST, "        operators = [",
                   text="            op(operators=['_tanh_attention'], input=(a, a), names=('o', 'a'), "
                        "hasout=False),\n"),
        ),
    ),
    Part(
        "Autograd lab part IV: explicit _tanh_attention with derivatives.yaml formulas",
        "Switch _tanh_attention to CompositeExplicitAutograd (whose kernel, now\n"
        "below autograd, applies tanh in place on the fresh scores) and give it its own\n"
        "derivatives: tanh_attention_backward (VJP) and tanh_attention_jvp (forward\n"
        "AD) in FunctionsManual.cpp, one static function per block (scores, tanh,\n"
        "mix), see Note [Tanh attention gradients].\n"
        "\n"
        "The node saves the output a (never x = q k^T, tanh is not recomputed) and\n"
        "q, k, v only when a requested gradient reads them (wrap_opt_if); an\n"
        "undefined output gradient is skipped, never materialised as zeros; only the\n"
        "gradients in grad_input_mask are computed; G_O V^H + G_A is one addmm and\n"
        "tanh_backward then runs in place on that buffer when no graph is built.\n"
        "Double backward differentiates the formula's ATen ops. The op joins\n"
        "GRADIENT_IMPLEMENTED_FOR_COMPLEX: the formulas follow the conjugate\n"
        "Wirtinger convention and are gradchecked in complex128.\n"
        "\n"
        "An explicit op is opaque to the tracers, so it gets a decomposition\n"
        "(mm, tanh, mm, with the kernel's input checks) in torch/_decomp and joins\n"
        "the core ATen decompositions: inductor and export lower it to core ATen\n"
        "ops, and test_decomp's HasDecompTest (test_has_decomposition,\n"
        "test_aten_core_operators) passes with no expect-file change.\n",
        (
            Insert(NATIVE, "- func: _tanh_attention(Tensor q, Tensor k, Tensor v) -> (Tensor o, Tensor a)",
                   text="  dispatch:\n    CompositeExplicitAutograd: _tanh_attention\n"),
            Replace("aten/src/ATen/native/TanhAttention.cpp",
                    "  auto a = at::tanh(at::mm(q, k.mT())); // (1), (2)\n",
                    "  // Below autograd, tanh can overwrite the fresh scores: one n x n buffer, not two.\n"
                    "  auto a = at::mm(q, k.mT()).tanh_(); // (1), (2)\n"),
            Insert("tools/autograd/derivatives.yaml", "- name: tanh(Tensor self) -> Tensor", before=True,
                   source="tools/autograd/derivatives.yaml.insert"),
            Insert("torch/csrc/autograd/FunctionsManual.h",
                   "Tensor values_backward(const Tensor& grad, const Tensor& self);", before=True,
                   source="torch/csrc/autograd/FunctionsManual.h.insert"),
            Insert("tools/autograd/gen_variable_type.py", '    "tanh_backward",', text='    "_tanh_attention",\n'),
            Insert("torch/csrc/autograd/FunctionsManual.cpp",
                   "} // namespace torch::autograd::generated::details", before=True,
                   source="torch/csrc/autograd/FunctionsManual.cpp.insert"),
            Insert(DECOMPOSITIONS, "@register_decomposition(aten.sigmoid_backward)", before=True,
                   source="torch/_decomp/decompositions.py.insert"),
            Insert(CORE_DECOMPOSITIONS, "            aten.take,", text="            aten._tanh_attention,\n"),
        ),
    ),
)


# ---------------------------------------------------------------------------------------------- git work
def git(tree: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, **_GIT_ENV}
    return subprocess.run(["git", "-c", "init.defaultBranch=main", "-c", "core.autocrlf=false", *args],
                          cwd=tree, env=env, check=check, capture_output=True, text=True)


def codegen_files() -> dict[str, str]:
    """The rest of ``tools/autograd`` (the wheel ships it as ``torchgen/packaged/autograd``), so the tree can run
    its own autograd codegen the way PyTorch's build does: ``from tools.autograd.gen_autograd import ...``."""
    pkg = _torchgen_dir() / "packaged/autograd"
    files = {"tools/__init__.py": ""}
    for p in sorted(pkg.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            files[f"tools/autograd/{p.relative_to(pkg).as_posix()}"] = p.read_text(encoding="utf-8")
    return files


def pristine_tree(tree: Path, with_stubs: bool = True) -> None:
    """A git repository at ``tree`` holding the pristine files (and the stubs) at their in-tree paths, with
    the rest of the autograd codegen beside them."""
    files = {**codegen_files(), **wheel_files()}
    if with_stubs:
        files.update(STUBS)
    for path, text in files.items():
        dst = tree / path
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(text, encoding="utf-8")
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", f"pristine files of pytorch/pytorch@{PYTORCH_COMMIT[:12]} (from the wheel)")


def apply_part(tree: Path, part: Part) -> None:
    for edit in part.edits:
        edit.apply(tree)


def write_series(out: Path) -> list[Path]:
    """Generate the series into ``out`` (created or emptied); return the patch files in order."""
    with tempfile.TemporaryDirectory(prefix="attn-upstream-") as tmp:
        tree = Path(tmp)
        pristine_tree(tree)
        for part in SERIES:
            apply_part(tree, part)
            git(tree, "add", "-A")
            git(tree, "commit", "-q", "-m", f"{part.subject}\n\n{part.body}")
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        git(tree, "format-patch", "-q", "--no-signature", "--zero-commit", "--full-index",
            "-o", str(out), f"HEAD~{len(SERIES)}")
    return sorted(out.glob("*.patch"))


def apply_to_checkout(tree: Path) -> list[str]:
    """Make the series' commits in the pytorch/pytorch checkout at ``tree`` by applying its edits (anchors found by
    content, not line numbers), one commit per part, as whoever runs it (their git identity and date).  The way
    out when ``git am`` stops, e.g. on a newer main.  Returns the new commits; raises ``ValueError`` naming the
    file and anchor an edit could not place (the parts before it stay committed)."""
    def run(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=tree, check=True, capture_output=True, text=True).stdout

    if run("status", "--porcelain", "--untracked-files=no").strip():
        raise ValueError(f"{tree}: the checkout has uncommitted changes; commit or stash them first")
    commits = []
    for part in SERIES:
        apply_part(tree, part)
        run("add", "--", *sorted({edit.path for edit in part.edits}))
        run("commit", "-q", "-m", f"{part.subject}\n\n{part.body}")
        commits.append(run("rev-parse", "HEAD").strip())
    return commits


def check(out: Path = PATCHES) -> list[str]:
    """Names of patches that differ between ``out`` and a fresh generation (empty: up to date)."""
    with tempfile.TemporaryDirectory(prefix="attn-upstream-check-") as tmp:
        fresh = write_series(Path(tmp) / "patches")
        names = sorted({p.name for p in fresh} | {p.name for p in out.glob("*.patch")})
        return [n for n in names
                if not ((out / n).exists() and (Path(tmp) / "patches" / n).exists()
                        and filecmp.cmp(out / n, Path(tmp) / "patches" / n, shallow=False))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m upstream.make_patches", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if upstream/patches/ is not up to date")
    parser.add_argument("--apply-to", metavar="CHECKOUT", type=Path,
                        help="instead of writing patches, commit the series' edits in this pytorch/pytorch checkout "
                             "(one commit per part, as you), for when `git am` does not apply")
    args = parser.parse_args(argv)
    if args.apply_to is not None:
        try:
            for rev in apply_to_checkout(args.apply_to):
                print(rev)
        except (ValueError, subprocess.CalledProcessError) as e:
            print(f"error: {getattr(e, 'stderr', None) or e}", file=sys.stderr)
            return 1
        return 0
    import torch
    if torch.version.git_version != PYTORCH_COMMIT:
        print(f"the installed torch was built from {torch.version.git_version}, not {PYTORCH_COMMIT}: its "
              f"files are not the series' base (pip install torch==2.13.0)", file=sys.stderr)
        return 2
    if args.check:
        stale = check()
        for name in stale:
            print(f"out of date: upstream/patches/{name}", file=sys.stderr)
        return 1 if stale else 0
    for p in write_series(PATCHES):
        print(p.relative_to(HERE.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
