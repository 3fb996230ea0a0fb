"""Values with a head dim of their own (Dv != D; DeepSeek-V3's MLA prefill: q·k over D 192,
values of Dv 128) through the Python client against a real attnd, checked against attn_ref's
float64 formula: forward (o of Dv columns, m, l, lse) and backward (dq, dk of D columns, dv
of Dv) in F32, F16 and BF16 over both wire formats, GQA/MQA, causal, windows, sinks; the
default scale 1/sqrt(D) (not Dv); K/V sharded across servers (the merge over Dv columns);
the refusals (a v or dO of the wrong width, Dv past the limit, a session call or _batch
whose v is not the session's head_dim_v wide; sessions of their own Dv are
test_session_dv.py's); and attnd.torch against torch's own SDPA (which takes v with its own
last dimension), gradients included, skipped where torch is not installed (run with
build/peers-venv/bin/python, which has it).
"""

import math
import zlib

import numpy as np
import pytest

import attnd

from attn_ref import BF16, TOL, TOL_BF16, reference, reference_backward, reference_dsinks, \
    rel_err
from conftest import _serve, attnd_error

# name: (q shape, k shape, Dv, options); v is k's shape with Dv last
CASES = {
    "mla-d192-dv128-causal": ((2, 24, 192), (2, 40, 192), 128, {"causal": True}),
    "d32-dv64": ((3, 10, 32), (3, 10, 32), 64, {}),
    "2d-cross": ((7, 16), (9, 16), 4, {}),
    "4d-gqa-causal": ((2, 4, 10, 24), (2, 2, 13, 24), 8, {"causal": True}),
    "4d-mqa-window": ((1, 4, 20, 16), (1, 1, 20, 16), 40, {"window": (3, 2)}),
    "4d-scale": ((1, 2, 9, 8), (1, 2, 33, 8), 24, {"scale": 0.3}),
    # Nq > Nkv, causal: rows 0..3 see no key (o = 0 over the Dv columns)
    "causal-rows-see-nothing": ((2, 7, 12), (2, 3, 12), 20, {"causal": True}),
}

# The dtype sent and the normalized error allowed against float64
DTYPES = {"F32": TOL[np.float32], "F16": TOL[np.float16], "BF16": TOL_BF16}


def _seed(*parts):
    return zlib.crc32(repr(parts).encode())


def _heads(shape):
    return shape[-3] if len(shape) >= 3 else 1


def _round(x, dtype):
    """x as sent in dtype (BF16 as raw bits) and its float64 values."""
    if dtype == "BF16":
        bits = attnd.float32_to_bf16(x)
        return bits, attnd.bf16_to_float32(bits).astype(np.float64)
    a = x.astype(np.float16 if dtype == "F16" else np.float32)
    return a, a.astype(np.float64)


def _wide(x):
    x = np.asarray(x)
    if x.dtype == np.uint16 or (BF16 is not None and x.dtype == BF16):
        return attnd.bf16_to_float32(x).astype(np.float64)
    return x.astype(np.float64)


def _problem(case, dtype, seed, sinks=False):
    """(sent, wide, sinks, opts): q, k, v, dO as sent and as float64; sinks [Hq] F32 or
    None."""
    qs, ks, dv, opts = CASES[case]
    vs, os_ = ks[:-1] + (dv,), qs[:-1] + (dv,)
    rng = np.random.default_rng(seed)
    pairs = [_round(rng.standard_normal(s).astype(np.float32), dtype)
             for s in (qs, ks, vs, os_)]
    s = rng.uniform(-2.0, 3.0, _heads(qs)).astype(np.float32) if sinks else None
    return [p[0] for p in pairs], [p[1] for p in pairs], s, dict(opts)


def _check_stats(got, ref, tol=2e-5):
    for name, x, r in zip(("m", "l", "lse"), got, ref):
        assert x.dtype == np.float32 and x.shape == r.shape, name
        fin = np.isfinite(r)
        assert np.array_equal(np.isfinite(x), fin), name
        worst = np.max(np.abs(x[fin] - r[fin]) / np.maximum(1.0, np.abs(r[fin])), initial=0)
        assert worst <= tol, (name, worst)


# ---------------------------------------------------------------------------------------
# the oracle itself

def test_reference_matches_the_formula():
    """attn_ref with Dv against softmax(Q·Kᵀ/sqrt(D))·V written out here."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal(s) for s in ((3, 5, 12), (3, 7, 12), (3, 7, 5)))
    s = np.einsum("hqd,hkd->hqk", q, k) / math.sqrt(12)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    o, _, _, lse = reference(q, k, v)
    assert o.shape == (3, 5, 5)
    np.testing.assert_allclose(o, np.einsum("hqk,hkd->hqd", p, v), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, np.log(np.exp(s).sum(axis=-1)), rtol=1e-12)


def test_reference_backward_matches_finite_differences():
    """dq, dk (D columns), dv (Dv) and dsinks of the oracle against central differences."""
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal(s) for s in ((1, 4, 6, 6), (1, 2, 8, 6), (1, 2, 8, 3)))
    do, sinks = rng.standard_normal((1, 4, 6, 3)), rng.uniform(-2, 2, 4)
    opts = {"causal": True, "window": (3, -1)}
    grads = reference_backward(q, k, v, do, sinks=sinks, **opts)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape, (4,)]
    args, eps = [q, k, v, sinks], 1e-6

    def loss(a):
        return (reference(*a[:3], sinks=a[3], **opts)[0] * do).sum()

    for which, g in enumerate(grads):
        for idx in list(np.ndindex(*g.shape))[::5]:
            plus, minus = [a.copy() for a in args], [a.copy() for a in args]
            plus[which][idx] += eps
            minus[which][idx] -= eps
            fd = (loss(plus) - loss(minus)) / (2 * eps)
            assert abs(fd - g[idx]) <= 1e-6 * max(1.0, abs(g[idx])), (which, idx)


# ---------------------------------------------------------------------------------------
# forward

@pytest.mark.parametrize("sinks", [False, True], ids=["plain", "sinks"])
@pytest.mark.parametrize("wire", ["binary", "json"])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_forward(client, case, dtype, wire, sinks):
    sent, wide, s, opts = _problem(case, dtype, _seed(case, dtype, wire, sinks), sinks)
    q, k, v, _ = sent
    got = client.attention(q, k, v, sinks=s, stats=True, bf16=dtype == "BF16",
                           json=(wire == "json"), **opts)
    ref = reference(*wide[:3], sinks=s, **opts)
    assert got[0].shape == ref[0].shape == q.shape[:-1] + v.shape[-1:]
    assert rel_err(_wide(got[0]), ref[0]) <= DTYPES[dtype], rel_err(_wide(got[0]), ref[0])
    _check_stats(got[1:], ref[1:])


def test_default_scale_is_d_not_dv(client):
    """No scale: 1/sqrt(D) of q and k, whatever v's width; 1/sqrt(Dv) would differ."""
    sent, wide, _, _ = _problem("d32-dv64", "F32", 3)
    q, k, v, _ = sent
    o = client.attention(q, k, v)
    assert rel_err(o, reference(*wide[:3], scale=1 / math.sqrt(32))[0]) <= TOL[np.float32]
    assert rel_err(o, reference(*wide[:3], scale=1 / math.sqrt(64))[0]) > 1e-2


def test_backends_agree(client):
    """cpu, the float64 reference backend and auto; a torch-free nested-list input too."""
    sent, wide, _, opts = _problem("4d-gqa-causal", "F32", 4)
    q, k, v, _ = sent
    cpu = client.attention(q, k, v, backend="cpu", **opts)
    ref = client.attention(q, k, v.tolist(), backend="reference", **opts)
    assert cpu.shape == ref.shape == (2, 4, 10, 8)
    assert rel_err(cpu, ref.astype(np.float64)) <= TOL[np.float32]
    np.testing.assert_array_equal(client.attention(q, k, v, **opts), cpu)


# ---------------------------------------------------------------------------------------
# backward

def _check_grads(got, ref, tol):
    for name, x, r in zip(("dq", "dk", "dv", "dsinks"), got, ref):
        assert x.shape == r.shape, (name, x.shape, r.shape)
        assert np.all(np.isfinite(_wide(x))), name
        assert rel_err(_wide(x), r) <= tol, (name, rel_err(_wide(x), r))


@pytest.mark.parametrize("sinks", [False, True], ids=["plain", "sinks"])
@pytest.mark.parametrize("wire", ["binary", "json"])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_backward(client, case, dtype, wire, sinks):
    sent, wide, s, opts = _problem(case, dtype, _seed("bwd", case, dtype, wire, sinks), sinks)
    q, k, v, do = sent
    bf16, json = dtype == "BF16", wire == "json"
    o, _, _, lse = client.attention(q, k, v, sinks=s, stats=True, bf16=bf16, **opts)
    got = client.attention_backward(q, k, v, o, do, lse, sinks=s, bf16=bf16, json=json,
                                    **opts)
    assert len(got) == (4 if sinks else 3)
    assert got[2].shape == v.shape and got[1].shape == k.shape and got[0].shape == q.shape
    ref = reference_backward(*wide, sinks=s, **opts)
    if sinks:   # dsinks from O as sent (rounded to its dtype), as the contract defines it
        lse64 = reference(*wide[:3], sinks=s, **opts)[3]
        ref = ref[:3] + (reference_dsinks(_wide(o), wide[3], lse64, s),)
        assert got[3].dtype == np.float32
    _check_grads(got, ref, DTYPES[dtype])


@pytest.mark.parametrize("wire", ["binary", "json"])
@pytest.mark.parametrize("case", ["mla-d192-dv128-causal", "4d-mqa-window"])
def test_backward_without_lse(client, case, wire):
    """The server recomputes the lse from q and k."""
    sent, wide, _, opts = _problem(case, "F32", _seed("nolse", case, wire))
    q, k, v, do = sent
    o = client.attention(q, k, v, **opts)
    got = client.attention_backward(q, k, v, o, do, json=(wire == "json"), **opts)
    _check_grads(got, reference_backward(*wide, **opts), TOL[np.float32])


# ---------------------------------------------------------------------------------------
# K/V sharded across three servers: O merged over its Dv columns

@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    gens = [_serve(["--threads", "1"], tmp_path_factory) for _ in range(3)]
    yield [next(g) for g in gens]
    for g in gens:
        next(g, None)


@pytest.mark.parametrize("sinks", [False, True], ids=["plain", "sinks"])
@pytest.mark.parametrize("case", ["mla-d192-dv128-causal", "4d-gqa-causal", "d32-dv64"])
def test_sharded(shards, case, sinks):
    sent, wide, s, opts = _problem(case, "F32", _seed("sharded", case, sinks), sinks)
    q, k, v, _ = sent
    o, lse = attnd.sharded_attention([x.client() for x in shards], q, k, v, sinks=s,
                                     return_lse=True, **opts)
    ro, _, _, rlse = reference(*wide[:3], sinks=s, **opts)
    assert o.dtype == np.float32 and o.shape == ro.shape
    assert rel_err(o, ro) <= TOL[np.float32], rel_err(o, ro)
    np.testing.assert_allclose(lse, rlse, rtol=2e-5, atol=2e-5)


# ---------------------------------------------------------------------------------------
# refusals: the server's code and message

@pytest.mark.parametrize("wire", ["binary", "json"])
def test_refusals(client, wire):
    sent, _, _, _ = _problem("d32-dv64", "F32", 5)
    q, k, v, do = sent
    json = wire == "json"
    e = attnd_error(client.attention, q, k, v[:, :9], json=json)   # Nkv of v is not k's
    assert e.status == 422 and e.code == "shape_mismatch" and "v" in e.message, e
    o = client.attention(q, k, v)
    # dO and O must have v's width, not q's
    for bad_o, bad_do in ((o, do[..., :32]), (o[..., :32], do)):
        e = attnd_error(client.attention_backward, q, k, v, bad_o, bad_do, json=json)
        assert e.status == 422 and e.code == "shape_mismatch", e
    # past the engine's limits: Dv 512, D 576 (a v as wide as q counts as Dv)
    wide_v = np.zeros(k.shape[:-1] + (513,), np.float32)
    e = attnd_error(client.attention, q, k, wide_v, json=json)
    assert e.status == 422 and "head_dim_v" in e.message and "512" in e.message, e
    wide_qk = np.zeros(q.shape[:-1] + (577,), np.float32)
    e = attnd_error(client.attention, wide_qk, wide_qk, v, json=json)
    assert e.status == 422 and "head_dim" in e.message and "576" in e.message, e
    q520, k520 = (np.zeros(x.shape[:-1] + (520,), np.float32) for x in (q, k))
    e = attnd_error(client.attention, q520, k520, k520, json=json)
    assert e.status == 422 and "head_dim_v" in e.message and "520" in e.message, e


@pytest.mark.parametrize("wire", ["binary", "json"])
def test_session_call_with_another_v_width(client, wire):
    """A v not head_dim_v wide is a shape the session does not have: 422, nothing
    appended."""
    sent, _, _, _ = _problem("d32-dv64", "F32", 6)
    q, k, v, _ = sent
    with client.session("dv-width-" + wire, heads_kv=3, head_dim=32, max_tokens=16) as s:
        e = attnd_error(s.attend, q, k, v, json=(wire == "json"))
        assert (e.status, e.code) == (422, "shape_mismatch"), e
        assert '"v" ends in 64' in e.message and "32 wide" in e.message, e
        assert s.info()["lengths"] == [0]


def test_session_batch_with_another_v_width(client):
    """The same in _batch: the whole call refused, nothing appended to any session."""
    rng = np.random.default_rng(9)
    made = [client.session("dv-batch-%d" % i, heads_kv=1, head_dim=8, max_tokens=16)
            for i in range(2)]
    q = rng.standard_normal((2, 3, 8)).astype(np.float32)
    k = rng.standard_normal((1, 5, 8)).astype(np.float32)
    v = rng.standard_normal((1, 5, 12)).astype(np.float32)
    try:
        e = attnd_error(client.session_batch, made, q, k, v, [0, 2, 3], [0, 4, 5])
        assert e.status == 422 and "8 wide" in e.message, e
        assert [s.info()["lengths"] for s in made] == [[0], [0]]
    finally:
        for s in made:
            s.delete(missing_ok=True)


# ---------------------------------------------------------------------------------------
# attnd.torch against torch's SDPA, which takes v with its own last dimension

def _torch():
    try:
        import torch
    except ImportError:
        print("skipped: torch is not installed in this interpreter")
        pytest.skip("torch is not installed in this interpreter (build/peers-venv has it)")
    import attnd.torch   # noqa: F401
    return torch


def _sdpa(torch, q, k, v, causal=False, scale=None):
    """torch's SDPA with attnd's bottom-right causal mask (is_causal is top-left) and
    GQA by enable_gqa."""
    nq, nkv = q.shape[-2], k.shape[-2]
    mask = torch.ones(nq, nkv, dtype=torch.bool).tril(nkv - nq) if causal else None
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[-3] != k.shape[-3])


TORCH_CASES = ("mla-d192-dv128-causal", "d32-dv64", "4d-gqa-causal", "4d-scale")


@pytest.mark.parametrize("case", TORCH_CASES)
def test_torch_against_sdpa(client, case):
    """o and the gradients of q, k, v against SDPA's autograd in float64 on the same
    values; each gradient has its own input's shape (dv: Dv columns)."""
    torch = _torch()
    sent, _, _, opts = _problem(case, "F32", _seed("torch", case))
    q, k, v, w = (torch.from_numpy(x) for x in sent)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o = attnd.torch.attention(*leaves, client=client, **opts)
    assert o.shape == w.shape and o.dtype == torch.float32
    (o * w).sum().backward()
    wide = [x.detach().double().requires_grad_() for x in leaves]
    o64 = _sdpa(torch, *wide, **opts)
    (o64 * w.double()).sum().backward()
    assert rel_err(o.detach().double().numpy(), o64.detach().numpy()) <= 1e-5
    for name, x, ref in zip(("dq", "dk", "dv"), leaves, wide):
        assert x.grad.dtype == torch.float32 and x.grad.shape == x.shape, name
        err = rel_err(x.grad.double().numpy(), ref.grad.numpy())
        assert err <= 1e-5, (name, err)


def test_torch_bf16(client):
    """A bfloat16 MLA-shaped layer: O and the gradients in bfloat16, close to float64's."""
    torch = _torch()
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(*s, generator=g).bfloat16().requires_grad_()
               for s in ((1, 4, 16, 192), (1, 4, 16, 192), (1, 4, 16, 128)))
    o = attnd.torch.attention(q, k, v, causal=True, client=client)
    assert o.dtype == torch.bfloat16 and o.shape == (1, 4, 16, 128)
    o.float().square().sum().backward()
    wide = [x.detach().double().requires_grad_() for x in (q, k, v)]
    _sdpa(torch, *wide, causal=True).square().sum().backward()
    for name, x, ref in zip(("dq", "dk", "dv"), (q, k, v), wide):
        assert x.grad.dtype == torch.bfloat16 and x.grad.shape == x.shape, name
        err = rel_err(x.grad.double().numpy(), ref.grad.numpy())
        assert err <= 2e-2, (name, err)


def test_torch_gradcheck(client):
    """torch.autograd.gradcheck: the server's gradients (F32 on the wire) against torch's
    own central differences of the server's forward, D 4 and Dv 6."""
    torch = _torch()
    g = torch.Generator().manual_seed(8)
    inputs = [torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_()
              for s in ((2, 3, 4), (1, 3, 4), (1, 3, 6))]

    def fn(q, k, v):
        return attnd.torch.attention(q, k, v, causal=True, client=client)

    assert torch.autograd.gradcheck(fn, inputs, eps=1e-2, atol=2e-3, rtol=1e-2)
