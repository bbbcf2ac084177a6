"""What a non-editable install ships: every package of the three (subpackages included) is found by pyproject's
``[tool.setuptools.packages.find]`` — a plain ``packages`` list names only the ones it lists, and a wheel built from
it lacked ``crosscheck.review`` / ``.shards`` / ``.kernels`` / ``.remote`` and the kernels' and sharded layers'."""

from __future__ import annotations

import fnmatch

from tests.conftest import ROOT

try:
    import tomllib
except ModuleNotFoundError:                       # Python < 3.11
    import tomli as tomllib


def test_every_package_is_in_the_install():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert isinstance(tool["packages"], dict)     # {"find": ...}, not a list naming some packages
    include = tool["packages"]["find"]["include"]
    packages = sorted(".".join(p.parent.relative_to(ROOT).parts) for top in ("torch_impl", "jax_impl", "crosscheck")
                      for p in (ROOT / top).rglob("__init__.py"))
    assert {"crosscheck.remote", "crosscheck.kernels", "torch_impl.sharded", "jax_impl.kernels"} <= set(packages)
    missing = [p for p in packages if not any(fnmatch.fnmatchcase(p, pattern) for pattern in include)]
    assert not missing, missing
