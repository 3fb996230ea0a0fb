"""Quantized sessions (``kv_dtype="F8_E4M3"`` or ``"I8"``) through the Python client against
a real attnd: each reply equals attn_ref's float64 formula over the rows the session stores
(each appended row quantized per KV head: code x scale, with the scale the row's largest |x|
over 448 or 127, rounded to nearest even); its error against attention over the rows as sent
is printed and held to a bound the format allows. GET shows kv_dtype, the reservation is
smaller than BF16's, and an export moves it (its scales as k_scale.L, v_scale.L).
"""

import itertools
import json
import struct

import numpy as np
import pytest

from attn_ref import TOL, reference, rel_err

_ids = itertools.count()


def _sid(tag):
    return "pytest-quant-%s-%d" % (tag, next(_ids))


def _round_e4m3(x):
    """x (float32 values) to the nearest E4M3 value (the "fn" variant, saturating at 448):
    in each binade [2^e, 2^(e+1)) the values are 2^(e-3) apart, below 2^-6 2^-9 apart, and
    np.rint's ties to even are the even code's (the mantissa's last bit)."""
    a = np.minimum(np.abs(x.astype(np.float64)), 448)
    e = np.floor(np.log2(np.maximum(a, 2.0 ** -6)))
    quantum = 2.0 ** (e - 3)
    return np.sign(x) * np.minimum(np.rint(a / quantum) * quantum, 448)


def stored(x, kind):
    """The rows [.., n, d] as a quantized session stores them (float32, code x scale)."""
    x = x.astype(np.float32)
    mx = np.abs(x).max(axis=-1, keepdims=True)
    qmax = np.float32(448 if kind == "F8_E4M3" else 127)
    scale = (mx / qmax).astype(np.float32)
    safe = np.where(scale == 0, np.float32(1), scale)
    y = (x / safe).astype(np.float32)
    codes = _round_e4m3(y) if kind == "F8_E4M3" else np.clip(np.rint(y), -127, 127)
    return (codes.astype(np.float32) * scale).astype(np.float32)


@pytest.mark.parametrize("kind", ["F8_E4M3", "I8"])
def test_quantized_session_matches_its_stored_rows(client, kind):
    rng = np.random.default_rng(5)
    hq, hkv, d, n = 4, 2, 64, 90
    q = rng.standard_normal((hq, n, d)).astype(np.float32)
    k = (rng.standard_normal((hkv, n, d)) * 2).astype(np.float32)
    v = rng.standard_normal((hkv, n, d)).astype(np.float32)
    with client.session(_sid(kind), heads_kv=hkv, head_dim=d, max_tokens=4096,
                        kv_dtype=kind) as s:
        info = s.info()
        assert info["kv_dtype"] == kind, info
        # rows of 64 codes and a scale: 960 a page, 5 pages a head for 4096 tokens
        assert info["reserved_bytes"] == 2 * hkv * 5 * 65536, info
        ks, vs = stored(k, kind), stored(v, kind)
        for lo, hi in ((0, 80), (80, 81), (81, 90)):
            o = s.attend(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi])
            ref = reference(q[:, lo:hi], ks[:, :hi], vs[:, :hi], causal=True)[0]
            err = rel_err(o, ref)
            assert err <= TOL[np.float32], "%s: error %.3g against the stored rows" % (kind, err)
            exact = reference(q[:, lo:hi], k[:, :hi], v[:, :hi], causal=True)[0]
            loss = rel_err(o, exact)
            print("%s tokens [%d, %d): error against unquantized attention %.3g"
                  % (kind, lo, hi, loss))
            # E4M3 keeps 3 mantissa bits (an element's step up to 1/16 of it), I8 7 bits of
            # the row's largest: a decode row's error (here about 0.04 to 0.08 and 0.01)
            # stays within these bounds
            assert loss <= (0.15 if kind == "F8_E4M3" else 0.03), loss
        data = s.export()
        header = json.loads(data[8:8 + struct.unpack("<Q", data[:8])[0]])
        assert header["__metadata__"]["kv_dtype"] == kind
        assert header["k.0"]["dtype"] == kind and header["k.0"]["shape"] == [hkv, 90, d]
        assert header["k_scale.0"]["dtype"] == "F32" and header["k_scale.0"]["shape"] == [hkv, 90]
        t = client.import_session(s.id + "-moved", data)
        try:
            assert t.info()["kv_dtype"] == kind
            assert t.export() == data
        finally:
            t.delete()


def test_kv_dtype_is_checked(client):
    with pytest.raises(ValueError):
        client.session(_sid("bad"), heads_kv=1, head_dim=8, max_tokens=8, kv_dtype="F8_E5M2")
    with client.session(_sid("named"), heads_kv=1, head_dim=8, max_tokens=8,
                        kv_dtype="F32") as s:
        assert s.info()["kv_dtype"] == "F32"
