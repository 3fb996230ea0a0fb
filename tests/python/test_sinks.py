"""Attention sinks (gpt-oss) through the Python client against a real attnd, checked against
attn_ref's float64 formula: forward (o, m, l, lse) and backward (dq, dk, dv, dsinks) in F32,
F16 and BF16, both wire formats, GQA, causal, windows whose rows see no key (o = 0, lse =
the sink), K/V sharded across three servers (the sink counted once), session calls and
_batch, the refusals, and attnd.torch's gradients (sinks a parameter that requires grad)
against torch's own autograd of the eager formula (skipped where torch is not installed;
run with build/peers-venv/bin/python, which has it).
"""

import zlib

import numpy as np
import pytest

import attnd

from attn_ref import BF16, TOL, TOL_BF16, reference, reference_backward, reference_dsinks, \
    rel_err
from conftest import _serve, attnd_error

# (q shape, kv shape, options)
CASES = {
    "2d": ((7, 16), (7, 16), {}),
    "3d-gqa": ((4, 6, 8), (2, 6, 8), {}),
    "3d-causal-cross": ((2, 5, 16), (2, 9, 16), {"causal": True}),
    "4d-gqa-causal": ((2, 4, 10, 12), (2, 2, 13, 12), {"causal": True}),
    "4d-mqa-window": ((2, 4, 20, 8), (2, 1, 20, 8), {"window": (3, 2)}),
    "4d-scale": ((1, 2, 9, 64), (1, 2, 33, 64), {"scale": 0.3}),
    # off = Nkv - Nq = -5: query i sees keys [i - 6, i - 5], so rows 0..4 see none
    "3d-window-rows-see-nothing": ((2, 9, 8), (2, 4, 8), {"window": (1, 0)}),
    # Nq > Nkv, causal: rows 0..3 see no key
    "4d-causal-rows-see-nothing": ((1, 4, 7, 8), (1, 2, 3, 8), {"causal": True}),
}

# The dtype sent and the normalized error allowed against float64 (the statistics are F32
# from the rounded inputs whatever the dtype: 2e-5 for all)
DTYPES = {"F32": TOL[np.float32], "F16": TOL[np.float16], "BF16": TOL_BF16}


def _heads(shape):
    return shape[-3] if len(shape) >= 3 else 1


def _sinks(rng, hq, big=False):
    """Per-head logits around the scores' size, some far above them when big (then m is the
    sink on most rows)."""
    s = rng.uniform(-3.0, 3.0, hq)
    if big:
        s[::2] = 12.0
    return s.astype(np.float32)


def _round(x, dtype):
    """x as sent in dtype (BF16 as raw bits) and its float64 values."""
    if dtype == "BF16":
        bits = attnd.float32_to_bf16(x)
        return bits, attnd.bf16_to_float32(bits).astype(np.float64)
    a = x.astype(np.float16 if dtype == "F16" else np.float32)
    return a, a.astype(np.float64)


def _problem(case, dtype, seed, big=False):
    """(sent, wide, sinks, opts): q, k, v, dO as sent and as float64, the sinks (F32)."""
    qs, kvs, opts = CASES[case]
    rng = np.random.default_rng(seed)
    raw = [rng.standard_normal(s).astype(np.float32) for s in (qs, kvs, kvs, qs)]
    pairs = [_round(x, dtype) for x in raw]
    return [p[0] for p in pairs], [p[1] for p in pairs], _sinks(rng, _heads(qs), big), \
        dict(opts)


def _wide(x):
    x = np.asarray(x)
    if x.dtype == np.uint16 or (BF16 is not None and x.dtype == BF16):
        return attnd.bf16_to_float32(x).astype(np.float64)
    return x.astype(np.float64)


def _seed(*parts):
    return zlib.crc32(repr(parts).encode())


def _check_stats(got, ref, tol):
    for name, x, r in zip(("m", "l", "lse"), got, ref):
        assert x.dtype == np.float32 and x.shape == r.shape, name
        assert np.all(np.isfinite(x)), name   # with a sink every row has a finite lse
        worst = np.max(np.abs(x - r) / np.maximum(1.0, np.abs(r)))
        assert worst <= tol, (name, worst)


# ---------------------------------------------------------------------------------------
# the oracle itself

def test_reference_matches_the_eager_formula():
    """attn_ref's sinks against gpt-oss's eager attention written in numpy: the scores
    concatenated with the sink column, softmax, the column dropped."""
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((3, 5, 4)), rng.standard_normal((3, 7, 4)), \
        rng.standard_normal((3, 7, 4))
    sinks = rng.uniform(-2, 2, 3)
    s = np.einsum("hqd,hkd->hqk", q, k) / 2.0
    s = np.where(np.tril(np.ones((5, 7), bool), 2), s, -np.inf)
    cat = np.concatenate([s, np.broadcast_to(sinks[:, None, None], (3, 5, 1))], axis=-1)
    p = np.exp(cat - cat.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    want = np.einsum("hqk,hkd->hqd", p[..., :-1], v)
    o, m, l, lse = reference(q, k, v, causal=True, sinks=sinks)
    np.testing.assert_allclose(o, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, np.log(np.exp(cat).sum(axis=-1)), rtol=1e-12)


def test_reference_backward_matches_finite_differences():
    """dq, dk, dv and dsinks of the oracle against central differences of its forward."""
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal((2, 4, 6, 5)), rng.standard_normal((2, 2, 8, 5)), \
        rng.standard_normal((2, 2, 8, 5))
    do, sinks = rng.standard_normal(q.shape), rng.uniform(-2, 2, 4)
    opts = {"causal": True, "window": (3, -1), "scale": 0.7}
    grads = reference_backward(q, k, v, do, sinks=sinks, **opts)
    args, eps = [q, k, v, sinks], 1e-6

    def loss(a):
        return (reference(*a[:3], sinks=a[3], **opts)[0] * do).sum()

    for which, g in enumerate(grads):
        for idx in list(np.ndindex(*g.shape))[::7]:
            plus, minus = [a.copy() for a in args], [a.copy() for a in args]
            plus[which][idx] += eps
            minus[which][idx] -= eps
            fd = (loss(plus) - loss(minus)) / (2 * eps)
            assert abs(fd - g[idx]) <= 1e-6 * max(1.0, abs(g[idx])), (which, idx)


# ---------------------------------------------------------------------------------------
# forward

@pytest.mark.parametrize("wire", ["binary", "json"])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_forward(client, case, dtype, wire):
    sent, wide, sinks, opts = _problem(case, dtype, _seed(case, dtype, wire),
                                       big=case.endswith("scale"))
    q, k, v, _ = sent
    got = client.attention(q, k, v, sinks=sinks, stats=True, bf16=dtype == "BF16",
                           json=(wire == "json"), **opts)
    ref = reference(*wide[:3], sinks=sinks, **opts)
    assert got[0].shape == ref[0].shape
    assert rel_err(_wide(got[0]), ref[0]) <= DTYPES[dtype], rel_err(_wide(got[0]), ref[0])
    _check_stats(got[1:], ref[1:], 2e-5)


@pytest.mark.parametrize("wire", ["binary", "json"])
def test_rows_that_see_no_key(client, wire):
    """o = 0 exactly, m = lse = the head's sink, l = 1."""
    sent, wide, sinks, opts = _problem("3d-window-rows-see-nothing", "F32", 3)
    q, k, v, _ = sent
    o, m, l, lse = client.attention(q, k, v, sinks=sinks, stats=True, json=(wire == "json"),
                                    **opts)
    assert np.all(o[:, :5] == 0)
    np.testing.assert_array_equal(lse[:, :5], np.repeat(sinks[:, None], 5, axis=1))
    np.testing.assert_array_equal(m[:, :5], lse[:, :5])
    np.testing.assert_array_equal(l[:, :5], 1.0)
    assert np.all(np.abs(o[:, 5:]).sum(axis=-1) > 0)


def test_sinks_change_the_answer_and_backends_agree(client):
    """The server does not drop them; the cpu and the float64 reference backends agree;
    sinks given as a nested list or float64 go as F32."""
    sent, wide, sinks, opts = _problem("4d-gqa-causal", "F32", 4)
    q, k, v, _ = sent
    plain = client.attention(q, k, v, **opts)
    cpu = client.attention(q, k, v, sinks=sinks, backend="cpu", **opts)
    assert rel_err(cpu, plain.astype(np.float64)) > 1e-2
    ref = client.attention(q, k, v, sinks=sinks.tolist(), backend="reference", **opts)
    assert rel_err(cpu, ref.astype(np.float64)) <= TOL[np.float32]
    auto = client.attention(q, k, v, sinks=sinks.astype(np.float64), **opts)
    np.testing.assert_array_equal(auto, cpu)


# ---------------------------------------------------------------------------------------
# backward

def _check_grads(got, ref, tol):
    assert len(got) == 4
    for name, x, r in zip(("dq", "dk", "dv", "dsinks"), got, ref):
        assert x.shape == r.shape, (name, x.shape, r.shape)
        assert np.all(np.isfinite(_wide(x))), name
        assert rel_err(_wide(x), r) <= tol, (name, rel_err(_wide(x), r))
    assert got[3].dtype == np.float32


@pytest.mark.parametrize("wire", ["binary", "json"])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_backward(client, case, dtype, wire):
    sent, wide, sinks, opts = _problem(case, dtype, _seed("bwd", case, dtype, wire))
    q, k, v, do = sent
    bf16 = dtype == "BF16"
    o, _, _, lse = client.attention(q, k, v, sinks=sinks, stats=True, bf16=bf16, **opts)
    got = client.attention_backward(q, k, v, o, do, lse, sinks=sinks, bf16=bf16,
                                    json=(wire == "json"), **opts)
    ref = reference_backward(*wide, sinks=sinks, **opts)
    # dsinks is a sum of dO·O over the rows, with O as sent (rounded to the dtype): the
    # contract's formula on that O, beside the float64 O's (a rounded O moves it further)
    lse64 = reference(*wide[:3], sinks=sinks, **opts)[3]
    _check_grads(got, ref[:3] + (reference_dsinks(_wide(o), wide[3], lse64, sinks),),
                 DTYPES[dtype])
    assert rel_err(got[3], ref[3]) <= 4 * DTYPES[dtype]


@pytest.mark.parametrize("case", sorted(CASES))
def test_backward_without_lse(client, case):
    """The server recomputes the lse, sink included."""
    sent, wide, sinks, opts = _problem(case, "F32", _seed("nolse", case), big=True)
    q, k, v, do = sent
    o = client.attention(q, k, v, sinks=sinks, **opts)
    got = client.attention_backward(q, k, v, o, do, sinks=sinks, **opts)
    _check_grads(got, reference_backward(*wide, sinks=sinks, **opts), TOL[np.float32])


def test_backward_rows_that_see_no_key(client):
    """A row with no visible key gives nothing: dq = 0 there, and no term of dsinks (its
    dO·O is 0)."""
    sent, wide, sinks, opts = _problem("3d-window-rows-see-nothing", "F32", 5)
    q, k, v, do = sent
    o, _, _, lse = client.attention(q, k, v, sinks=sinks, stats=True, **opts)
    got = client.attention_backward(q, k, v, o, do, lse, sinks=sinks, **opts)
    assert np.all(got[0][:, :5] == 0)
    _check_grads(got, reference_backward(*wide, sinks=sinks, **opts), TOL[np.float32])


# ---------------------------------------------------------------------------------------
# K/V sharded across three servers: the sink enters the merged lse once

@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    gens = [_serve(["--threads", "1"], tmp_path_factory) for _ in range(3)]
    yield [next(g) for g in gens]
    for g in gens:
        next(g, None)


# name: (hq, hkv, nq, nkv, d, options)
SHARDED = {
    "plain": (2, 2, 33, 100, 16, {}),
    "gqa-causal": (4, 2, 20, 90, 8, {"causal": True}),
    # late rows see no key of the first shard: it answers o = 0, lse = the sink for them
    "window": (2, 1, 120, 120, 16, {"window": (10, 3)}),
    # Nq > Nkv: rows 0..39 see no key of any shard
    "rows-see-nothing": (2, 2, 70, 30, 16, {"causal": True}),
}


def _sharded_problem(name):
    hq, hkv, nq, nkv, d, opts = SHARDED[name]
    rng = np.random.default_rng(_seed("sharded", name))
    q, k, v = (rng.standard_normal(s).astype(np.float32)
               for s in ((hq, nq, d), (hkv, nkv, d), (hkv, nkv, d)))
    return q, k, v, _sinks(rng, hq), opts


@pytest.mark.parametrize("name", sorted(SHARDED))
def test_sharded(shards, name):
    q, k, v, sinks, opts = _sharded_problem(name)
    o, lse = attnd.sharded_attention([s.client() for s in shards], q, k, v, sinks=sinks,
                                     return_lse=True, **opts)
    ro, _, _, rlse = reference(q, k, v, sinks=sinks, **opts)
    assert o.dtype == np.float32 and o.shape == q.shape
    assert rel_err(o, ro) <= TOL[np.float32], rel_err(o, ro)
    assert np.max(np.abs(lse - rlse) / np.maximum(1.0, np.abs(rlse))) <= 2e-5


def test_sharded_sink_on_every_shard_would_be_wrong(shards):
    """What the one-shard rule guards against: a sink sent to all three shards enters the
    merged softmax three times, and the answer moves far from the formula's."""
    q, k, v, sinks, opts = _sharded_problem("plain")
    cs = [s.client() for s in shards]
    bounds = [(0, 33), (33, 66), (66, 100)]
    parts = [c.attention(q, k[:, a:b], v[:, a:b], sinks=sinks, stats=True,
                         diag_offset=(100 - 33) - a) for c, (a, b) in zip(cs, bounds)]
    o3, _ = attnd.merge_shards([p[0].astype(np.float64) for p in parts],
                               [p[3].astype(np.float64) for p in parts])
    ro = reference(q, k, v, sinks=sinks)[0]
    assert rel_err(o3, ro) > 1e-2
    assert rel_err(attnd.sharded_attention(cs, q, k, v, sinks=sinks), ro) <= TOL[np.float32]


# ---------------------------------------------------------------------------------------
# sessions

def test_session_prefill_then_decode(client):
    """Each call's o and lse over the layer's keys so far, causal bottom-right."""
    rng = np.random.default_rng(6)
    hq, hkv, d = 4, 2, 16
    sinks = _sinks(rng, hq)
    keys, values = np.zeros((hkv, 0, d), np.float32), np.zeros((hkv, 0, d), np.float32)
    with client.session("sinks-decode", heads_kv=hkv, head_dim=d, max_tokens=64) as s:
        for step, n in enumerate((9, 1, 1, 3)):
            q, k, v = (rng.standard_normal((h, n, d)).astype(np.float32)
                       for h in (hq, hkv, hkv))
            o, _, _, lse = s.attend(q, k, v, sinks=sinks, stats=True, json=step == 2)
            keys, values = np.concatenate([keys, k], 1), np.concatenate([values, v], 1)
            ro, _, _, rlse = reference(q, keys, values, causal=True, sinks=sinks)
            assert rel_err(o, ro) <= TOL[np.float32], step
            np.testing.assert_allclose(lse, rlse, rtol=2e-5, atol=2e-5)
        # without k, v: over the whole layer, with its own window
        q = rng.standard_normal((hq, 2, d)).astype(np.float32)
        o = s.attend(q, sinks=sinks, window=(4, 0))
        ro = reference(q, keys, values, window=(4, 0), sinks=sinks)[0]
        assert rel_err(o, ro) <= TOL[np.float32]
        assert s.lengths == [14]


def test_session_batch(client):
    """Two calls of two sessions, safetensors then JSON; each entry over its own keys."""
    rng = np.random.default_rng(7)
    hq, hkv, d = 4, 1, 8
    sinks = _sinks(rng, hq)
    made = [client.session("sinks-batch-%d" % i, heads_kv=hkv, head_dim=d, max_tokens=32)
            for i in range(2)]
    held = [(np.zeros((hkv, 0, d), np.float32),) * 2 for _ in made]
    cu_q, cu_kv = np.array([0, 3, 4]), np.array([0, 5, 6])
    try:
        for json in (False, True):
            q = rng.standard_normal((hq, 4, d)).astype(np.float32)
            k, v = (rng.standard_normal((hkv, 6, d)).astype(np.float32) for _ in "kv")
            o = client.session_batch(made, q, k, v, cu_q, cu_kv, sinks=sinks, json=json)
            for e in range(2):
                new = slice(cu_kv[e], cu_kv[e + 1])
                held[e] = tuple(np.concatenate([h, x[:, new]], 1) for h, x in zip(held[e],
                                                                                 (k, v)))
                rows = slice(cu_q[e], cu_q[e + 1])
                ro = reference(q[:, rows], *held[e], causal=True, sinks=sinks)[0]
                assert rel_err(o[:, rows], ro) <= TOL[np.float32], (json, e)
    finally:
        for s in made:
            s.delete(missing_ok=True)


# ---------------------------------------------------------------------------------------
# refusals: the server's code and message

@pytest.mark.parametrize("wire", ["binary", "json"])
def test_refusals(client, wire):
    sent, _, sinks, opts = _problem("3d-gqa", "F32", 8)
    q, k, v, do = sent
    json = wire == "json"
    for bad in (sinks[:3], np.concatenate([sinks, sinks[:1]]), sinks.reshape(2, 2)):
        e = attnd_error(client.attention, q, k, v, sinks=bad, json=json)
        assert e.status == 422 and "sinks" in e.message, e
        assert str(e) == "422 %s: %s" % (e.code, e.message)
    o = client.attention(q, k, v, sinks=sinks)
    e = attnd_error(client.attention_backward, q, k, v, o, do, sinks=sinks[:2], json=json)
    assert e.status == 422 and "sinks" in e.message, e
    with client.session("sinks-refused", heads_kv=2, head_dim=8, max_tokens=8) as s:
        e = attnd_error(s.attend, q[:, :1], k[:, :1], v[:, :1], sinks=sinks[:1], json=json)
        assert e.status == 422 and "sinks" in e.message, e
        assert s.info()["lengths"] == [0]   # a refused call appends nothing


def test_non_finite_sinks(client):
    sent, _, sinks, _ = _problem("3d-gqa", "F32", 9)
    q, k, v, _ = sent
    for x in (np.nan, np.inf, -np.inf):
        bad = sinks.copy()
        bad[1] = x
        e = attnd_error(client.attention, q, k, v, sinks=bad)
        assert (e.status, e.code) == (422, "non_finite") and "sinks" in e.message, e
        with pytest.raises(ValueError):   # JSON has neither NaN nor infinity
            client.attention(q, k, v, sinks=bad, json=True)


# ---------------------------------------------------------------------------------------
# attnd.torch: sinks as a parameter that requires grad

def _torch():
    try:
        import torch
    except ImportError:
        print("skipped: torch is not installed in this interpreter")
        pytest.skip("torch is not installed in this interpreter (build/peers-venv has it)")
    import attnd.torch   # noqa: F401
    return torch


def _eager(torch, q, k, v, sinks, causal=False, window=(-1, -1), scale=None):
    """gpt-oss's eager attention (transformers' eager_attention_forward) with the
    bottom-right mask: the scores concatenated with the sink column, softmax, the column
    dropped."""
    g = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(g, -3), v.repeat_interleave(g, -3)
    nq, nkv = q.shape[-2], k.shape[-2]
    i, j = torch.arange(nq)[:, None], torch.arange(nkv)[None, :]
    wl, wr = window[0], 0 if causal else window[1]
    visible = torch.ones(nq, nkv, dtype=torch.bool)
    if wl >= 0:
        visible &= j >= i + nkv - nq - wl
    if wr >= 0:
        visible &= j <= i + nkv - nq + wr
    s = (q @ k.transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)
    s = s.masked_fill(~visible, float("-inf"))
    sink = sinks.reshape(-1, 1, 1).expand(*s.shape[:-1], 1)
    cat = torch.cat([s, sink], dim=-1)
    p = torch.softmax(cat - cat.max(dim=-1, keepdim=True).values, dim=-1)
    return p[..., :-1] @ v


TORCH_CASES = ("3d-gqa", "4d-gqa-causal", "4d-mqa-window", "3d-window-rows-see-nothing",
               "4d-causal-rows-see-nothing")


@pytest.mark.parametrize("case", TORCH_CASES)
def test_torch_gradients(client, case):
    """o and the gradients of q, k, v and the sinks against torch's autograd of the eager
    formula in float64 on the same values."""
    torch = _torch()
    sent, _, sinks, opts = _problem(case, "F32", _seed("torch", case))
    q, k, v, w = (torch.from_numpy(x) for x in sent)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, torch.from_numpy(sinks))]
    window = opts.pop("window", (-1, -1))
    o = attnd.torch.attention(*leaves[:3], client=client, sinks=leaves[3],
                              window_left=window[0], window_right=window[1], **opts)
    (o * w).sum().backward()
    wide = [x.detach().double().requires_grad_() for x in leaves]
    o64 = _eager(torch, *wide, window=window, **opts)
    (o64 * w.double()).sum().backward()
    assert o.dtype == torch.float32 and rel_err(o.detach().double().numpy(),
                                                o64.detach().numpy()) <= 1e-5
    for name, x, ref in zip(("dq", "dk", "dv", "dsinks"), leaves, wide):
        assert x.grad.dtype == torch.float32 and x.grad.shape == x.shape, name
        err = rel_err(x.grad.double().numpy(), ref.grad.numpy())
        assert err <= 1e-5, (name, err)


def test_torch_bf16_model_parameter(client):
    """A bfloat16 layer (q, k, v and the sinks parameter, as gpt-oss keeps them): the
    gradient comes back in bfloat16, close to float64's."""
    torch = _torch()
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(*s, generator=g).bfloat16().requires_grad_()
               for s in ((1, 4, 12, 16), (1, 2, 12, 16), (1, 2, 12, 16)))
    sinks = torch.nn.Parameter(torch.randn(4, generator=g).bfloat16())
    o = attnd.torch.attention(q, k, v, causal=True, sinks=sinks, client=client)
    assert o.dtype == torch.bfloat16
    o.float().square().sum().backward()
    wide = [x.detach().double().requires_grad_() for x in (q, k, v, sinks)]
    o64 = _eager(torch, *wide, causal=True)
    o64.square().sum().backward()
    assert sinks.grad.dtype == torch.bfloat16 and sinks.grad.shape == (4,)
    for name, x, ref in zip(("dq", "dk", "dv", "dsinks"), (q, k, v, sinks), wide):
        err = rel_err(x.grad.double().numpy(), ref.grad.numpy())
        assert err <= 2e-2, (name, err)


def test_torch_gradcheck(client):
    """torch.autograd.gradcheck: the server's analytic gradients (F32 on the wire) against
    torch's own central differences of the server's forward, tolerances for F32."""
    torch = _torch()
    g = torch.Generator().manual_seed(10)
    inputs = [torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_()
              for s in ((2, 3, 4), (1, 3, 4), (1, 3, 4), (2,))]

    def fn(q, k, v, sinks):
        return attnd.torch.attention(q, k, v, causal=True, sinks=sinks, client=client)

    assert torch.autograd.gradcheck(fn, inputs, eps=1e-2, atol=2e-3, rtol=1e-2)
