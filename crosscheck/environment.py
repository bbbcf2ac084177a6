"""The numeric environment of a run: torch's float32 matmul precision, pinned to IEEE on CUDA and restored
afterwards (``torch_oracles.context``).  A leaf: the operations modules import it, and ``frameworks`` imports them."""

from __future__ import annotations

import contextlib

__all__ = ["torch_precision"]


def _new_precision_api(torch) -> bool:
    return hasattr(getattr(torch.backends.cuda, "matmul", None), "fp32_precision")


@contextlib.contextmanager
def torch_precision(device: str):
    """On CUDA, pin float32 matmuls (and cuDNN convolutions) to full IEEE precision — no TF32, which would
    drown real errors — and restore the previous settings afterwards.

    torch >= 2.9 has per-backend ``fp32_precision`` settings; reading a legacy flag (``allow_tf32``,
    ``get_float32_matmul_precision()``) after the new API was used raises ("mix of the legacy and new APIs"),
    and setting a legacy flag would leave the new settings changed.  So where the new API exists only it is
    used (save, set ``"ieee"``, restore); older torch gets the legacy flags."""
    import torch
    if device != "cuda":
        yield
        return
    if _new_precision_api(torch):
        knobs = [(torch.backends.cuda.matmul, "fp32_precision"), (torch.backends.cudnn.conv, "fp32_precision")]
        saved = [getattr(obj, name) for obj, name in knobs]
        for obj, name in knobs:
            setattr(obj, name, "ieee")
        try:
            yield
        finally:
            for (obj, name), value in zip(knobs, saved):
                setattr(obj, name, value)
        return
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])
