"""float64 attention in numpy, forward and backward, written from docs/design.md alone.

Standard attention with every N x N matrix materialized (S, P, and in the backward pass dP
and dS): the opposite of what the server does, so that the two share no idea but the math.
"""

import math

import numpy as np

try:
    from ml_dtypes import bfloat16 as BF16    # numpy's bfloat16 when ml_dtypes is installed
except ImportError:
    BF16 = None


def _problem(q, k, v, causal, scale, window):
    """q, k, v as float64 [B, H, N, D] (k, v repeated to Hq heads), the scale, the visible
    mask [Nq, Nkv] and the group size Hq / Hkv."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    lift = (1,) * (4 - q.ndim)
    q, k, v = q.reshape(lift + q.shape), k.reshape(lift + k.shape), v.reshape(lift + v.shape)
    hq, nq, d = q.shape[1:]
    hkv, nkv = k.shape[1], k.shape[2]
    assert hq % hkv == 0
    group = hq // hkv
    k = np.repeat(k, group, axis=1)     # query head h reads kv head h // (hq // hkv)
    v = np.repeat(v, group, axis=1)
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    wl, wr = window
    if causal:
        wr = 0
    i = np.arange(nq)[:, None]
    j = np.arange(nkv)[None, :]
    off = nkv - nq
    visible = np.ones((nq, nkv), bool)
    if wl >= 0:
        visible &= j >= i + off - wl
    if wr >= 0:
        visible &= j <= i + off + wr
    return q, k, v, scale, visible, group


def _alibi_bias(alibi_slopes, shape):
    """-slope * |i + Nkv - Nq - j| as [B, H, Nq, Nkv] (0 without slopes)."""
    b, h, nq, nkv = shape
    if alibi_slopes is None:
        return np.zeros(shape)
    slopes = np.broadcast_to(np.asarray(alibi_slopes, np.float64).reshape(-1, h), (b, h))
    dist = np.abs(np.arange(nq)[:, None] + (nkv - nq) - np.arange(nkv)[None, :])
    return -slopes[:, :, None, None] * dist


def _sink_logits(sinks, shape):
    """sinks [Hq] as [B, H, Nq] (-inf, no sink, without them)."""
    b, h, nq = shape
    if sinks is None:
        return np.full(shape, -np.inf)
    return np.broadcast_to(np.asarray(sinks, np.float64).reshape(1, h, 1), shape)


def _probabilities(q, k, scale, visible, softcap=None, alibi_slopes=None, sinks=None):
    """S, P [B, H, Nq, Nkv] and the statistics m, l [B, H, Nq]; a row with no visible key
    has P = 0, m = -inf, l = 0. FlashAttention's order: scale, softcap, + ALiBi, mask.
    With sinks, each row's softmax has one more term, exp(sinks[h] - m), whose key has
    value zero: it is in m and l but has no column of P (a row with no visible key then
    has m = sinks[h], l = 1)."""
    s = scale * np.einsum("bhqd,bhkd->bhqk", q, k)
    if softcap:
        s = softcap * np.tanh(s / softcap)
    s = s + _alibi_bias(alibi_slopes, s.shape)
    s = np.where(visible, s, -np.inf)
    sink = _sink_logits(sinks, s.shape[:-1])
    m = np.maximum(s.max(axis=-1), sink)
    safe = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - safe[..., None])
    l = p.sum(axis=-1) + np.exp(sink - safe)
    return s, p / np.where(l > 0, l, 1.0)[..., None], m, l


def _o_shape(q, v):
    """O's shape: q's with v's last dimension (Dv, which may differ from D)."""
    return tuple(np.shape(q)[:-1]) + (np.shape(v)[-1],)


def reference(q, k, v, causal=False, scale=None, window=(-1, -1), softcap=None,
              alibi_slopes=None, sinks=None):
    """Returns (o, m, l, lse) in float64, o of q's shape with v's last dimension (Dv),
    statistics q's shape minus D. The default scale is 1/sqrt(D), whatever Dv."""
    shape, oshape = np.shape(q), _o_shape(q, v)
    q, k, v, scale, visible, _ = _problem(q, k, v, causal, scale, window)
    _, p, m, l = _probabilities(q, k, scale, visible, softcap, alibi_slopes, sinks)
    o = np.einsum("bhqk,bhkd->bhqd", p, v)
    with np.errstate(divide="ignore"):
        lse = np.where(l > 0, m + np.log(np.where(l > 0, l, 1.0)), -np.inf)
    return o.reshape(oshape), m.reshape(shape[:-1]), l.reshape(shape[:-1]), \
        lse.reshape(shape[:-1])


def reference_backward(q, k, v, do, causal=False, scale=None, window=(-1, -1), softcap=None,
                       alibi_slopes=None, sinks=None):
    """(dq, dk, dv) in float64 for the loss L with dL/dO = do (O's shape: q's with Dv):
    dq of q's shape, dk of k's and dv of v's (summed over the query heads of each GQA
    group); with sinks, (dq, dk, dv, dsinks), dsinks [Hq] summed over the batch and the
    rows."""
    qshape, kshape, vshape = np.shape(q), np.shape(k), np.shape(v)
    q, k, v, scale, visible, group = _problem(q, k, v, causal, scale, window)
    do = np.asarray(do, np.float64).reshape(q.shape[:-1] + v.shape[-1:])
    _, p, m, l = _probabilities(q, k, scale, visible, softcap, alibi_slopes, sinks)
    dv = np.einsum("bhqk,bhqd->bhkd", p, do)                 # dV = P^T dO
    dp = np.einsum("bhqd,bhkd->bhqk", do, v)                 # dP = dO V^T
    # The softmax's Jacobian row by row. The sink's own dP is 0 (its value is zero), so it
    # adds nothing to the row's sum; its probability only makes P's row sum below one.
    rowdot = (p * dp).sum(axis=-1, keepdims=True)
    ds = p * (dp - rowdot)
    if softcap:   # through softcap * tanh(s / softcap); ALiBi adds a constant
        ds = ds * (1 - np.tanh(scale * np.einsum("bhqd,bhkd->bhqk", q, k) / softcap) ** 2)
    dq = scale * np.einsum("bhqk,bhkd->bhqd", ds, k)         # S = scale Q K^T
    dk = scale * np.einsum("bhqk,bhqd->bhkd", ds, q)
    b, hq, nkv, d = dk.shape
    dk = dk.reshape(b, hq // group, group, nkv, d).sum(axis=2)   # the heads of a group
    dv = dv.reshape(b, hq // group, group, nkv, dv.shape[-1]).sum(axis=2)
    grads = dq.reshape(qshape), dk.reshape(kshape), dv.reshape(vshape)
    if sinks is None:
        return grads
    # The sink's column of the same Jacobian: p0 (dP_sink - rowdot), p0 = exp(sink - m) / l
    # its probability and dP_sink = 0; the sink is shared by the batch and the rows.
    p0 = np.exp(_sink_logits(sinks, m.shape) - m) / l
    return grads + (-(p0 * rowdot[..., 0]).sum(axis=(0, 2)),)


def reference_dsinks(o, do, lse, sinks):
    """The contract's dsinks from a given O (as sent to a backward request, rounded to its
    dtype): -sum over batch and rows of exp(sinks[h] - lse) (dO . O), float64 [Hq]."""
    o, do = (np.asarray(x, np.float64) for x in (o, do))
    lift = (1,) * (4 - o.ndim)
    o, do = o.reshape(lift + o.shape), do.reshape(lift + do.shape)
    lse = np.asarray(lse, np.float64).reshape(o.shape[:-1])
    p0 = np.exp(_sink_logits(sinks, lse.shape) - lse)
    return -(p0 * (o * do).sum(axis=-1)).sum(axis=(0, 2))


#: the normalized error allowed against the float64 reference, by the dtype sent
TOL = {np.float32: 1e-5, np.float16: 1e-3}
TOL_BF16 = 8e-3


def rand(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# (q shape, kv shape, options)
CASES = {
    "2d": ((7, 16), (7, 16), {}),
    "2d-cross-causal": ((5, 16), (9, 16), {"causal": True}),
    "3d-gqa": ((4, 6, 8), (2, 6, 8), {}),
    "3d-causal-window-left": ((2, 12, 8), (2, 12, 8), {"causal": True, "window": (3, -1)}),
    "4d-gqa-causal": ((2, 4, 10, 12), (2, 2, 13, 12), {"causal": True}),
    "4d-mqa-window": ((2, 4, 20, 8), (2, 1, 20, 8), {"window": (3, 2)}),
    "4d-scale-window-right": ((1, 2, 9, 5), (1, 2, 6, 5), {"scale": 0.3, "window": (-1, 1)}),
    "4d-d256": ((1, 1, 3, 256), (1, 1, 70, 256), {"scale": 0.01}),
}


def rel_err(x, ref):
    """||x - ref|| / ||ref|| (the norm of the difference alone when ref is zero)."""
    x = np.asarray(x, np.float64)
    den = np.linalg.norm(ref)
    return np.linalg.norm(x - ref) / (den if den > 0 else 1.0)
