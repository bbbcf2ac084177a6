"""crosscheck's device plumbing, exercised without a GPU: which device each framework is given, what the device
messages say, torch's float32 precision settings around a CUDA run, and the conversions to numpy.

A "cuda" run is faked: ``torch.cuda.is_available`` says yes, ``torch_oracles.to_native`` records the device it is
asked for and places the tensor on the CPU, and ``jax_oracles.jax_device`` records the device and returns the CPU.
Everything else (the loop, the JAX executor, the precision context, the ground truth) runs as on a GPU machine.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import crosscheck.availability as availability
import crosscheck.environment as env
from crosscheck import frameworks
from crosscheck import Config, EnvironmentProblem, run
from crosscheck import torch_oracles as T
from tests.conftest import require_jax, optional_jax

SMALL = dict(ops=("attn",), dtypes=("float32",), trials=1, random_shapes=0, shapes=((3, 2, 4),), path_shapes=1)



def _gpu_check(monkeypatch, fw: str, check) -> None:
    """Framework ``fw``'s GPU check (``Framework.gpu_check``) replaced by ``check`` for one test."""
    monkeypatch.setitem(frameworks.BY_NAME, fw, dataclasses.replace(frameworks.get(fw), gpu_check=check))

@pytest.fixture
def fake_cuda(monkeypatch):
    """Pretend both frameworks have a GPU; returns the devices each framework was asked for."""
    asked = {"torch": [], "jax": [], "precision": []}
    real_to_native = T.to_native

    def to_native(x, device):
        asked["torch"].append(device)
        if device == "cuda":
            asked["precision"].append(torch.backends.cuda.matmul.fp32_precision
                                      if env._new_precision_api(torch) else torch.backends.cuda.matmul.allow_tf32)
        return real_to_native(x, "cpu")

    monkeypatch.setattr(T, "to_native", to_native)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    _gpu_check(monkeypatch, "jax", lambda: "")
    jax = optional_jax()
    if jax is None:
        return asked
    from crosscheck import jax_oracles as J

    def jax_device(device):
        asked["jax"].append(device)
        return jax.devices("cpu")[0]

    monkeypatch.setattr(J, "jax_device", jax_device)
    return asked


@pytest.mark.jax
def test_cuda_run_gives_each_framework_the_gpu_and_the_truth_the_cpu(fake_cuda):
    report = run(Config(device="cuda", **SMALL))
    assert report.ok, [f.message() for f in report.failures]
    assert all(r.device == "cuda" for r in report.rows)
    # torch: the inputs of the checks on the GPU; the float64 ground truth (float32 run) on the CPU
    assert "cuda" in fake_cuda["torch"] and "cpu" in fake_cuda["torch"]
    assert set(fake_cuda["jax"]) == {"cuda"}                      # JAX: placement and computation on its GPU
    assert any(r.label == "torch vs float64 truth" and r.compared for r in report.rows)


@pytest.mark.jax
def test_frameworks_jax_on_cuda_does_not_need_torch_cuda(fake_cuda, monkeypatch):

    def no_torch_cuda():
        raise AssertionError("torch's CUDA consulted for a JAX-only run")

    monkeypatch.setattr(torch.cuda, "is_available", no_torch_cuda)
    report = run(Config(device="cuda", frameworks=("jax",), **SMALL))
    assert report.ok
    assert set(fake_cuda["torch"]) == {"cpu"}                     # only the ground truth, on the CPU
    assert set(fake_cuda["jax"]) == {"cuda"}


def _no_gpu(monkeypatch, torch_gpu: bool, jax_gpu: bool):
    _gpu_check(monkeypatch, "torch", lambda: "" if torch_gpu else "PyTorch cannot use CUDA: (test)")
    _gpu_check(monkeypatch, "jax", lambda: "" if jax_gpu else "JAX has no GPU backend: (test)")


@pytest.mark.parametrize("frameworks, torch_gpu, jax_gpu, named, not_named, advice", [
    (("torch", "jax"), False, False, ["2 of 2 frameworks", "PyTorch cannot use CUDA", "JAX has no GPU backend"], [],
     "leave out --device"),
    (("torch", "jax"), True, False, ["1 of 2 frameworks", "JAX has no GPU backend"], ["PyTorch cannot"],
     "--frameworks torch"),
    (("torch", "jax"), False, True, ["1 of 2 frameworks", "PyTorch cannot use CUDA"], ["JAX has no"],
     "--frameworks jax"),
    (("jax",), False, False, ["1 of 1 frameworks", "JAX has no GPU backend", "PyTorch's CUDA is not needed"],
     ["PyTorch cannot"], "leave out --device"),
    (("torch",), False, False, ["1 of 1 frameworks", "PyTorch cannot use CUDA"], ["JAX"], "leave out --device"),
])
def test_device_message_names_each_framework_lacking_the_gpu(monkeypatch, frameworks, torch_gpu, jax_gpu, named,
                                                             not_named, advice):
    if "jax" in frameworks:
        require_jax()
    _no_gpu(monkeypatch, torch_gpu, jax_gpu)
    with pytest.raises(EnvironmentProblem) as info:
        availability.check_environment("cuda", frameworks)
    message = str(info.value)
    for text in named:
        assert text in message, message
    for text in not_named:
        assert text not in message, message
    assert advice in message
    for fw in frameworks:                                        # why it matters for the run asked
        if (fw == "torch" and not torch_gpu) or (fw == "jax" and not jax_gpu):
            assert f"needed because --frameworks includes {fw}" in message


def test_gpu_in_every_framework_checked_passes(monkeypatch):
    _no_gpu(monkeypatch, torch_gpu=False, jax_gpu=True)
    availability.check_environment("cuda", ("jax",)) if _has_jax() else None       # torch lacks it, but is not checked
    _no_gpu(monkeypatch, torch_gpu=True, jax_gpu=False)
    availability.check_environment("cuda", ("torch",))


def _has_jax() -> bool:
    return optional_jax() is not None


@pytest.mark.skipif(not env._new_precision_api(torch), reason="torch without the fp32_precision API")
def test_cuda_precision_uses_the_new_api_only_and_restores_it(fake_cuda):
    """A caller's fp32_precision = "tf32" (new API) survives a cuda run, which pins "ieee" meanwhile; the legacy
    flags are never read (reading them after the new API was used raises "mix of the legacy and new APIs")."""
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    before = (matmul.fp32_precision, conv.fp32_precision)
    try:
        matmul.fp32_precision, conv.fp32_precision = "tf32", "tf32"
        report = run(Config(device="cuda", frameworks=("torch",), **SMALL))
        assert report.ok
        assert set(fake_cuda["precision"]) == {"ieee"}           # pinned while the checks ran
        assert (matmul.fp32_precision, conv.fp32_precision) == ("tf32", "tf32")    # restored
    finally:
        matmul.fp32_precision, conv.fp32_precision = before


def test_cpu_run_leaves_precision_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(env, "_new_precision_api", lambda t: calls.append(1) or True)
    with env.torch_precision("cpu"):
        pass
    assert calls == []


class PretendCuda(torch.Tensor):
    """A CPU tensor that behaves like a CUDA tensor for numpy conversion: ``.numpy()`` raises as on a GPU, until
    it is moved with ``.cpu()`` / ``.to("cpu")``."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.numpy:
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                            "to host memory first.")
        out = super().__torch_function__(func, types, args, kwargs)
        to_cpu = func is torch.Tensor.cpu or (func is torch.Tensor.to and "cpu" in repr((args[1:], kwargs)))
        return out.as_subclass(torch.Tensor) if to_cpu and isinstance(out, torch.Tensor) else out


def test_to_numpy_copies_from_any_device():
    x = torch.randn(2, 3, dtype=torch.complex128)
    on_gpu = x.conj().as_subclass(PretendCuda)
    with pytest.raises(TypeError, match="cuda"):
        on_gpu.numpy()                                           # the stand-in fails like a GPU tensor
    got = T.to_numpy(on_gpu)
    assert type(got).__module__ == "numpy" and (got == x.conj().resolve_conj().numpy()).all()
    assert T.to_numpy(None) is None


def test_to_native_places_on_the_device_asked():
    import numpy as np
    t = T.to_native(np.ones((2, 2)), "meta")                      # any device string reaches torch
    assert t.device.type == "meta" and t.shape == (2, 2)
