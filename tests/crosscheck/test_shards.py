"""``crosscheck --shards N``: the sharded entries against the single-device reference (crosscheck.shards).

One run of the project's layouts on 2 ranks / devices (both frameworks: one gloo spawn, one JAX subprocess) is
shared by the tests of the default verdict; a planted wrong layout per framework (tests/support/planted_shards_*.py,
given with --torch-layouts / --jax-layouts) must FAIL with its layout named.  The spawns carry their own timeouts
(crosscheck.shards.TIMEOUT_S, STUCK_S)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.shards         # a tier of its own (pyproject markers): CI runs it after the default run

from crosscheck import Config, UsageError, run
from crosscheck.report import format_summary
from crosscheck.shards import candidate, sharded_shapes
from tests.conftest import require_jax

require_jax()

WORLD = 2
TORCH_LAYOUTS = ("replicate", "rows", "keys", "all_shard0", "ring")
# the shard_map layouts run on an Auto and an Explicit mesh ("@explicit"); the jit layouts on the Auto one
JAX_LAYOUTS = ("rows", "ring", "ring_jvp", "jit_rows", "jit_rows_jvp") + (
    ("rows@explicit", "ring@explicit", "ring_jvp@explicit")          # where this JAX has Explicit axes
    if hasattr(getattr(require_jax("jax.sharding"), "AxisType", None), "Explicit") else ())


def _config(**kw) -> Config:
    base = dict(ops=("attn",), dtypes=("float64", "complex128"), shards=WORLD, trials=1, shapes=((2, 2, 2),),
                random_shapes=0)
    base.update(kw)
    return Config(**base)


@pytest.fixture(scope="module")
def report():
    return run(_config())


def _sharded_rows(report):
    return [r for r in report.rows if " sharded " in r.label]


def test_every_layout_is_compared_on_every_path(report):
    rows = _sharded_rows(report)
    for fw, layouts in (("torch", TORCH_LAYOUTS), ("jax", JAX_LAYOUTS)):
        for layout in layouts:
            name = candidate(fw, layout, WORLD)
            mine = {r.label for r in rows if r.label.startswith(name + " ") and r.compared}
            for what in ("impl vs", "hand VJP vs", "hand VJP (input subsets) vs"):
                assert any(o.startswith(f"{name} {what}") for o in mine), (name, what, sorted(mine))
    # second order on every layout (the torch ring included: its double backward is a third ring)
    assert {r.label.split(" hand")[0] for r in rows if r.kind == "vjp_vjp" and r.compared} == \
        {candidate("torch", lay, WORLD) for lay in TORCH_LAYOUTS} | \
        {candidate("jax", lay, WORLD) for lay in JAX_LAYOUTS}
    # torch: an in-place write on each output judged against the reference, and every rank's outcome compared
    for lay in TORCH_LAYOUTS:
        name = candidate("torch", lay, WORLD)
        assert any(r.label == f"{name} backward after an in-place write vs torch reference" and r.compared
                   for r in rows), name
        assert any(r.label == f"{name} every rank ends alike" and r.compared for r in rows), name


def test_jvp_where_the_entry_has_forward_mode(report):
    """The custom_jvp layouts (attn_jvp under jit with sharded rows, the ring's JVP on both meshes) have a
    forward-mode rule: their JVP and HVP rows are compared; the custom_vjp layouts' JVP rows are skipped with JAX's
    reason (and only that reason: another tracing error fails the rows)."""
    rows = _sharded_rows(report)
    custom_jvp = [lay for lay in JAX_LAYOUTS if lay.startswith(("jit_rows_jvp", "ring_jvp"))]
    for layout in custom_jvp:
        name = candidate("jax", layout, WORLD)
        assert any(r.label.startswith(f"{name} hand JVP vs") and r.compared for r in rows), name
        assert any(r.label.startswith(f"{name} hand HVP vs") and r.compared for r in rows), name
    ring = candidate("jax", "ring", WORLD)
    assert any(s.label.startswith(f"{ring} hand JVP vs") and "custom_vjp" in s.reason for s in report.skipped)


def test_shapes_include_uneven_and_empty(report):
    shapes, paths = sharded_shapes(WORLD)
    assert any(s[0] % WORLD for s in shapes if s[0]) and (0, 2, 3) in shapes
    assert paths[0][0] % WORLD                            # every path on the uneven shape
    seen = {f.shape for f in report.failures}             # the known failure's case is the uneven path shape
    assert all(s in shapes for s in seen)


def test_default_verdict_ok_for_the_real_entries(report):
    rows = _sharded_rows(report)
    assert rows
    assert report.exit_code == 0, [f.message() for f in report.failures]
    assert all(r.verdict != "FAIL" and r.rel_err <= r.tol for r in rows)


def test_planted_past_first_order_layouts_fail_where_they_are_wrong():
    """Three torch layouts exact at first order (tests/support/planted_shards_torch.py:PAST_FIRST_ORDER): a backward
    that leaves the graph fails its VJP-of-VJP row (the gradient penalty's constant cotangents), an ``a`` whose
    in-place writes no version counter sees fails its in-place row (its backward reads the modified ``a``; a layout
    returning a fresh ``a``, as first_order_only does, is right not to raise), a layout raising on every case fails
    everything it was asked; nothing else fails."""
    rep = run(_config(dtypes=("float64",), frameworks=("torch",),
                      torch_layouts="tests/support/planted_shards_torch.py:PAST_FIRST_ORDER"))
    assert rep.exit_code == 1
    failing = {r.label for r in rep.rows if r.verdict == "FAIL"}
    first, alias, raises = (candidate("torch", lay, WORLD) for lay in ("first_order_only", "unguarded_a", "raises"))
    expected = {f"{first} hand VJP of VJP vs torch.func.vjp(vjp(ref))",
                f"{alias} backward after an in-place write vs torch reference"}
    rest = failing - {o for o in failing if o.startswith(raises + " ")} - expected
    from torch_impl.sharded import rules
    if not rules.HIGHER_ORDERS:       # torch < 2.13: DTensor's own from_local(to_local()) alias is not twice differentiable
        rest.discard(f"{alias} hand VJP of VJP vs torch.func.vjp(vjp(ref))")
    assert expected <= failing and not rest, sorted(failing)
    assert f"{raises} impl vs torch reference" in failing
    alias_fails = [f for f in rep.failures if f.label.startswith(alias) and f.kind != "vjp_vjp"]
    assert alias_fails and all(f.note.startswith("a.mul_(0.5) before the backward") for f in alias_fails)


def test_planted_torch_layout_fails_with_its_layout_named():
    rep = run(_config(dtypes=("float64",), frameworks=("torch",),
                      torch_layouts="tests/support/planted_shards_torch.py:LAYOUTS"))
    assert rep.exit_code == 1
    name = candidate("torch", "keys", WORLD)
    assert any(r.verdict == "FAIL" and r.label == f"{name} impl vs torch reference" for r in rep.rows)
    assert all(f.label.startswith(name) for f in rep.failures)
    assert any(f.outputs == ("o",) and f.shape[0] % WORLD for f in rep.failures)     # n not divisible, too
    summary = format_summary(rep)              # the closing lines name the layout, with no single-device hint
    assert f"failing: attn: {name}: forward output o [float64]" in summary, summary
    assert "hint (" not in summary, summary


def test_planted_jax_layout_fails_with_its_layout_named():
    rep = run(_config(dtypes=("float64",), frameworks=("jax",),
                      jax_layouts="tests/support/planted_shards_jax.py:LAYOUTS"))
    assert rep.exit_code == 1
    failing = {r.label for r in rep.rows if r.verdict == "FAIL"}
    names = [candidate("jax", lay, WORLD) for lay in JAX_LAYOUTS if lay.split("@")[0] == "ring"]   # every mesh
    for name in names:
        assert f"{name} impl vs jax reference" in failing and f"{name} hand VJP vs jax.vjp(ref)" in failing
    assert all(f.label.startswith(tuple(n + " " for n in names)) for f in rep.failures)


@pytest.mark.parametrize("kw, message", [
    (dict(shards=1), "--shards must be an integer >= 2"),
    (dict(shards=-2), "--shards must be an integer >= 2"),
    (dict(shards=0, torch_layouts="x.py:L"), "--torch-layouts needs --shards N"),
    (dict(jax_layouts="x.py"), "--jax-layouts expects MODULE:ATTR"),
    (dict(ops=("mix",)), "add attn to --op"),
])
def test_bad_options_are_named_before_any_work(kw, message):
    with pytest.raises(UsageError, match=message):
        run(_config(**kw))
