"""Exact attention over K/V sharded across three attnd processes (attnd.sharded_attention),
the CLI's `attn infer --shards`, and diag_offset over HTTP.

Each shard's server gets diag_offset = off - a for its keys [a, b), so the merged answer
must equal one server's unsharded answer within F32 tolerance: plain, causal, GQA, a
window, rows that see no key of a shard, and rows that see no key at all.
"""

import os
import subprocess
import zlib

import numpy as np
import pytest

import attnd
from attn_ref import reference
from conftest import ROOT, _serve

TOL = 1e-5  # F32, normalized


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    gens = [_serve(["--threads", "1"], tmp_path_factory) for _ in range(3)]
    servers = [next(g) for g in gens]
    yield servers
    for g in gens:
        next(g, None)


def _err(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    den = np.linalg.norm(ref)
    return np.linalg.norm(x - ref) / (den if den > 0 else 1.0)


def _lse_err(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    same_inf = np.isneginf(x) == np.isneginf(ref)
    fin = np.isfinite(ref)
    worst = np.max(np.abs(x[fin] - ref[fin]) / np.maximum(1, np.abs(ref[fin]))) if fin.any() \
        else 0.0
    return worst if same_inf.all() else np.inf


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


CASES = {
    # name: (hq, hkv, nq, nkv, d, options)
    "plain": (2, 2, 33, 100, 16, {}),
    "causal": (2, 2, 64, 64, 32, {"causal": True}),
    "gqa": (4, 2, 20, 90, 8, {"causal": True}),
    "window": (2, 1, 50, 120, 16, {"window": (10, 3)}),
    # off = 30: rows 0..29 see no key of the last shard [60, 90)
    "shard_rows_masked": (2, 2, 60, 90, 16, {"causal": True}),
    # Nq > Nkv: rows 0..39 see no key at all (O = 0, lse = -inf)
    "rows_see_nothing": (2, 2, 70, 30, 16, {"causal": True}),
    # torch's top-left is_causal: most rows see nothing of the later shards
    "top_left": (2, 2, 25, 99, 16, {"causal": True, "diag_offset": 0}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_sharded_equals_one_server(shards, name):
    hq, hkv, nq, nkv, d, opts = CASES[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    q, k, v = _rand(rng, hq, nq, d), _rand(rng, hkv, nkv, d), _rand(rng, hkv, nkv, d)
    one = shards[0].client()
    o1, _, _, lse1 = one.attention(q, k, v, stats=True, **opts)
    o, lse = attnd.sharded_attention([s.client() for s in shards], q, k, v, return_lse=True,
                                     **opts)
    assert o.dtype == np.float32 and o.shape == q.shape
    assert _err(o, o1) <= TOL, "O differs from one server's by %.3g" % _err(o, o1)
    assert _lse_err(lse, lse1) <= TOL
    if "diag_offset" not in opts:   # the float64 reference has no diag_offset
        ref_o, _, _, ref_lse = reference(q, k, v, causal=opts.get("causal", False),
                                         window=opts.get("window", (-1, -1)))
        assert _err(o, ref_o) <= TOL
        assert _lse_err(lse, ref_lse) <= TOL
    if name == "rows_see_nothing":
        assert np.all(o[:, :40] == 0) and np.all(np.isneginf(lse[:, :40]))


def test_sharded_urls_and_f16(shards):
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal(s).astype(np.float16) for s in ((2, 10, 8), (2, 40, 8),
                                                                   (2, 40, 8)))
    o = attnd.sharded_attention([s.url for s in shards], q, k, v, causal=True)
    o1 = shards[0].client().attention(q, k, v, causal=True)
    assert o.dtype == np.float16
    assert _err(o, o1) <= 1e-3


def test_sharded_alibi(shards):
    """ALiBi shards exactly once the server has alibi_slopes; until then it says why."""
    rng = np.random.default_rng(11)
    q, k, v = _rand(rng, 2, 30, 16), _rand(rng, 2, 80, 16), _rand(rng, 2, 80, 16)
    slopes = np.array([0.25, 0.0625], np.float32)
    one = shards[0].client()
    try:
        o1 = one.attention(q, k, v, causal=True, alibi_slopes=slopes)
    except TypeError as e:
        pytest.skip("this client has no alibi_slopes yet: %s" % e)
    except attnd.AttndError as e:
        if e.status != 422:
            raise
        pytest.skip("the server refuses alibi_slopes (%s): %s" % (e.code, e.message))
    o = attnd.sharded_attention([s.client() for s in shards], q, k, v, causal=True,
                                alibi_slopes=slopes)
    assert _err(o, o1) <= TOL


def test_diag_offset_over_http(shards):
    """diag_offset = 0 is top-left causal: row i sees keys 0..i, the same as bottom-right
    causal over the first Nq keys."""
    rng = np.random.default_rng(3)
    q, k, v = _rand(rng, 2, 12, 8), _rand(rng, 2, 50, 8), _rand(rng, 2, 50, 8)
    c = shards[1].client()
    for json in (False, True):
        o = c.attention(q, k, v, causal=True, diag_offset=0, json=json)
        ref_o = reference(q, k[:, :12], v[:, :12], causal=True)[0]
        assert _err(o, ref_o) <= TOL
    e = pytest.raises(attnd.AttndError, c.attention, q, k, v, diag_offset=2**40 + 1)
    assert e.value.status == 422 and e.value.code == "invalid_option"


def test_cli_shards_check(shards, tmp_path):
    """attn infer --shards URL1,URL2,URL3 --check merges and checks against float64."""
    binary = os.environ.get("ATTN_BIN", os.path.join(ROOT, "build", "attn"))
    if not os.path.isabs(binary):
        binary = os.path.join(ROOT, binary)
    urls = ",".join(s.url for s in shards)
    for extra in ([], ["--causal"], ["--causal", "--window-left", "7"]):
        r = subprocess.run([binary, "infer", "--shards", urls, "--shape", "1,4,40,16",
                            "--shape-kv", "1,2,100,16", "--check"] + extra,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "check" in r.stdout and "3 shards" in r.stdout, r.stdout
