"""The wire of attnd's requests: the error type, options, JSON bodies and JSON replies.

A request's options go as a query string or as JSON members, its tensors as a JSON body
(or safetensors, :mod:`attnd.safetensors`), and a JSON reply's tensors come back as numpy
arrays. :class:`attnd.Client` and :mod:`attnd.sessions` build their requests from these.
"""

import json as _json
import math
import urllib.parse

import numpy as np

from ._tensors import bf16_to_float32, f32_to_wire, float32_to_bf16, is_torch_tensor


class AttndError(Exception):
    """An error from attnd, or no answer from it.

    Attributes:
        status: the HTTP status (e.g. 422, 413, 503), or 0 when no HTTP reply came back.
        code: the error code of the reply body ``{"error": {"code", "message"}}`` (e.g.
            ``"shape_mismatch"``, ``"queue_full"``); ``"http_error"`` when the body is not
            such JSON; with status 0, ``"unreachable"`` (connecting or sending failed, the
            connection broke) or ``"timeout"`` (no reply within the client's timeout).
        message: the server's message, or a description of the failure.
        retry_after: the ``Retry-After`` header in seconds (503 replies), else None.
    """

    def __init__(self, status, code, message, retry_after=None):
        super().__init__("%s %s: %s" % (status, code, message) if status
                         else "%s: %s" % (code, message))
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after


def _fmt_bool(b):
    return "true" if b else "false"


def _window(window, window_left, window_right):
    """``(left, right)`` from either ``window`` or ``window_left``/``window_right``."""
    if window is None:
        window = (-1, -1)
    try:
        wl, wr = window
    except (TypeError, ValueError):
        raise TypeError("window must be a pair (left, right), got %r" % (window,)) from None
    if window_left is not None or window_right is not None:
        if (wl, wr) not in ((-1, -1), (None, None)):
            raise TypeError("give window=(left, right) or window_left/window_right, not both")
        wl, wr = window_left, window_right
    return (-1 if wl is None else int(wl)), (-1 if wr is None else int(wr))


def _wants_json(json, binary):
    """The wire format: ``json=True`` or ``binary=False`` mean JSON."""
    if binary is None:
        return bool(json)
    if json and binary:
        raise TypeError("json=True and binary=True contradict each other")
    return not binary


def _options(causal, scale, window, stats, backend, softcap=None, diag_offset=None):
    """The request's options as an ordered dict of Python values (only non-defaults)."""
    opts = {}
    if diag_offset is not None:
        opts["diag_offset"] = int(diag_offset)
    if causal:
        opts["causal"] = True
    if scale is not None:
        opts["scale"] = float(scale)
    if softcap:   # None and 0 both mean off
        opts["softcap"] = float(softcap)
    wl, wr = window
    if wl != -1:
        opts["window_left"] = wl
    if wr != -1:
        opts["window_right"] = wr
    if stats:
        opts["stats"] = True
    if backend is not None:
        opts["backend"] = str(backend)
    return opts


_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def _query_string(opts):
    parts = {}
    for k, v in opts.items():
        if isinstance(v, bool):
            parts[k] = _fmt_bool(v)
        elif isinstance(v, float):
            parts[k] = repr(v)
        else:
            parts[k] = str(v)
    if all(_PLAIN.issuperset(k) and _PLAIN.issuperset(v) for k, v in parts.items()):
        return "&".join(k + "=" + v for k, v in parts.items())  # nothing to escape
    return urllib.parse.urlencode(parts)


def _f32_inputs(wire, **tensors):
    """Appends each given tensor (lse, alibi_slopes, sinks: F32 on the wire whatever the
    inputs' dtype) to ``wire``; None ones are left out."""
    for name, x in tensors.items():
        if x is not None:
            wire.append((name,) + f32_to_wire(x, name))


def _cu_seqlens(wire, cu_seqlens_q, cu_seqlens_kv):
    """Appends the offsets of a variable-length batch to ``wire`` (I32 stays I32, any
    other integer type goes as I64)."""
    if (cu_seqlens_q is None) != (cu_seqlens_kv is None):
        raise TypeError("give both cu_seqlens_q and cu_seqlens_kv, or neither")
    for name, x in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_kv", cu_seqlens_kv)):
        if x is None:
            continue
        if is_torch_tensor(x):
            x = x.detach().to("cpu").numpy()
        a = np.asarray(x)
        if a.dtype.kind not in "iu":
            raise TypeError("%s: offsets must be integers, not %s" % (name, a.dtype))
        wire.append((name, "I32", a.astype(np.int32)) if a.dtype == np.int32
                    else (name, "I64", a.astype(np.int64)))


def _json_tensor(dtype_name, a, null_is_neg_inf):
    """``{"shape", "dtype", "data"}``; data as Python floats (exact for F32, F16, BF16)."""
    if dtype_name in ("I32", "I64"):
        return {"shape": [int(d) for d in a.shape], "dtype": dtype_name,
                "data": [int(x) for x in a.reshape(-1)]}
    vals = bf16_to_float32(a) if dtype_name == "BF16" else a
    data = vals.astype(np.float64).reshape(-1).tolist()
    if null_is_neg_inf:   # a statistic: JSON has no -inf, the wire's null stands for it
        data = [None if x == -math.inf else x for x in data]
    return {"shape": [int(d) for d in a.shape], "dtype": dtype_name, "data": data}


def _json_body(wire, opts):
    doc = {name: _json_tensor(dtype_name, a, name == "lse") for name, dtype_name, a in wire}
    doc.update(opts)
    try:
        return _json.dumps(doc, allow_nan=False, separators=(",", ":")).encode()
    except ValueError:
        raise ValueError("attnd: JSON cannot carry NaN or infinity; "
                         "send json=False to have the server check the values") from None


# ---------------------------------------------------------------------------------------
# outputs

def _from_json_tensor(t, name):
    try:
        shape = tuple(int(d) for d in t["shape"])
        dtype_name = t.get("dtype", "F32")
        data = t["data"]
    except (KeyError, TypeError, ValueError, AttributeError):
        raise AttndError(200, "bad_reply", "tensor %r in the JSON reply is malformed" % name)
    # null is -inf (a statistic of a row with no visible key).
    vals = np.array([-math.inf if x is None else x for x in data], dtype=np.float64)
    if dtype_name == "F32":
        a = vals.astype(np.float32)
    elif dtype_name == "F16":
        a = vals.astype(np.float16)
    elif dtype_name == "BF16":
        a = float32_to_bf16(vals.astype(np.float32))   # exact: the values are BF16 values
    else:
        raise AttndError(200, "bad_reply", "tensor %r has unknown dtype %r" % (name, dtype_name))
    return a.reshape(shape)
