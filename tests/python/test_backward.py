"""Client.attention_backward against a real attnd, checked against float64 numpy gradients."""

import socket
import zlib

import numpy as np
import pytest

import attnd

from attn_ref import (BF16, CASES, TOL, TOL_BF16, rand, reference, reference_backward,
                      rel_err)
from conftest import attnd_error

BACKEND = None   # the default (auto): the cpu backend here, cuda with a device


def _inputs(seed, qs, kvs, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return rand(rng, qs, dtype), rand(rng, kvs, dtype), rand(rng, kvs, dtype), \
        rand(rng, qs, dtype)


def _check(got, ref, dtype, tol):
    for name, x, r in zip(("dq", "dk", "dv"), got, ref):
        assert isinstance(x, np.ndarray), name
        assert x.dtype == dtype and x.shape == r.shape, (name, x.dtype, x.shape)
        assert np.all(np.isfinite(x.astype(np.float64))), name
        assert rel_err(x, r) <= tol, (name, rel_err(x, r))


def test_reference_backward_matches_finite_differences():
    """The oracle itself: central differences of the forward reference, no server."""
    rng = np.random.default_rng(20)
    q, k, v = rng.standard_normal((1, 4, 6, 5)), rng.standard_normal((1, 2, 8, 5)), \
        rng.standard_normal((1, 2, 8, 5))
    do = rng.standard_normal(q.shape)
    opts = {"causal": True, "window": (3, -1), "scale": 0.7}
    grads = reference_backward(q, k, v, do, **opts)
    args, eps = [q, k, v], 1e-6
    for which, g in enumerate(grads):
        for idx in np.ndindex(*g.shape[:2], 2, 2):
            plus = [a.copy() for a in args]
            minus = [a.copy() for a in args]
            plus[which][idx] += eps
            minus[which][idx] -= eps
            fd = ((reference(*plus, **opts)[0] - reference(*minus, **opts)[0]) * do).sum()
            assert abs(fd / (2 * eps) - g[idx]) <= 1e-6 * max(1.0, abs(g[idx])), (which, idx)


@pytest.mark.parametrize("wire", ["binary", "json"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["F32", "F16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_backward(client, case, dtype, wire):
    qs, kvs, opts = CASES[case]
    q, k, v, do = _inputs(zlib.crc32(repr((case, wire, str(dtype))).encode()), qs, kvs, dtype)
    o, _, _, lse = client.attention(q, k, v, stats=True, **opts)
    got = client.attention_backward(q, k, v, o, do, lse, backend=BACKEND,
                                    json=(wire == "json"), **opts)
    _check(got, reference_backward(q, k, v, do, **opts), dtype, TOL[dtype])


@pytest.mark.parametrize("case", sorted(CASES))
def test_backward_without_lse(client, case):
    qs, kvs, opts = CASES[case]
    q, k, v, do = _inputs(21, qs, kvs)
    o = client.attention(q, k, v, **opts)
    got = client.attention_backward(q, k, v, o, do, backend=BACKEND, **opts)
    _check(got, reference_backward(q, k, v, do, **opts), np.float32, TOL[np.float32])


@pytest.mark.parametrize("wire", ["binary", "json"])
def test_backward_fully_masked_rows(client, wire):
    # Nq=5, Nkv=3, causal: aligned bottom-right, rows 0 and 1 see no key (lse -inf, JSON null)
    q, k, v, do = _inputs(22, (2, 5, 8), (2, 3, 8))
    o, _, _, lse = client.attention(q, k, v, causal=True, stats=True)
    assert np.all(np.isneginf(lse[:, :2])) and np.all(np.isfinite(lse[:, 2:]))
    dq, dk, dv = client.attention_backward(q, k, v, o, do, lse, causal=True, backend=BACKEND,
                                           json=(wire == "json"))
    assert np.all(dq[:, :2] == 0)
    _check((dq, dk, dv), reference_backward(q, k, v, do, causal=True), np.float32,
           TOL[np.float32])


def test_backward_option_spellings(client):
    """window_left/window_right and binary=False say what window and json=True say."""
    q, k, v, do = _inputs(23, (2, 9, 8), (2, 9, 8))
    o = client.attention(q, k, v, window_left=2, window_right=1)
    np.testing.assert_array_equal(o, client.attention(q, k, v, window=(2, 1), json=True))
    a = client.attention_backward(q, k, v, o, do, window_left=2, window_right=1,
                                  backend=BACKEND, binary=False)
    b = client.attention_backward(q, k, v, o, do, window=(2, 1), backend=BACKEND)
    ref = reference_backward(q, k, v, do, window=(2, 1))
    _check(a, ref, np.float32, TOL[np.float32])
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(TypeError):
        client.attention_backward(q, k, v, o, do, window=(2, 1), window_left=2)
    with pytest.raises(TypeError):
        client.attention(q, k, v, json=True, binary=True)


@pytest.mark.parametrize("wire", ["binary", "json"])
def test_backward_bf16_bits(client, wire):
    q, k, v, do = (attnd.float32_to_bf16(x) for x in _inputs(24, (2, 7, 16), (1, 10, 16)))
    o, _, _, lse = client.attention(q, k, v, causal=True, stats=True, bf16=True)
    got = client.attention_backward(q, k, v, o, do, lse, causal=True, bf16=True,
                                    backend=BACKEND, json=(wire == "json"))
    wide = [attnd.bf16_to_float32(x) for x in (q, k, v, do)]
    ref = reference_backward(*wide, causal=True)
    _check([attnd.bf16_to_float32(x) for x in got], ref, np.float32, TOL_BF16)
    assert all(x.dtype == (BF16 if BF16 is not None else np.uint16) for x in got)


def test_backward_ml_dtypes(client):
    if BF16 is None:
        pytest.skip("ml_dtypes is not installed here")
    q, k, v, do = (x.astype(BF16) for x in _inputs(25, (1, 4, 6, 32), (1, 2, 11, 32)))
    o, _, _, lse = client.attention(q, k, v, window=(4, 0), stats=True)
    assert o.dtype == BF16
    got = client.attention_backward(q, k, v, o, do, lse, window=(4, 0), backend=BACKEND)
    ref = reference_backward(*(x.astype(np.float64) for x in (q, k, v, do)), window=(4, 0))
    _check(got, ref, BF16, TOL_BF16)


# ---------------------------------------------------------------------------------------
# errors: the server's code and message, as for the forward pass

@pytest.mark.parametrize("wire", ["binary", "json"])
def test_backward_shape_mismatch(client, wire):
    q, k, v, do = _inputs(26, (2, 4, 8), (2, 5, 8))
    o = client.attention(q, k, v)
    e = attnd_error(client.attention_backward, q, k, v, o, do[:, :3], backend=BACKEND,
                    json=(wire == "json"))
    assert (e.status, e.code) == (422, "shape_mismatch")
    assert "do" in e.message and str(e).startswith("422 shape_mismatch")
    e = attnd_error(client.attention_backward, q, k, v, o, do, np.zeros((2, 3), np.float32),
                    backend=BACKEND, json=(wire == "json"))
    assert (e.status, e.code) == (422, "shape_mismatch")
    assert "lse" in e.message


def test_backward_lse_values_reach_the_server(client):
    """-inf (JSON null) on a row that sees keys is refused; +inf is not finite."""
    q, k, v, do = _inputs(27, (3, 8), (3, 8))
    o, _, _, lse = client.attention(q, k, v, stats=True)
    bad = lse.copy()
    bad[1] = -np.inf
    for json in (False, True):
        e = attnd_error(client.attention_backward, q, k, v, o, do, bad, backend=BACKEND, json=json)
        assert (e.status, e.code) == (422, "invalid_request"), e
        assert "lse" in e.message
    bad[1] = np.inf
    e = attnd_error(client.attention_backward, q, k, v, o, do, bad, backend=BACKEND)
    assert (e.status, e.code) == (422, "non_finite")
    with pytest.raises(ValueError):   # JSON has no +inf
        client.attention_backward(q, k, v, o, do, bad, backend=BACKEND, json=True)


def test_backward_non_finite_do(client):
    q, k, v, do = _inputs(28, (4, 8), (4, 8))
    o = client.attention(q, k, v)
    do[2, 3] = np.nan
    e = attnd_error(client.attention_backward, q, k, v, o, do, backend=BACKEND)
    assert (e.status, e.code) == (422, "non_finite")
    assert "do" in e.message
    with pytest.raises(ValueError):
        client.attention_backward(q, k, v, o, do, backend=BACKEND, json=True)


def test_backward_dtype_mismatch(client):
    q, k, v, do = _inputs(29, (4, 8), (4, 8))
    o = client.attention(q, k, v)
    e = attnd_error(client.attention_backward, q, k, v, o, do.astype(np.float16), backend=BACKEND)
    assert (e.status, e.code) == (422, "dtype_mismatch")


def test_backward_server_down():
    with socket.socket() as s:      # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = attnd.Client("http://127.0.0.1:%d" % port, timeout=2)
    x = np.ones((4, 8), np.float32)
    e = attnd_error(c.attention_backward, x, x, x, x, x)
    assert (e.status, e.code) == (0, "unreachable")
