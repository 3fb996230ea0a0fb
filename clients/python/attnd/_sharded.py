"""Exact attention with K/V split along the sequence across several servers.

The shards' results are merged in float64 by their log-sum-exp. Re-exported as
:func:`attnd.sharded_attention` and :func:`attnd.merge_shards`.
"""

import numpy as np

from ._client import Client
from ._tensors import bf16_to_float32, float32_to_bf16, is_torch_tensor


def _f64(x):
    """A result (numpy, BF16 bits or ml_dtypes, torch) as a float64 numpy array."""
    if is_torch_tensor(x):
        return x.detach().to("cpu").double().numpy()
    a = np.asarray(x)
    if a.dtype == np.uint16:   # BF16 bits, ml_dtypes absent
        a = bf16_to_float32(a)
    return a.astype(np.float64)


def _like(merged, example):
    """merged (float64) in the kind, dtype and device of a shard's O."""
    if is_torch_tensor(example):
        torch = __import__("torch")
        return torch.from_numpy(merged).to(device=example.device, dtype=example.dtype)
    a = np.asarray(example)
    if a.dtype == np.uint16:
        return float32_to_bf16(merged.astype(np.float32))
    return merged.astype(a.dtype)


def merge_shards(outs, lses):
    """Exact attention over the union of key shards from each shard's O and lse (float64
    numpy arrays): ``lse = log Σ exp(lseᵢ)``, ``O = Σ exp(lseᵢ − lse)·Oᵢ``, over O's own
    last dimension (the values' Dv, whatever q's D). Rows no shard sees keep O = 0 and
    lse = -inf."""
    lse_all = np.stack(lses)
    top = np.max(lse_all, axis=0)
    safe = np.where(np.isfinite(top), top, 0.0)
    w = np.exp(lse_all - safe)                        # -inf shards weigh 0
    total = np.sum(w, axis=0)
    lse = np.where(total > 0, safe + np.log(np.where(total > 0, total, 1.0)), -np.inf)
    norm = np.where(total > 0, total, 1.0)
    o = sum(wi[..., None] * oi for wi, oi in zip(w, outs)) / norm[..., None]
    return o, lse


def sharded_attention(clients, q, k, v, *, causal=False, scale=None, window=(-1, -1),
                      window_left=None, window_right=None, softcap=None, alibi_slopes=None,
                      diag_offset=None, backend=None, json=False, binary=None, bf16=False,
                      return_lse=False, sinks=None):
    """Exact attention with K/V split along the sequence across servers.

    The keys and values are cut into ``len(clients)`` contiguous shards along Nkv (the
    axis before D, or v's Dv); shard ``[a, b)`` goes to one server with ``diag_offset = off − a``
    (``off`` the whole problem's, ``Nkv − Nq`` unless ``diag_offset`` is given) and the
    same window, scale, ``softcap`` and ``alibi_slopes``, so that its mask and bias are
    the unsharded ones restricted to its keys. The shards are sent in parallel (one thread
    each) with ``stats=True`` and merged in float64 by :func:`merge_shards`.

    Args:
        clients: :class:`Client` objects or URLs, one per shard (fewer shards when Nkv is
            smaller than their number).
        q, k, v, causal, scale, window, window_left, window_right, backend, json, binary,
        bf16, diag_offset: as for :meth:`Client.attention`.
        softcap, alibi_slopes: passed to every shard when given (servers that lack them
            refuse with 422).
        sinks: ``[Hq]``, as for :meth:`Client.attention`, sent to the first shard only:
            the sink is one more key of the whole row, so its term must enter the merged
            lse once, where sent to every shard it would count once per shard. A row that
            sees no key of the first shard still gets it there (o = 0, lse = ``sinks[h]``).
        return_lse: also return the merged lse (float32 numpy, q's shape minus D).

    Returns:
        O in the dtype, kind and shape (Dv columns) a single server would return, or
        ``(o, lse)``.
    """
    import concurrent.futures
    cs = [c if isinstance(c, Client) else Client(c) for c in clients]
    if not cs:
        raise ValueError("sharded_attention: no clients")
    nq, nkv = int(q.shape[-2]), int(k.shape[-2])
    off = nkv - nq if diag_offset is None else int(diag_offset)
    n = min(len(cs), nkv)
    bounds = [(i * nkv // n, (i + 1) * nkv // n) for i in range(n)]
    extra = {}
    if softcap is not None:
        extra["softcap"] = softcap
    if alibi_slopes is not None:
        extra["alibi_slopes"] = alibi_slopes

    def one(i):
        a, b = bounds[i]
        own = dict(extra, sinks=sinks) if i == 0 and sinks is not None else extra
        return cs[i].attention(q, k[..., a:b, :], v[..., a:b, :], causal=causal, scale=scale,
                               window=window, window_left=window_left,
                               window_right=window_right, stats=True, backend=backend,
                               json=json, binary=binary, bf16=bf16, diag_offset=off - a,
                               **own)

    with concurrent.futures.ThreadPoolExecutor(max_workers=n) as pool:
        results = list(pool.map(one, range(n)))
    o, lse = merge_shards([_f64(r[0]) for r in results], [_f64(r[3]) for r in results])
    o = _like(o, results[0][0])
    return (o, lse.astype(np.float32)) if return_lse else o
