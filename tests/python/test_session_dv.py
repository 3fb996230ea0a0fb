"""Sessions whose values have a head dim of their own (``head_dim_v``) and latent sessions
(``v_from_k``: the server keeps k alone and reads v as the first Dv columns of each k row, the
cache of MLA's absorbed decode) through the Python client against a real attnd: a prefill and
a token by token decode, an attend-only call and ``session_batch``, each reply checked
against attn_ref's float64 formula over what the session should hold; GET's fields, attach
and a latent session's reservation (half); a session of either kind rebuilt from its
history (a latent one's: k alone); the refusals (a v sent to a latent session, on
the client and on the server); and DeepSeek's absorbed decode in small: q_nope absorbed into
the latent space through W_UK, attended over the [latent | rope] cache, O over the latent
columns multiplied by W_UV, equal to MLA's attention computed directly (per-head k and v
from the latent) in float64.
"""

import itertools
import math

import numpy as np
import pytest

from attn_ref import TOL, reference, rel_err
from conftest import attnd_error

_ids = itertools.count()


def _sid(tag):
    return "pytest-sdv-%s-%d" % (tag, next(_ids))


def _check(o, ref, tol=TOL[np.float32]):
    err = rel_err(o, ref)
    assert err <= tol, "normalized error %.3g > %.3g" % (err, tol)


def _decode(s, q, k, v, prefill, scale=None):
    """A prefill of ``prefill`` tokens, then one token a step (the wire formats taking
    turns), then an attend-only call; each reply checked against the float64 reference over
    the keys [0, end). k ``[Hkv, N, D]``, v ``[Hkv, N, Dv]`` the tokens' keys and values (a
    latent session's v: the first Dv columns of k, not sent)."""
    n = k.shape[1]
    send_v = not s.v_from_k
    steps = [(0, prefill)] + [(p, p + 1) for p in range(prefill, n)]
    for i, (a, b) in enumerate(steps):
        o = s.attend(q[:, a:b], k[:, a:b], v[:, a:b] if send_v else None, json=i % 2 == 1,
                     scale=scale)
        assert o.shape == (q.shape[0], b - a, s.head_dim_v)
        _check(o, reference(q[:, a:b], k[:, :b], v[:, :b], causal=True, scale=scale)[0])
        assert s.lengths == [b]
    o = s.attend(q[:, n - 1:n], scale=scale)
    _check(o, reference(q[:, n - 1:n], k, v, causal=True, scale=scale)[0])


@pytest.mark.parametrize("d,dv", [(192, 128), (32, 48)])
def test_its_own_value_head_dim(client, d, dv):
    rng = np.random.default_rng(d + dv)
    q = rng.standard_normal((4, 12, d)).astype(np.float32)
    k = rng.standard_normal((2, 12, d)).astype(np.float32)
    v = rng.standard_normal((2, 12, dv)).astype(np.float32)
    with client.session(_sid("dv"), heads_kv=2, head_dim=d, head_dim_v=dv,
                        max_tokens=32) as s:
        info = s.info()
        assert info["head_dim_v"] == dv and "v_from_k" not in info, info
        assert not s.v_from_k and s.head_dim_v == dv
        _decode(s, q, k, v, 8)
        again = type(s).attach(client, s.id)
        assert (again.head_dim_v, again.v_from_k, again.lengths) == (dv, False, [12])


def test_latent_session(client):
    rng = np.random.default_rng(7)
    d, dv = 64, 48
    q = rng.standard_normal((8, 12, d)).astype(np.float32)
    k = rng.standard_normal((1, 12, d)).astype(np.float32)
    with client.session(_sid("latent"), heads_kv=1, head_dim=d, v_from_k=dv,
                        max_tokens=64) as s, \
            client.session(_sid("whole"), heads_kv=1, head_dim=d, max_tokens=64) as whole:
        info = s.info()
        assert (info["head_dim_v"], info["v_from_k"]) == (dv, dv), info
        assert s.v_from_k and s.head_dim_v == dv
        # k alone is kept: half the reservation of a session that keeps K and V of D
        assert 2 * info["reserved_bytes"] == whole.info()["reserved_bytes"]
        _decode(s, q, k, k[:, :, :dv], 8)
        again = type(s).attach(client, s.id)
        assert (again.head_dim_v, again.v_from_k, again.lengths) == (dv, True, [12])


def test_latent_session_refuses_v(client):
    rng = np.random.default_rng(8)
    q = rng.standard_normal((2, 1, 16)).astype(np.float32)
    k = rng.standard_normal((1, 1, 16)).astype(np.float32)
    with client.session(_sid("lat-v"), heads_kv=1, head_dim=16, v_from_k=8,
                        max_tokens=8) as s:
        with pytest.raises(TypeError, match="takes q and k only"):
            s.attend(q, k, k[:, :, :8])
        # an object that does not know it is latent sends v: the server refuses it
        blind = type(s)(client, s.id, heads_kv=1, head_dim=16, max_tokens=8, create=False)
        for json in (False, True):
            e = attnd_error(blind.attend, q, k, k[:, :, :8], json=json)
            assert (e.status, e.code) == (422, "unknown_tensor"), e
            assert "takes q and k only" in e.message, e
        assert s.info()["lengths"] == [0]
    e = attnd_error(client.session, _sid("lat-wide"), heads_kv=1, head_dim=16, v_from_k=17,
                    max_tokens=8)
    assert e.status == 422 and "v_from_k" in e.message and "head_dim" in e.message, e


@pytest.mark.parametrize("latent", [False, True])
def test_batch(client, latent):
    """One token of each of two sessions through session_batch (a latent batch sends v
    None), each entry's O (Dv wide) against its own reference."""
    rng = np.random.default_rng(20 + latent)
    d, dv, hkv = 40, 24, 1 if latent else 2
    kw = {"v_from_k": dv} if latent else {"head_dim_v": dv}
    ss = [client.session(_sid("batch"), heads_kv=hkv, head_dim=d, max_tokens=32, **kw)
          for _ in range(2)]
    try:
        qs = [rng.standard_normal((4, 10, d)).astype(np.float32) for _ in ss]
        ks = [rng.standard_normal((hkv, 10, d)).astype(np.float32) for _ in ss]
        vs = [k[:, :, :dv].copy() if latent else
              rng.standard_normal((hkv, 10, dv)).astype(np.float32) for k in ks]
        pre = [9, 6]
        for s, q, k, v, p in zip(ss, qs, ks, vs, pre):
            s.attend(q[:, :p], k[:, :p], None if latent else v[:, :p])
        cat = lambda xs: np.concatenate([x[:, p:p + 1] for x, p in zip(xs, pre)], axis=1)
        o = client.session_batch(ss, cat(qs), cat(ks), None if latent else cat(vs),
                                 [0, 1, 2], [0, 1, 2])
        assert o.shape == (4, 2, dv)
        for e, (q, k, v, p) in enumerate(zip(qs, ks, vs, pre)):
            _check(o[:, e:e + 1], reference(q[:, p:p + 1], k[:, :p + 1], v[:, :p + 1],
                                            causal=True)[0])
        assert [s.lengths for s in ss] == [[10], [7]]
    finally:
        for s in ss:
            s.delete(missing_ok=True)


# -- DeepSeek's absorbed decode ------------------------------------------------------------

# (H, LATENT, NOPE, ROPE, VHEAD): small, and DeepSeek-V3's own widths (its 128 heads cut to
# 8), whose 576-column F32 rows fill a session page 16 at a time; steps: (tokens, prefill)
MLA_DIMS = [((4, 32, 16, 8, 12), (10, 6)), ((8, 512, 128, 64, 128), (40, 21))]


def _rope(x, pos):
    """Rotary embedding of the last dimension (pairs of halves) at positions pos."""
    half = x.shape[-1] // 2
    freq = 10000.0 ** (-np.arange(half) / half)
    ang = np.asarray(pos, np.float64)[:, None] * freq[None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


@pytest.mark.parametrize("dims,steps", MLA_DIMS, ids=["small", "deepseek"])
def test_deepseek_absorbed_decode(client, dims, steps):
    """MLA keeps per token a latent c_kv [LATENT] and one rope key k_pe [ROPE] shared by the
    heads. Directly: head h's key is [c_kv W_UK[h] | k_pe] (NOPE + ROPE), its value c_kv
    W_UV[h] (VHEAD), its query [q_nope | q_pe]. Absorbed: q_nope W_UK[h]^T moves the query
    into the latent space, so q·k = [q_nope W_UK[h]^T | q_pe] · [c_kv | k_pe] runs over
    LATENT + ROPE columns of one cache row shared by every head: a latent session with
    head_dim LATENT + ROPE and v_from_k LATENT. O over the latent columns, times W_UV[h],
    is the head's output. The scale stays 1/sqrt(NOPE + ROPE), the heads' own."""
    H, LATENT, NOPE, ROPE, VHEAD = dims
    rng = np.random.default_rng(576)
    n, prefill = steps
    scale = 1.0 / math.sqrt(NOPE + ROPE)
    w_uk = rng.standard_normal((H, LATENT, NOPE)) / math.sqrt(LATENT)
    w_uv = rng.standard_normal((H, LATENT, VHEAD)) / math.sqrt(LATENT)
    c_kv = rng.standard_normal((n, LATENT)).astype(np.float32).astype(np.float64)
    k_pe = _rope(rng.standard_normal((n, ROPE)), np.arange(n))
    k_pe = k_pe.astype(np.float32).astype(np.float64)
    q_nope = rng.standard_normal((H, n, NOPE))
    q_pe = _rope(rng.standard_normal((H, n, ROPE)), np.arange(n))

    # MLA as the model defines it, every head's k and v materialized, in float64
    k_full = np.concatenate([np.einsum("tc,hcd->htd", c_kv, w_uk),
                             np.broadcast_to(k_pe, (H, n, ROPE))], axis=-1)
    v_full = np.einsum("tc,hcd->htd", c_kv, w_uv)
    q_full = np.concatenate([q_nope, q_pe], axis=-1)

    # the absorbed form: one latent cache row a token, q in the latent space
    cache = np.concatenate([c_kv, k_pe], axis=-1)[None].astype(np.float32)   # [1, n, L + R]
    q_abs = np.concatenate([np.einsum("htd,hcd->htc", q_nope, w_uk), q_pe], axis=-1)
    q_abs = q_abs.astype(np.float32)

    with client.session(_sid("mla"), heads_kv=1, head_dim=LATENT + ROPE, v_from_k=LATENT,
                        max_tokens=n) as s:
        steps = [(0, prefill)] + [(p, p + 1) for p in range(prefill, n)]
        for a, b in steps:
            o_lat = s.attend(q_abs[:, a:b], cache[:, a:b], scale=scale)
            assert o_lat.shape == (H, b - a, LATENT)
            o = np.einsum("htc,hcd->htd", o_lat.astype(np.float64), w_uv)
            want = reference(q_full[:, a:b], k_full[:, :b], v_full[:, :b], causal=True,
                             scale=scale)[0]
            # the absorbed math in float64 is MLA's to rounding: the test's own premise
            lat64 = reference(q_abs[:, a:b].astype(np.float64), cache[:, :b],
                              cache[:, :b, :LATENT], causal=True, scale=scale)[0]
            exact = np.einsum("htc,hcd->htd", lat64, w_uv)
            assert rel_err(exact, want) < 1e-6
            _check(o, want, 2 * TOL[np.float32])


def test_latent_session_rebuilt_from_history(client):
    """A latent session gone from the server is rebuilt from a history that returns k alone
    (and a session of its own Dv from k and v of that width); the call after it equals the
    float64 reference over the whole history."""
    rng = np.random.default_rng(9)
    for kw, hkv in (({"v_from_k": 16}, 1), ({"head_dim_v": 40}, 2)):
        dv = next(iter(kw.values()))
        k = rng.standard_normal((hkv, 9, 24)).astype(np.float32)
        v = k[:, :, :dv] if "v_from_k" in kw else \
            rng.standard_normal((hkv, 9, dv)).astype(np.float32)
        q = rng.standard_normal((4, 9, 24)).astype(np.float32)
        latent = "v_from_k" in kw
        history = (lambda layer, n: k[:, :n]) if latent else (lambda layer, n: (k[:, :n],
                                                                                v[:, :n]))
        with client.session(_sid("hist"), heads_kv=hkv, head_dim=24, max_tokens=16,
                            history=history, **kw) as s:
            s.attend(q[:, :8], k[:, :8], None if latent else v[:, :8])
            s.delete()                      # as a replica lost behind a proxy would
            s.lengths = [8]                 # what this object had seen
            o = s.attend(q[:, 8:], k[:, 8:], None if latent else v[:, 8:])
            assert s.recreated == 1 and s.lengths == [9]
            _check(o, reference(q[:, 8:], k, v, causal=True)[0])
