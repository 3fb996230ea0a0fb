"""The Python client against a real attnd, checked against float64 attention in numpy."""

import http.server
import json
import math
import os
import socket
import subprocess
import sys
import threading
import zlib

import numpy as np
import pytest

import attnd
from attnd import safetensors

from attn_ref import BF16, CASES, TOL, TOL_BF16, rand, reference, rel_err
from conftest import ROOT, attnd_error



def check(got, ref, dtype, stats):
    if stats:
        o, m, l, lse = got
        ro, rm, rl, rlse = ref
        for name, x, r in (("m", m, rm), ("l", l, rl), ("lse", lse, rlse)):
            assert x.dtype == np.float32, name
            assert x.shape == r.shape, name
            # -inf where the reference is -inf, close elsewhere
            np.testing.assert_array_equal(np.isneginf(x), np.isneginf(r), err_msg=name)
            fin = np.isfinite(r)
            np.testing.assert_allclose(x[fin], r[fin], rtol=2e-5, atol=2e-5, err_msg=name)
    else:
        o, ro = got, ref[0]
    assert isinstance(o, np.ndarray)
    assert o.dtype == dtype
    assert o.shape == ro.shape
    assert np.all(np.isfinite(o))
    assert rel_err(o, ro) <= TOL[dtype], rel_err(o, ro)


# ---------------------------------------------------------------------------------------
# the simple endpoints

def test_health_ready(client):
    assert client.health() is True
    assert client.ready() is True


def test_info(client):
    info = client.info()
    assert info["version"] == "0.1.0"
    names = {b["name"]: b for b in info["backends"]}
    assert names["cpu"]["available"] is True
    assert "reference" in names


def test_plan(client):
    p = client.plan(4096, 64)
    assert p["bytes"]["q"] == 1048576
    assert p["bytes"]["s"] == 67108864
    assert p["bytes"]["s_plus_p"] == 134217728
    assert p["ratios"]["s_over_q"] == 64


def test_plan_gqa_cross_bf16(client):
    p = client.plan(128, 64, batch=2, heads=8, heads_kv=2, seq_kv=512, dtype="BF16")
    assert (p["batch"], p["heads_q"], p["heads_kv"], p["seq_q"], p["seq_kv"]) == (2, 8, 2, 128, 512)
    assert p["bytes"]["q"] == 2 * 8 * 128 * 64 * 2
    assert p["bytes"]["k"] == 2 * 2 * 512 * 64 * 2
    assert p["bytes"]["s"] == 2 * 8 * 128 * 512 * 2


def test_plan_error(client):
    with pytest.raises(attnd.AttndError) as e:
        client.plan(16, 577)  # head_dim past 576
    assert e.value.status == 422


def test_metrics(client):
    assert "attnd" in client.metrics()


# ---------------------------------------------------------------------------------------
# correctness

@pytest.mark.parametrize("wire", ["binary", "json"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["F32", "F16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_attention(client, case, dtype, wire):
    qs, kvs, opts = CASES[case]
    rng = np.random.default_rng(zlib.crc32(repr((case, wire, str(dtype))).encode()))
    q, k, v = rand(rng, qs, dtype), rand(rng, kvs, dtype), rand(rng, kvs, dtype)
    got = client.attention(q, k, v, stats=True, json=(wire == "json"), **opts)
    check(got, reference(q, k, v, **opts), dtype, stats=True)


@pytest.mark.parametrize("wire", ["binary", "json"])
def test_no_stats_returns_array(client, wire):
    rng = np.random.default_rng(1)
    q, k, v = rand(rng, (3, 8, 16)), rand(rng, (3, 11, 16)), rand(rng, (3, 11, 16))
    o = client.attention(q, k, v, causal=True, json=(wire == "json"))
    check(o, reference(q, k, v, causal=True), np.float32, stats=False)
    o[0, 0, 0] = 1.0    # the result is an ordinary, writable array


@pytest.mark.parametrize("wire", ["binary", "json"])
def test_fully_masked_rows(client, wire):
    # Nq=4, Nkv=2, causal: the diagonal is aligned bottom-right, so rows 0 and 1 see no key.
    rng = np.random.default_rng(2)
    q, k, v = rand(rng, (4, 8)), rand(rng, (2, 8)), rand(rng, (2, 8))
    o, m, l, lse = client.attention(q, k, v, causal=True, stats=True, json=(wire == "json"))
    assert np.all(o[:2] == 0)
    assert np.all(np.isneginf(m[:2])) and np.all(np.isneginf(lse[:2]))
    assert np.all(l[:2] == 0)
    assert np.all(np.isfinite(m[2:])) and np.all(l[2:] >= 1)
    check((o, m, l, lse), reference(q, k, v, causal=True), np.float32, stats=True)


@pytest.mark.parametrize("wire", ["binary", "json"])
def test_nested_lists(client, wire):
    q = [[1, 0], [0, 1]]
    k = [[1, 0], [0, 1], [1, 1]]
    v = [[1, 2], [3, 4], [5, 6]]
    o, m, l, lse = client.attention(q, k, v, stats=True, json=(wire == "json"))
    assert o.dtype == np.float32 and o.shape == (2, 2)
    check((o, m, l, lse), reference(q, k, v), np.float32, stats=True)


def test_float64_and_int_inputs_are_sent_as_f32(client):
    rng = np.random.default_rng(3)
    q = rng.standard_normal((5, 4))
    k = np.arange(12).reshape(3, 4) % 3
    v = rng.standard_normal((3, 4))
    o = client.attention(q, k, v)
    assert o.dtype == np.float32
    ref = reference(q.astype(np.float32), k, v.astype(np.float32))
    assert rel_err(o, ref[0]) <= 1e-5


def test_scale_changes_result(client):
    rng = np.random.default_rng(4)
    q, k, v = rand(rng, (6, 8)), rand(rng, (6, 8)), rand(rng, (6, 8))
    a = client.attention(q, k, v, scale=2.0)
    b = client.attention(q, k, v)
    assert rel_err(a, reference(q, k, v, scale=2.0)[0]) <= 1e-5
    assert not np.allclose(a, b)


@pytest.mark.parametrize("backend", ["cpu", "reference", "auto"])
def test_backends(client, backend):
    rng = np.random.default_rng(5)
    q, k, v = rand(rng, (2, 9, 8)), rand(rng, (2, 9, 8)), rand(rng, (2, 9, 8))
    o = client.attention(q, k, v, causal=True, backend=backend)
    assert rel_err(o, reference(q, k, v, causal=True)[0]) <= 1e-5


@pytest.mark.parametrize("wire", ["binary", "json"])
def test_bf16(client, wire):
    rng = np.random.default_rng(6)
    qf, kf, vf = rand(rng, (2, 10, 16)), rand(rng, (1, 14, 16)), rand(rng, (1, 14, 16))
    q, k, v = (attnd.float32_to_bf16(x) for x in (qf, kf, vf))
    o, m, l, lse = client.attention(q, k, v, causal=True, stats=True, bf16=True,
                                    json=(wire == "json"))
    # numpy has no bfloat16: ml_dtypes' when it is installed, else the raw bits
    assert o.dtype == (BF16 if BF16 is not None else np.uint16) and o.shape == (2, 10, 16)
    ref = reference(*(attnd.bf16_to_float32(x) for x in (q, k, v)), causal=True)
    assert rel_err(attnd.bf16_to_float32(o), ref[0]) <= TOL_BF16
    np.testing.assert_allclose(lse, ref[3], rtol=2e-5, atol=2e-5)
    # float inputs with bf16=True are rounded client-side: the same request
    o2 = client.attention(qf, kf, vf, causal=True, bf16=True)
    np.testing.assert_array_equal(o2.view(np.uint16), o.view(np.uint16))


def test_bf16_helpers():
    x = np.array([1.0, -2.5, 1 + 2**-8, 1 + 3 * 2**-8, 3.0e38, 3.4e38, np.inf, -0.0], np.float32)
    bits = attnd.float32_to_bf16(x)
    assert bits.dtype == np.uint16
    back = attnd.bf16_to_float32(bits)
    # 1 + 2^-8 is a tie: to even (1.0); 1 + 3*2^-8 rounds up to 1 + 2^-6; 3.4e38 is past
    # the halfway point above bfloat16's largest finite value (0x7F7F, 3.3895e38): inf
    np.testing.assert_array_equal(back[[0, 1, 2, 3, 5, 6]], [1.0, -2.5, 1.0, 1 + 2**-6, np.inf, np.inf])
    assert bits[4] == 0x7F62 and bits[7] == 0x8000
    assert np.isnan(attnd.bf16_to_float32(attnd.float32_to_bf16(np.float32(np.nan))))


def test_shared_client_many_threads(server):
    client = server.client()
    rng = np.random.default_rng(7)
    inputs = [tuple(rand(rng, (2, 17, 8)) for _ in range(3)) for _ in range(8)]
    results, errors = [None] * 8, []

    def work(i):
        try:
            results[i] = client.attention(*inputs[i], causal=bool(i % 2))
        except Exception as e:   # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, (q, k, v) in enumerate(inputs):
        assert rel_err(results[i], reference(q, k, v, causal=bool(i % 2))[0]) <= 1e-5


# ---------------------------------------------------------------------------------------
# optional packages

def _run_python(code, *args):
    out = subprocess.run([sys.executable, "-c", code] + list(args), capture_output=True,
                         text=True,
                         env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "clients", "python")))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_optional_packages_are_not_imported():
    code = ("import sys, attnd, numpy as np; "
            "print('torch' in sys.modules, 'ml_dtypes' in sys.modules)")
    assert _run_python(code) == "False False"


def test_ml_dtypes_bf16(client):
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed here")
    rng = np.random.default_rng(10)
    q, k, v = (rand(rng, (2, 9, 16)).astype(ml_dtypes.bfloat16) for _ in range(3))
    o, m, l, lse = client.attention(q, k, v, causal=True, stats=True)   # no bf16=True needed
    assert o.dtype == ml_dtypes.bfloat16 and o.shape == (2, 9, 16)
    assert lse.dtype == np.float32
    ref = reference(*(x.astype(np.float64) for x in (q, k, v)), causal=True)
    assert rel_err(o.astype(np.float64), ref[0]) <= TOL_BF16
    # the same request as raw bits with bf16=True
    bits = client.attention(*(x.view(np.uint16) for x in (q, k, v)), causal=True, bf16=True,
                            json=True)
    np.testing.assert_array_equal(bits.view(np.uint16), o.view(np.uint16))
    np.testing.assert_array_equal(attnd.bf16_to_float32(o), o.astype(np.float32))


def test_bf16_bits_without_ml_dtypes(server):
    """Where ml_dtypes cannot be imported, BF16 results are uint16 raw bits."""
    code = """if True:
        import sys
        sys.modules["ml_dtypes"] = None     # import ml_dtypes now raises ImportError
        import numpy as np, attnd
        x = attnd.float32_to_bf16(np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8))
        o = attnd.Client(sys.argv[1]).attention(x, x, x, bf16=True)
        print(o.dtype, o.shape)
    """
    assert _run_python(code, server.url) == "uint16 (4, 8)"


# ---------------------------------------------------------------------------------------
# errors

@pytest.mark.parametrize("wire", ["binary", "json"])
def test_shape_mismatch(client, wire):
    q, k, v = np.ones((2, 4, 8), np.float32), np.ones((2, 5, 8), np.float32), np.ones((2, 6, 8), np.float32)
    e = attnd_error(client.attention, q, k, v, json=(wire == "json"))
    assert (e.status, e.code) == (422, "shape_mismatch")
    assert "v" in e.message and str(e).startswith("422 shape_mismatch")


@pytest.mark.parametrize("wire", ["binary", "json"])
def test_unknown_backend(client, wire):
    x = np.ones((4, 8), np.float32)
    e = attnd_error(client.attention, x, x, x, backend="tpu", json=(wire == "json"))
    assert (e.status, e.code) == (422, "invalid_option")
    assert "backend" in e.message


def test_other_422s(client):
    x32, x16 = np.ones((4, 8), np.float32), np.ones((4, 8), np.float16)
    e = attnd_error(client.attention, x16, x32, x32)
    assert (e.status, e.code) == (422, "dtype_mismatch")
    e = attnd_error(client.attention, np.ones((3, 4, 8), np.float32),
                    np.ones((2, 4, 8), np.float32), np.ones((2, 4, 8), np.float32))
    # the codec checks Hq % Hkv before the engine does (proto/build.c)
    assert (e.status, e.code) == (422, "shape_mismatch")
    assert "multiple" in e.message
    bad = x32.copy()
    bad[1, 2] = np.nan
    e = attnd_error(client.attention, x32, bad, x32)
    assert (e.status, e.code) == (422, "non_finite")
    e = attnd_error(client.attention, x32, x32, x32, causal=True, window=(-1, 2))
    assert (e.status, e.code) == (422, "invalid_window")
    x8 = np.ones(8, np.float32)
    e = attnd_error(client.attention, x8, x8, x8)
    assert (e.status, e.code) == (422, "invalid_tensor")


def test_json_cannot_carry_nan(client):
    x = np.ones((4, 8), np.float32)
    bad = x.copy()
    bad[0, 0] = np.inf
    with pytest.raises(ValueError):
        client.attention(bad, x, x, json=True)


def test_reference_backend_too_large(client):
    x = np.zeros((1, 1, 8192, 8), np.float32)
    e = attnd_error(client.attention, x, x, x, backend="reference")
    assert (e.status, e.code) == (413, "too_large_for_backend")


def test_queue_full(small_queue_server, server):
    """503 queue_full reaches the caller as AttndError with its Retry-After;
    the refusal comes from --max-queue 0, not from a race."""
    client = small_queue_server.client()
    small = np.ones((4, 8), np.float32)
    for _ in range(3):
        with pytest.raises(attnd.AttndError) as ei:
            client.attention(small, small, small)
        e = ei.value
        assert (e.status, e.code) == (503, "queue_full"), e
        assert e.retry_after is not None and e.retry_after >= 1
    # the same request is served by a server that admits it
    assert server.client().attention(small, small, small).shape == (4, 8)


def test_server_down():
    with socket.socket() as s:      # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = attnd.Client("http://127.0.0.1:%d" % port, timeout=2)
    x = np.ones((4, 8), np.float32)
    e = attnd_error(c.attention, x, x, x)
    assert (e.status, e.code) == (0, "unreachable")
    assert attnd_error(c.info).status == 0
    assert c.health() is False and c.ready() is False


def test_server_silent_times_out():
    with socket.socket() as s:      # accepts connections (backlog), never answers
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        c = attnd.Client("http://127.0.0.1:%d" % s.getsockname()[1], timeout=0.3)
        e = attnd_error(c.info)
        assert (e.status, e.code) == (0, "timeout")


class _Plain(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"upstream went away"
        self.send_response(502)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_non_json_error_body():
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _Plain)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        c = attnd.Client("http://127.0.0.1:%d" % httpd.server_address[1], timeout=5)
        e = attnd_error(c.info)
        assert (e.status, e.code) == (502, "http_error")
        assert "upstream went away" in e.message
        assert c.health() is False
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_not_found_is_json_error(server):
    c = attnd.Client(server.url + "/nowhere")
    e = attnd_error(c.info)
    assert (e.status, e.code) == (404, "not_found")


# ---------------------------------------------------------------------------------------
# the safetensors writer, checked without HTTP

def test_safetensors_layout():
    q = np.arange(6, dtype=np.float32).reshape(2, 3)
    h = np.arange(3, dtype=np.float16)
    b = np.array([0x3F80, 0x4000], np.uint16)
    buf = safetensors.encode([("q", "F32", q), ("h", "F16", h), ("b", "BF16", b)],
                             metadata={"causal": "true"})
    n = int.from_bytes(buf[:8], "little")
    assert (8 + n) % 8 == 0
    header = json.loads(buf[8:8 + n])
    assert buf[8:8 + n].rstrip(b" ") == buf[8:8 + n].rstrip()     # padded with spaces only
    assert header["__metadata__"] == {"causal": "true"}
    assert header["q"] == {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}
    assert header["h"] == {"dtype": "F16", "shape": [3], "data_offsets": [24, 30]}
    assert header["b"] == {"dtype": "BF16", "shape": [2], "data_offsets": [30, 34]}
    assert len(buf) == 8 + n + 34
    tensors, meta = safetensors.decode(buf)
    assert meta == {"causal": "true"}
    np.testing.assert_array_equal(tensors["q"], q)
    np.testing.assert_array_equal(tensors["h"], h)
    assert tensors["h"].dtype == np.float16
    np.testing.assert_array_equal(tensors["b"], b)
    with pytest.raises(safetensors.SafetensorsError):
        safetensors.decode(buf[:-1])
    with pytest.raises(safetensors.SafetensorsError):
        safetensors.decode(b"\xff" * 8)


def test_safetensors_against_attn_compute(tmp_path):
    attn = os.path.join(os.path.dirname(os.environ.get("ATTND_BIN", "build/attnd")), "attn")
    if not os.path.isabs(attn):
        attn = os.path.join(ROOT, attn)
    if not os.access(attn, os.X_OK):
        pytest.skip("no build/attn")
    rng = np.random.default_rng(9)
    q, k, v = rand(rng, (1, 4, 5, 24)), rand(rng, (1, 2, 7, 24)), rand(rng, (1, 2, 7, 24))
    req, rep = tmp_path / "req.safetensors", tmp_path / "rep.safetensors"
    req.write_bytes(safetensors.encode([("q", "F32", q), ("k", "F32", k), ("v", "F32", v)],
                                       metadata={"causal": "true"}))
    r = subprocess.run([attn, "compute", str(req), str(rep), "--stats"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    tensors, _ = safetensors.decode(rep.read_bytes())
    got = tuple(tensors[n] for n in ("o", "m", "l", "lse"))
    check(got, reference(q, k, v, causal=True), np.float32, stats=True)
