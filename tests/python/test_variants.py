"""softcap and alibi_slopes through the Python client, against attn_ref's float64
definitions (FlashAttention's order: scale, softcap, + ALiBi, mask, softmax)."""

import numpy as np
import pytest

import attnd
from attn_ref import TOL, reference, reference_backward, rel_err


# (q shape, kv shape, options)
VARIANTS = {
    "softcap": ((2, 4, 30, 16), (2, 2, 30, 16), {"softcap": 1.5}),
    "alibi-hq-causal": ((1, 4, 20, 8), (1, 4, 33, 8), {"causal": True, "alibi": (4,)}),
    "alibi-bhq-window": ((2, 2, 25, 12), (2, 1, 25, 12), {"window": (5, 2), "alibi": (2, 2)}),
    "both-nq-gt-nkv": ((1, 2, 40, 8), (1, 2, 17, 8), {"causal": True, "softcap": 3.0,
                                                     "alibi": (2,)}),
}


def _case(name, seed):
    qs, kvs, opts = VARIANTS[name]
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in (qs, kvs, kvs))
    opts = dict(opts)
    shape = opts.pop("alibi", None)
    if shape is not None:
        opts["alibi_slopes"] = rng.uniform(0.05, 0.5, shape).astype(np.float32)
    return q, k, v, opts


@pytest.mark.parametrize("wire", ["binary", "json"])
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_forward(client, name, wire):
    q, k, v, opts = _case(name, 7)
    o, m, l, lse = client.attention(q, k, v, stats=True, json=(wire == "json"), **opts)
    ro, rm, rl, rlse = reference(q, k, v, **opts)
    assert rel_err(o, ro) <= TOL[np.float32]
    fin = np.isfinite(rlse)
    assert np.array_equal(np.isfinite(lse), fin)
    assert np.max(np.abs(lse[fin] - rlse[fin])) <= 1e-5 * max(1.0, np.max(np.abs(rlse[fin])))


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_backward(client, name):
    q, k, v, opts = _case(name, 11)
    do = np.random.default_rng(3).standard_normal(q.shape).astype(np.float32)
    o = reference(q, k, v, **opts)[0].astype(np.float32)
    got = client.attention_backward(q, k, v, o, do, **opts)
    ref = reference_backward(q, k, v, do, **opts)
    for g, r in zip(got, ref):
        assert rel_err(g, r) <= TOL[np.float32]


def test_variants_change_the_answer(client):
    """The server does not drop them: each one moves O away from plain attention."""
    q, k, v, opts = _case("both-nq-gt-nkv", 5)
    plain = client.attention(q, k, v, causal=True)
    assert rel_err(client.attention(q, k, v, causal=True, softcap=0.2), plain) > 1e-2
    slopes = np.full(2, 0.5, np.float32)
    assert rel_err(client.attention(q, k, v, causal=True, alibi_slopes=slopes), plain) > 1e-2


@pytest.mark.parametrize("wire", ["binary", "json"])
def test_bad_values(client, wire):
    q, k, v, _ = _case("softcap", 1)
    with pytest.raises(attnd.AttndError) as e:
        client.attention(q, k, v, softcap=-1, json=(wire == "json"))
    assert (e.value.status, e.value.code) == (422, "invalid_option")
    with pytest.raises(attnd.AttndError) as e:
        client.attention(q, k, v, alibi_slopes=np.ones(3, np.float32), json=(wire == "json"))
    assert (e.value.status, e.value.code) == (422, "shape_mismatch")
    assert "alibi_slopes" in e.value.message
    if wire == "binary":   # JSON cannot carry a NaN
        with pytest.raises(attnd.AttndError) as e:
            client.attention(q, k, v, alibi_slopes=np.array([0.5, np.nan, 1, 1], np.float32))
        assert (e.value.status, e.value.code) == (422, "non_finite")
