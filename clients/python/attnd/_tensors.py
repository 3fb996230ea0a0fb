"""Tensors in and out of attnd: numpy, ml_dtypes and torch on one side, the wire on the other.

On the wire a tensor is ``(dtype_name, array)``: ``"F32"``, ``"F16"`` or ``"BF16"`` and a
numpy array in that dtype's storage type (``float32``, ``float16``, ``uint16`` raw bits for
BF16), which is what :mod:`attnd.safetensors` writes and reads. Results go back in the
caller's kind: torch tensors (on the device of the first torch input) when any input was a
torch tensor, numpy arrays otherwise, BF16 as ``ml_dtypes.bfloat16`` when ml_dtypes can be
imported and as ``uint16`` bits when it cannot.

torch and ml_dtypes are optional: torch is never imported here (a torch tensor can only
exist once the caller has imported torch), ml_dtypes only when a BF16 result is returned.
"""

import sys

import numpy as np


def _ml_dtypes():
    """The ml_dtypes module, or None when it is not installed."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    return ml_dtypes


def _is_ml_bfloat16(dtype):
    # Recognized by name so that an ml_dtypes array is understood without importing it
    # (the size first: numpy's dtype.name is Python code, slow next to a small call).
    return dtype.itemsize == 2 and dtype.name == "bfloat16"


def _torch():
    return sys.modules.get("torch")


def is_torch_tensor(x):
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


# ---------------------------------------------------------------------------------------
# bfloat16 bits

def bf16_to_float32(bits):
    """Widen bfloat16 values to ``float32``, exactly: raw bits (a ``uint16``/``int16``
    array) or an ``ml_dtypes.bfloat16`` array."""
    b = np.asarray(bits)
    if _is_ml_bfloat16(b.dtype):
        b = b.view(np.uint16)
    return (b.astype(np.uint16).astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16(x):
    """Round ``float32`` values to bfloat16, to nearest even; returns ``uint16`` raw bits."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), r)


# ---------------------------------------------------------------------------------------
# inputs

def _torch_to_numpy(t):
    """A CPU, contiguous numpy copy or view of a torch tensor; bfloat16 as uint16 bits."""
    torch = _torch()
    if not (t.is_cpu and not t.requires_grad and t.is_contiguous()):
        t = t.detach().cpu().contiguous()  # else as it is: each call makes a tensor
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), True
    return t.numpy(), False


def to_wire(x, name, bf16=False):
    """One input as ``(dtype_name, array)``.

    ``float32`` and ``float16`` go as they are, a torch ``bfloat16`` tensor and an
    ``ml_dtypes.bfloat16`` array as BF16, other real dtypes as F32; with ``bf16`` every
    input goes as BF16, ``uint16``/``int16`` arrays taken as raw bits.
    """
    if is_torch_tensor(x):
        x, is_bf16 = _torch_to_numpy(x)
        if is_bf16:
            return "BF16", x
    a = np.asarray(x)
    if _is_ml_bfloat16(a.dtype):
        return "BF16", a.view(np.uint16)
    if bf16:
        if a.dtype in (np.uint16, np.int16):
            return "BF16", a.view(np.uint16)
        if a.dtype.kind in "fiub":
            return "BF16", float32_to_bf16(a.astype(np.float32))
        raise TypeError("%s: cannot send dtype %s as BF16" % (name, a.dtype))
    if a.dtype == np.float16:
        return "F16", a
    if a.dtype == np.float32:
        return "F32", a
    if a.dtype.kind in "fiub":   # float64, ints, bools, nested lists: F32
        return "F32", a.astype(np.float32)
    raise TypeError("%s: unsupported dtype %s (use float32, float16, bfloat16 or bf16=True)"
                    % (name, a.dtype))


def f32_to_wire(x, name):
    """A statistic (always F32 on the wire, whatever the tensors' dtype)."""
    if is_torch_tensor(x):
        x = x.detach().to("cpu", _torch().float32).contiguous().numpy()
    a = np.asarray(x)
    if a.dtype.kind not in "fiu":
        raise TypeError("%s: unsupported dtype %s (a float32 statistic)" % (name, a.dtype))
    return "F32", np.asarray(a, np.float32)


# ---------------------------------------------------------------------------------------
# outputs

def result_device(*inputs):
    """Where results go: the device of the first torch tensor among the inputs, or None
    (numpy results)."""
    for x in inputs:
        if is_torch_tensor(x):
            return x.device
    return None


def from_wire(a, device):
    """A result array (storage type: ``uint16`` means BF16) in the caller's kind: a torch
    tensor on ``device``, or numpy when ``device`` is None."""
    if device is not None:
        torch = _torch()
        if a.dtype == np.uint16:
            t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(a)
        return t.to(device)
    if a.dtype == np.uint16:
        ml_dtypes = _ml_dtypes()
        if ml_dtypes is not None:
            return a.view(ml_dtypes.bfloat16)
    return a
