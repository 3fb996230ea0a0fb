"""torch tensors in and out of the client, and attnd.torch.attention's gradients against
torch's own scaled_dot_product_attention. Skipped where torch is not installed (make test's
venv); run them with a venv that has it, e.g.
ATTND_BIN=build/attnd build/peers-venv/bin/python -m pytest -q tests/python/test_torch.py
"""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed in this interpreter")

import attnd                # noqa: E402
import attnd.torch          # noqa: E402

from attn_ref import TOL, TOL_BF16, reference, reference_backward, rel_err   # noqa: E402

BACKEND = None   # the default (auto): the cpu backend here, cuda with a device

DTYPES = {torch.float32: (np.float32, TOL[np.float32]), torch.float16: (np.float16, TOL[np.float16]),
          torch.bfloat16: (None, TOL_BF16)}


def _np(t):
    return t.detach().double().cpu().numpy()


def _err(x, ref):
    return rel_err(_np(x), ref if isinstance(ref, np.ndarray) else _np(ref))


def _visible(nq, nkv, causal, window_left, window_right):
    """docs/design.md's mask, aligned bottom-right, as SDPA's boolean attn_mask (True: attend);
    SDPA's own is_causal is aligned top-left, which differs when Nq != Nkv."""
    i = torch.arange(nq)[:, None]
    j = torch.arange(nkv)[None, :]
    off = nkv - nq
    wr = 0 if causal else window_right
    mask = torch.ones(nq, nkv, dtype=torch.bool)
    if window_left >= 0:
        mask &= j >= i + off - window_left
    if wr >= 0:
        mask &= j <= i + off + wr
    return mask


def _sdpa(q, k, v, causal=False, scale=None, window_left=-1, window_right=-1):
    mask = _visible(q.shape[-2], k.shape[-2], causal, window_left, window_right)
    assert mask.any(dim=-1).all(), "SDPA gives NaN for a row with no visible key"
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[-3] != k.shape[-3])


def _leaves(*shapes, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).to(dtype).requires_grad_() for s in shapes]


# (q shape, kv shape, options); no row without a visible key (SDPA would give NaN)
CASES = {
    "causal": ((1, 4, 12, 16), (1, 4, 12, 16), {"causal": True}),
    "causal-cross": ((2, 2, 6, 8), (2, 2, 10, 8), {"causal": True}),
    "window": ((1, 3, 16, 8), (1, 3, 16, 8), {"window_left": 3, "window_right": 2}),
    "window-causal": ((1, 2, 9, 32), (1, 2, 14, 32), {"causal": True, "window_left": 4}),
    "gqa-causal": ((2, 8, 10, 16), (2, 2, 10, 16), {"causal": True}),
    "mqa-window-scale": ((1, 4, 11, 8), (1, 1, 13, 8),
                         {"window_left": 5, "window_right": 0, "scale": 0.4}),
    "gqa-3d": ((4, 7, 24), (2, 9, 24), {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_gradients_match_sdpa(client, case):
    qs, kvs, opts = CASES[case]
    q, k, v = _leaves(qs, kvs, kvs, seed=len(case))
    w = torch.randn(qs, generator=torch.Generator().manual_seed(1))
    o = attnd.torch.attention(q, k, v, client=client, backend=BACKEND, **opts)
    (o * w).sum().backward()
    # the oracle: SDPA in float64 on the same values (torch's autograd of its attention)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    o64 = _sdpa(q64, k64, v64, **opts)
    (o64 * w.double()).sum().backward()
    assert o.dtype == torch.float32 and o.shape == q.shape
    assert _err(o, o64) <= 1e-5
    for name, x, ref in (("dq", q, q64), ("dk", k, k64), ("dv", v, v64)):
        assert x.grad.dtype == torch.float32 and x.grad.shape == x.shape, name
        assert _err(x.grad, ref.grad) <= 1e-5, (name, _err(x.grad, ref.grad))


def test_float32_sdpa_agrees_too(client):
    """The same comparison against SDPA run in float32, as a user would run it."""
    q, k, v = _leaves((2, 4, 20, 16), (2, 2, 20, 16), (2, 2, 20, 16), seed=3)
    attnd.torch.attention(q, k, v, causal=True, client=client, backend=BACKEND).sum().backward()
    q2, k2, v2 = (x.detach().clone().requires_grad_() for x in (q, k, v))
    _sdpa(q2, k2, v2, causal=True).sum().backward()
    for x, ref in ((q, q2), (k, k2), (v, v2)):
        assert _err(x.grad, ref.grad) <= 1e-5


def test_non_contiguous_inputs(client):
    """[B, N, H, D] activations transposed to [B, H, N, D] views, as a model makes them."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 10, 6, 16, generator=g, requires_grad=True)    # [B, N, 3*2 heads, D]
    q, k, v = x[:, :, 0:2].transpose(1, 2), x[:, :, 2:4].transpose(1, 2), \
        x[:, :, 4:6].transpose(1, 2)
    assert not q.is_contiguous()
    o = attnd.torch.attention(q, k, v, causal=True, client=client, backend=BACKEND)
    o.transpose(1, 2).square().sum().backward()     # dO arrives non-contiguous as well
    x2 = x.detach().double().requires_grad_()
    q2, k2, v2 = x2[:, :, 0:2].transpose(1, 2), x2[:, :, 2:4].transpose(1, 2), \
        x2[:, :, 4:6].transpose(1, 2)
    _sdpa(q2, k2, v2, causal=True).transpose(1, 2).square().sum().backward()
    assert _err(x.grad, x2.grad) <= 1e-5


def test_fully_masked_rows(client):
    """Rows that see no key: O = 0, no gradient, no NaN (SDPA would give NaN here)."""
    q, k, v = _leaves((1, 2, 6, 8), (1, 2, 3, 8), (1, 2, 3, 8), seed=5)
    o = attnd.torch.attention(q, k, v, causal=True, client=client, backend=BACKEND)
    w = torch.randn(o.shape, generator=torch.Generator().manual_seed(6))
    (o * w).sum().backward()
    assert torch.all(o[:, :, :3] == 0) and torch.all(q.grad[:, :, :3] == 0)
    ref = reference_backward(*(_np(x) for x in (q, k, v)), _np(w), causal=True)
    for x, r in zip((q, k, v), ref):
        assert torch.isfinite(x.grad).all()
        assert _err(x.grad, r) <= 1e-5


def test_trains_a_projection(client):
    """A step of a model with attnd as its attention: the weight gradients of the q, k, v
    projections through attnd equal those through SDPA."""
    torch.manual_seed(7)
    proj = torch.nn.Linear(16, 3 * 16)
    x = torch.randn(2, 12, 16)

    def loss(attend):
        q, k, v = proj(x).view(2, 12, 3, 2, 8).permute(2, 0, 3, 1, 4)   # [B, H=2, N, D=8]
        return attend(q, k, v).square().mean()

    proj.zero_grad()
    loss(lambda q, k, v: attnd.torch.attention(q, k, v, causal=True, client=client.url,
                                               backend=BACKEND)).backward()
    got = [p.grad.clone() for p in proj.parameters()]
    proj.zero_grad()
    loss(lambda q, k, v: _sdpa(q, k, v, causal=True)).backward()
    for g, p in zip(got, proj.parameters()):
        assert _err(g, p.grad) <= 1e-5


def test_float64_comes_back_float64(client):
    q, k, v = _leaves((3, 5, 8), (3, 5, 8), (3, 5, 8), dtype=torch.float64, seed=8)
    o = attnd.torch.attention(q, k, v, client=client, backend=BACKEND)
    o.sum().backward()
    assert o.dtype == torch.float64 and q.grad.dtype == torch.float64
    q2, k2, v2 = (x.detach().clone().requires_grad_() for x in (q, k, v))
    _sdpa(q2, k2, v2).sum().backward()
    for x, ref in ((q, q2), (k, k2), (v, v2)):
        assert _err(x.grad, ref.grad) <= 1e-5     # computed in float32 by the server


@pytest.mark.parametrize("wire", ["binary", "json"])
@pytest.mark.parametrize("dtype", sorted(DTYPES, key=str), ids=str)
def test_client_dtype_round_trip(client, dtype, wire):
    """Client.attention and attention_backward given torch tensors return torch tensors of
    the dtype and device sent; statistics are float32 tensors."""
    q, k, v, do = (x.detach() for x in _leaves((1, 4, 9, 16), (1, 2, 9, 16), (1, 2, 9, 16),
                                               (1, 4, 9, 16), dtype=dtype, seed=9))
    as_json = wire == "json"
    o, m, l, lse = client.attention(q, k, v, causal=True, stats=True, json=as_json)
    assert isinstance(o, torch.Tensor) and o.dtype == dtype and o.shape == q.shape
    assert o.device == q.device
    for s in (m, l, lse):
        assert isinstance(s, torch.Tensor) and s.dtype == torch.float32 and s.shape == (1, 4, 9)
    ref_o, _, _, ref_lse = reference(*(_np(x) for x in (q, k, v)), causal=True)
    tol = DTYPES[dtype][1]
    assert _err(o, ref_o) <= tol
    assert _err(lse, ref_lse) <= 1e-5
    grads = client.attention_backward(q, k, v, o, do, lse, causal=True, backend=BACKEND,
                                      json=as_json)
    ref = reference_backward(*(_np(x) for x in (q, k, v, do)), causal=True)
    for x, like, r in zip(grads, (q, k, v), ref):
        assert isinstance(x, torch.Tensor) and x.dtype == dtype and x.shape == like.shape
        assert _err(x, r) <= tol
    # the autograd function keeps the dtype too
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = attnd.torch.attention(*leaves, causal=True, client=client, backend=BACKEND)
    assert out.dtype == dtype
    out.backward(do)
    for x, r in zip(leaves, ref):
        assert x.grad.dtype == dtype and _err(x.grad, r) <= tol


def test_mixed_inputs_follow_torch(client):
    """One torch input is enough for torch results (on its device)."""
    q = torch.randn(2, 5, 8)
    k = np.random.default_rng(10).standard_normal((2, 5, 8)).astype(np.float32)
    o = client.attention(q, k, k)
    assert isinstance(o, torch.Tensor) and o.dtype == torch.float32
    assert _err(o, reference(_np(q), k, k)[0]) <= 1e-5


def test_numpy_inputs_stay_numpy(client):
    """torch being imported changes nothing for numpy callers."""
    x = np.random.default_rng(11).standard_normal((4, 8)).astype(np.float32)
    o = client.attention(x, x, x)
    assert isinstance(o, np.ndarray)
    dq, dk, dv = client.attention_backward(x, x, x, o, x, backend=BACKEND)
    assert all(isinstance(t, np.ndarray) for t in (dq, dk, dv))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device for torch here")
def test_cuda_tensors_come_back_on_their_device(client):
    q, k, v = (t.cuda() for t in _leaves((1, 2, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16), seed=12))
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    o = attnd.torch.attention(q, k, v, causal=True, client=client, backend=BACKEND)
    assert o.device == q.device
    o.sum().backward()
    assert q.grad.device == q.device and k.grad.device == k.device


def test_scale_default_is_inverse_sqrt_d(client):
    q, k, v = _leaves((2, 6, 9), (2, 6, 9), (2, 6, 9), seed=13)
    a = attnd.torch.attention(q, k, v, client=client, backend=BACKEND)
    b = attnd.torch.attention(q, k, v, scale=1 / math.sqrt(9), client=client, backend=BACKEND)
    assert torch.equal(a, b)


def test_backward_sends_the_forward_lse(server):
    """The saved lse travels to /attention/backward, the lse of the forward call."""
    sent = []

    class Recording(attnd.Client):
        def attention_backward(self, *a, **kw):
            sent.append((a, kw))
            return super().attention_backward(*a, **kw)

    client = Recording(server.url)
    q, k, v = _leaves((1, 2, 5, 8), (1, 2, 7, 8), (1, 2, 7, 8), seed=14)
    o = attnd.torch.attention(q, k, v, window_left=2, client=client, backend=BACKEND)
    o.sum().backward()
    (args, kw), = sent
    _, _, _, lse = client.attention(q, k, v, window=(2, -1), stats=True, backend=BACKEND)
    assert len(args) == 6 and torch.equal(args[5], lse)
    assert (kw["window_left"], kw["window_right"], kw["causal"]) == (2, -1, False)
