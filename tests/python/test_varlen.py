"""Variable-length batches (cu_seqlens_q, cu_seqlens_kv) over HTTP, both wire formats, both
passes: each sequence against the float64 reference of that sequence alone, packed outputs,
sequences with no query or no key, and the refusals (422 with a message)."""

import numpy as np
import pytest

import attnd
from attn_ref import reference, reference_backward
from conftest import attnd_error

TOL = 1e-5

LQ = [5, 0, 40, 1, 17]
LK = [5, 9, 0, 60, 30]


def _cu(lens, dtype):
    return np.concatenate([[0], np.cumsum(lens)]).astype(dtype)


def _err(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    den = np.linalg.norm(ref)
    return np.linalg.norm(x - ref) / (den if den > 0 else 1.0)


def _problem(hq=4, hkv=2, d=16, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((hq, sum(LQ), d)).astype(np.float32)
    k = rng.standard_normal((hkv, sum(LK), d)).astype(np.float32)
    v = rng.standard_normal((hkv, sum(LK), d)).astype(np.float32)
    return q, k, v


@pytest.mark.parametrize("json", [False, True])
@pytest.mark.parametrize("opts", [{}, {"causal": True}, {"window": (3, 1)}])
@pytest.mark.parametrize("cu_dtype", [np.int32, np.int64])
def test_varlen_forward(client, json, opts, cu_dtype):
    q, k, v = _problem()
    cq, ck = _cu(LQ, cu_dtype), _cu(LK, cu_dtype)
    o, m, l, lse = client.attention(q, k, v, stats=True, json=json, cu_seqlens_q=cq,
                                    cu_seqlens_kv=ck, **opts)
    assert o.shape == q.shape and lse.shape == q.shape[:2]
    for b in range(len(LQ)):
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        if LQ[b] == 0:
            continue
        if LK[b] == 0:
            assert np.all(o[:, qs] == 0) and np.all(np.isneginf(lse[:, qs]))
            assert np.all(l[:, qs] == 0) and np.all(np.isneginf(m[:, qs]))
            continue
        ro, rm, rl, rlse = reference(q[:, qs], k[:, ks], v[:, ks],
                                     causal=opts.get("causal", False),
                                     window=opts.get("window", (-1, -1)))
        assert _err(o[:, qs], ro) <= TOL, "sequence %d" % b
        fin = np.isfinite(rlse)
        assert np.allclose(lse[:, qs][fin], rlse[fin], rtol=0, atol=1e-5)
        assert np.array_equal(np.isneginf(lse[:, qs]), np.isneginf(rlse))


def test_varlen_backward(client):
    q, k, v = _problem(seed=1)
    cq, ck = _cu(LQ, np.int64), _cu(LK, np.int64)
    o, _, _, lse = client.attention(q, k, v, causal=True, stats=True, cu_seqlens_q=cq,
                                    cu_seqlens_kv=ck)
    do = np.random.default_rng(2).standard_normal(q.shape).astype(np.float32)
    for with_lse in (False, True):
        dq, dk, dv = client.attention_backward(q, k, v, o, do, lse if with_lse else None,
                                               causal=True, cu_seqlens_q=cq, cu_seqlens_kv=ck)
        for b in range(len(LQ)):
            qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
            if LQ[b] == 0 or LK[b] == 0:
                assert np.all(dq[:, qs] == 0) and np.all(dk[:, ks] == 0)
                assert np.all(dv[:, ks] == 0)
                continue
            rq, rk, rv = reference_backward(q[:, qs], k[:, ks], v[:, ks], do[:, qs],
                                            causal=True)
            for got, ref in ((dq[:, qs], rq), (dk[:, ks], rk), (dv[:, ks], rv)):
                assert _err(got, ref) <= TOL, "sequence %d, lse %s" % (b, with_lse)


BAD = [
    # (cu_q, cu_kv, extra options, code, words in the message)
    ([1, 5, 63], [0, 5, 144], {}, "invalid_shape", "cu_seqlens_q[0] is 1"),
    ([0, 40, 30, 63], [0, 5, 6, 144], {}, "invalid_shape", "cu_seqlens_q[2] = 30 is below"),
    ([0, 5, 62], [0, 5, 144], {}, "invalid_shape", "cu_seqlens_q[2] = 62 but seq_q is 63"),
    ([0, 5, 63], [0, 144], {}, "shape_mismatch", "cu_seqlens_q has 3 offsets"),
    ([0, 5, 63], [0, 5, 144], {"diag_offset": 0}, "invalid_request", "diag_offset cannot"),
]


@pytest.mark.parametrize("json", [False, True])
@pytest.mark.parametrize("case", range(len(BAD)))
def test_varlen_refused(client, json, case):
    cq, ck, extra, code, words = BAD[case]
    q, k, v = _problem()
    e = attnd_error(client.attention, q, k, v, json=json, cu_seqlens_q=np.array(cq),
                    cu_seqlens_kv=np.array(ck), **extra)
    assert e.status == 422 and e.code == code, (e.code, e.message)
    assert words in e.message, e.message


def test_varlen_wire_refusals(client):
    q, k, v = _problem()
    cq, ck = _cu(LQ, np.int64), _cu(LK, np.int64)
    # only one of the two
    e = attnd_error(client._compute, "/attention",
                    [("q", "F32", q), ("k", "F32", k), ("v", "F32", v),
                     ("cu_seqlens_q", "I64", cq)], {}, False, ("o",))
    assert e.status == 422 and "cu_seqlens_kv" in e.message
    # rank-4 q
    e = attnd_error(client.attention, q[None], k[None], v[None], cu_seqlens_q=cq,
                    cu_seqlens_kv=ck)
    assert e.status == 422 and "rank 4" in e.message
    # offsets as F32, and q as I32: dtype errors
    e = attnd_error(client._compute, "/attention",
                    [("q", "F32", q), ("k", "F32", k), ("v", "F32", v),
                     ("cu_seqlens_q", "F32", cq.astype(np.float32)),
                     ("cu_seqlens_kv", "I64", ck)], {}, False, ("o",))
    assert e.status == 422 and "I32 or I64" in e.message
    e = attnd_error(client._compute, "/attention",
                    [("q", "I32", q.astype(np.int32)), ("k", "F32", k), ("v", "F32", v)], {},
                    False, ("o",))
    assert e.status == 422 and "F32, F16 or BF16" in e.message


def test_diag_offset_and_sharding_name_in_errors(client):
    """An unknown option's message lists diag_offset among the options."""
    e = attnd_error(client._compute, "/attention", [("q", "F32", np.ones((2, 4), np.float32)),
                                                    ("k", "F32", np.ones((2, 4), np.float32)),
                                                    ("v", "F32", np.ones((2, 4), np.float32))],
                    {"diag_ofset": 1}, False, ("o",))
    assert e.status == 422 and "diag_offset" in e.message
    assert attnd.sharded_attention is not None


def test_v2_diag_offset(server):
    """/v2 takes diag_offset as a request parameter (0: top-left causal) and refuses a
    non-integer one with the option parser's message."""
    import json as _json
    import urllib.error
    import urllib.request

    def infer(params):
        body = {"inputs": [
            {"name": "q", "shape": [2, 2], "datatype": "FP32", "data": [1, 0, 0, 1]},
            {"name": "k", "shape": [3, 2], "datatype": "FP32", "data": [1, 0, 0, 1, 1, 1]},
            {"name": "v", "shape": [3, 2], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6]}],
            "parameters": params, "outputs": [{"name": "o"}]}
        req = urllib.request.Request(server.url + "/v2/models/attention/infer",
                                     data=_json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, _json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, _json.loads(e.read())

    status, reply = infer({"causal": True, "diag_offset": 0})
    assert status == 200
    o = np.array(reply["outputs"][0]["data"]).reshape(2, 2)
    q = np.array([[1, 0], [0, 1]], np.float32)
    k = np.array([[1, 0], [0, 1], [1, 1]], np.float32)
    v = np.array([[1, 2], [3, 4], [5, 6]], np.float32)
    assert _err(o, reference(q, k[:2], v[:2], causal=True)[0]) <= TOL
    status, reply = infer({"diag_offset": 1.5})
    assert status == 422 and "diag_offset" in reply["error"]
