"""attnd.Session and Client.session_batch against a real attnd: a prefill and then a decode
token by token, each reply checked against float64 attention (tests/python/attn_ref.py) over
exactly the keys the session should hold by then; the positions the client tracks, conflicts,
replays, truncate and re-append, the context manager's delete, a batch of sessions, torch
tensors in and out (skipped where torch is not installed), and F16 and BF16 heads of 192 on
pages of 32 tokens (attnd --session-page-bytes 16K)."""

import itertools

import numpy as np
import pytest

import attnd
from attn_ref import TOL, TOL_BF16, reference, rel_err
from conftest import _serve, attnd_error

HQ, HKV, D = 4, 2, 16
_ids = itertools.count()


def _sid(tag):
    return "pytest-%s-%d" % (tag, next(_ids))


def _rand(rng, h, n, dtype=np.float32):
    return rng.standard_normal((h, n, D)).astype(dtype)


class Mirror:
    """What the session should hold: every key and value appended so far, per layer."""

    def __init__(self, layers=1):
        self.k = [np.zeros((HKV, 0, D), np.float32) for _ in range(layers)]
        self.v = [np.zeros((HKV, 0, D), np.float32) for _ in range(layers)]

    def append(self, k, v, layer=0):
        self.k[layer] = np.concatenate([self.k[layer], k], axis=1)
        self.v[layer] = np.concatenate([self.v[layer], v], axis=1)

    def truncate(self, n):
        self.k = [x[:, :n] for x in self.k]
        self.v = [x[:, :n] for x in self.v]

    def expect(self, q, layer=0, **opts):
        """The float64 reference over the layer's keys, masked bottom-right (causal unless
        told otherwise, as the session routes default)."""
        opts.setdefault("causal", True)
        return reference(q, self.k[layer], self.v[layer], **opts)


def _check(o, ref, tol=TOL[np.float32]):
    err = rel_err(o, ref)
    assert err <= tol, "normalized error %.3g > %.3g" % (err, tol)


def test_prefill_then_decode(client):
    rng = np.random.default_rng(1)
    mirror = Mirror()
    with client.session(_sid("decode"), heads_kv=HKV, head_dim=D, max_tokens=64) as s:
        assert s.created and s.lengths == [0]
        q, k, v = _rand(rng, HQ, 10), _rand(rng, HKV, 10), _rand(rng, HKV, 10)
        o = s.attend(q, k, v)                     # pos 0, tracked
        mirror.append(k, v)
        _check(o, mirror.expect(q)[0])
        assert o.shape == q.shape and o.dtype == np.float32
        assert s.lengths == [10]
        for step in range(6):
            q, k, v = _rand(rng, HQ, 1), _rand(rng, HKV, 1), _rand(rng, HKV, 1)
            o, m, l, lse = s.attend(q, k, v, stats=True)
            mirror.append(k, v)
            ref = mirror.expect(q)
            _check(o, ref[0])
            np.testing.assert_allclose(lse, ref[3], rtol=1e-5, atol=1e-5)
            assert lse.shape == (HQ, 1)
            assert s.lengths == [11 + step]
        assert s.info()["lengths"] == [16]


def test_layers_options_and_json(client):
    """Two layers are two caches; every /attention option goes through; JSON on the wire."""
    rng = np.random.default_rng(2)
    mirror = Mirror(layers=2)
    with client.session(_sid("layers"), heads_kv=HKV, head_dim=D, layers=2,
                        max_tokens=32) as s:
        for layer in (0, 1):
            k, v = _rand(rng, HKV, 7 + layer), _rand(rng, HKV, 7 + layer)
            s.attend(_rand(rng, HQ, 3), k, v, layer=layer)
            mirror.append(k, v, layer)
        assert s.lengths == [7, 8]
        assert s.info()["lengths"] == [7, 8]
        q = _rand(rng, HQ, 2)
        for opts in ({"causal": False}, {"scale": 0.3}, {"window": (2, 0)}):
            o = s.attend(q, layer=1, **opts)       # no k, v: the layer's whole length
            _check(o, mirror.expect(q, layer=1, **opts)[0])
        o = s.attend(q, layer=0, softcap=2.0, causal=False)
        _check(o, mirror.expect(q, layer=0, causal=False, softcap=2.0)[0])
        slopes = np.linspace(0.1, 0.4, HQ).astype(np.float32)
        o = s.attend(q, layer=0, alibi_slopes=slopes)
        _check(o, mirror.expect(q, layer=0, alibi_slopes=slopes)[0])
        k, v = _rand(rng, HKV, 1), _rand(rng, HKV, 1)
        o = s.attend(q[:, :1], k, v, layer=0, json=True)
        mirror.append(k, v, 0)
        _check(o, mirror.expect(q[:, :1], layer=0)[0])
        assert s.lengths == [8, 8]


def test_conflict_replay_truncate(client):
    rng = np.random.default_rng(3)
    mirror = Mirror()
    with client.session(_sid("conflict"), heads_kv=HKV, head_dim=D, max_tokens=32) as s:
        k, v = _rand(rng, HKV, 12), _rand(rng, HKV, 12)
        s.attend(_rand(rng, HQ, 12), k, v)
        mirror.append(k, v)
        q1, k1, v1 = _rand(rng, HQ, 1), _rand(rng, HKV, 1), _rand(rng, HKV, 1)
        first = s.attend(q1, k1, v1)
        mirror.append(k1, v1)
        # the same k, v bits at their old position: a replay, the first reply again
        again = s.attend(q1, k1, v1, pos=12)
        np.testing.assert_array_equal(again, first)
        assert s.lengths == [13]
        # other tokens at an old position, or a position past the end: 409
        for pos in (12, 5, 14):
            e = attnd_error(s.attend, q1, _rand(rng, HKV, 1), _rand(rng, HKV, 1), pos=pos)
            assert (e.status, e.code) == (409, "session_conflict")
        assert s.info()["lengths"] == [13]
        # a rejected draft: cut to 8, then append two other tokens there
        s.truncate(8)
        mirror.truncate(8)
        assert s.lengths == [8] and s.info()["lengths"] == [8]
        q, k, v = _rand(rng, HQ, 2), _rand(rng, HKV, 2), _rand(rng, HKV, 2)
        o = s.attend(q, k, v)
        mirror.append(k, v)
        _check(o, mirror.expect(q)[0])
        assert s.lengths == [10]


def test_create_get_delete(server, client):
    sid = _sid("life")
    with client.session(sid, heads_kv=HKV, head_dim=D, max_tokens=16, ttl_s=30) as s:
        info = s.info()
        for key, want in (("id", sid), ("heads_kv", HKV), ("head_dim", D), ("dtype", "F32"),
                          ("layers", 1), ("max_tokens", 16), ("lengths", [0])):
            assert info[key] == want, (key, info)
        assert info["reserved_bytes"] >= 2 * HKV * 16 * D * 4
        assert 0 < info["expires_in_s"] <= 30
        # a retried create finds it; other parameters are 409
        again = client.session(sid, heads_kv=HKV, head_dim=D, max_tokens=16, ttl_s=30)
        assert again.created is False
        e = attnd_error(client.session, sid, heads_kv=HKV, head_dim=D, max_tokens=17, ttl_s=30)
        assert (e.status, e.code) == (409, "session_exists")
        assert attnd.Session.attach(client, sid).max_tokens == 16
        listed = client.sessions()
        assert [x["lengths"] for x in listed["sessions"] if x["id"] == sid] == [[0]]
        assert listed["memory"]["reserved_bytes"] >= info["reserved_bytes"]
    # the with block deleted it
    e = attnd_error(attnd.Session.attach, client, sid)
    assert (e.status, e.code) == (404, "session_not_found")
    assert sid not in [x["id"] for x in client.sessions()["sessions"]]
    e = attnd_error(s.attend, np.zeros((HQ, 1, D), np.float32))
    assert (e.status, e.code) == (404, "session_not_found")
    e = attnd_error(s.delete)
    assert e.code == "session_not_found"
    s.delete(missing_ok=True)


def test_refusals(client):
    rng = np.random.default_rng(4)
    with client.session(_sid("full"), heads_kv=HKV, head_dim=D, max_tokens=4) as s:
        s.attend(_rand(rng, HQ, 3), _rand(rng, HKV, 3), _rand(rng, HKV, 3))
        e = attnd_error(s.attend, _rand(rng, HQ, 2), _rand(rng, HKV, 2), _rand(rng, HKV, 2))
        assert (e.status, e.code) == (422, "session_full")
        e = attnd_error(s.attend, _rand(rng, HQ, 1), _rand(rng, 1, 1), _rand(rng, 1, 1))
        assert e.status == 422                      # not the session's head count
        assert s.info()["lengths"] == [3]
        with pytest.raises(TypeError):
            s.attend(_rand(rng, HQ, 1), pos=3)      # pos without k, v
        with pytest.raises(ValueError):
            s.attend(_rand(rng, HQ, 1), layer=1)    # a layer it does not have
    with pytest.raises(ValueError):
        client.session("_server-owned", heads_kv=HKV, head_dim=D, max_tokens=4)


def test_dtype_conversion_f16(client):
    """Inputs are sent in the session's dtype: float32 arrays go as F16 to an F16 session."""
    rng = np.random.default_rng(5)
    with client.session(_sid("f16"), heads_kv=HKV, head_dim=D, dtype="F16",
                        max_tokens=16) as s:
        q, k, v = _rand(rng, HQ, 5), _rand(rng, HKV, 5), _rand(rng, HKV, 5)
        o = s.attend(q, k, v)
        assert o.dtype == np.float16
        ref = reference(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16),
                        causal=True)[0]
        _check(o, ref, TOL[np.float16])


def test_batch(client):
    rng = np.random.default_rng(6)
    prefill = [5, 9, 1]
    sessions, mirrors = [], []
    try:
        for n in prefill:
            s = client.session(_sid("batch"), heads_kv=HKV, head_dim=D, max_tokens=32)
            sessions.append(s)
            m = Mirror()
            k, v = _rand(rng, HKV, n), _rand(rng, HKV, n)
            s.attend(_rand(rng, HQ, n), k, v)
            m.append(k, v)
            mirrors.append(m)
        # one decode step of all three, one token each, in one call
        for _ in range(2):
            q, k, v = _rand(rng, HQ, 3), _rand(rng, HKV, 3), _rand(rng, HKV, 3)
            cu = np.array([0, 1, 2, 3], np.int32)
            o, _, _, lse = client.session_batch(sessions, q, k, v, cu, cu, stats=True)
            for e, m in enumerate(mirrors):
                m.append(k[:, e:e + 1], v[:, e:e + 1])
                ref = m.expect(q[:, e:e + 1])
                _check(o[:, e:e + 1], ref[0])
                np.testing.assert_allclose(lse[:, e:e + 1], ref[3], rtol=1e-5, atol=1e-5)
        assert [s.lengths[0] for s in sessions] == [n + 2 for n in prefill]
        # all or nothing: the second entry's pos is stale, nothing is appended anywhere
        pos = [s.lengths[0] for s in sessions]
        pos[1] -= 1
        q, k, v = _rand(rng, HQ, 3), _rand(rng, HKV, 3), _rand(rng, HKV, 3)
        e = attnd_error(client.session_batch, [s.id for s in sessions], q, k, v, cu, cu, pos=pos)
        assert (e.status, e.code) == (409, "session_conflict")
        assert [s.info()["lengths"][0] for s in sessions] == [n + 2 for n in prefill]
    finally:
        for s in sessions:
            s.delete(missing_ok=True)


def test_torch_in_and_out(client):
    try:
        import torch
    except ImportError:
        print("skipped: torch is not installed")
        pytest.skip("torch is not installed")
    g = torch.Generator().manual_seed(7)
    mirror = Mirror()
    with client.session(_sid("torch"), heads_kv=HKV, head_dim=D, max_tokens=16) as s:
        for n in (6, 1, 1):
            # [1, H, N, D] as a model's attention holds it, non-contiguous from a transpose
            q = torch.randn(1, n, HQ, D, generator=g).transpose(1, 2)
            k = torch.randn(1, n, HKV, D, generator=g).transpose(1, 2)
            v = torch.randn(1, HKV, n, D, generator=g)
            o = s.attend(q, k, v)
            assert isinstance(o, torch.Tensor) and o.dtype == torch.float32
            assert tuple(o.shape) == (1, HQ, n, D)
            mirror.append(k[0].numpy(), v[0].numpy())
            _check(o[0].numpy(), mirror.expect(q[0].numpy())[0])
        assert s.lengths == [8]


@pytest.fixture(scope="module")
def small_pages(tmp_path_factory):
    """attnd --session-page-bytes 16K: a page holds 42 rows of head_dim 192 in F16 or BF16, so
    it takes 32 tokens, off the engine's 64-key tiles, and tiles cross pages."""
    yield from _serve(["--threads", "2", "--session-page-bytes", "16K"], tmp_path_factory)


@pytest.mark.parametrize("dtype", ["F16", "BF16"])
def test_wide_heads_on_small_pages(small_pages, dtype):
    """A prefill of several query blocks, then decode steps, on pages of 32 tokens, each reply
    against float64 over the session's keys. On an AMX CPU such a prefill read its packed key
    tiles past a page (BF16), and crashed attnd (F16: no packed tile after a page's end)."""
    rng = np.random.default_rng(12)
    hq, hkv, d, n = 8, 2, 192, 200
    if dtype == "F16":
        wire, back, tol = (lambda a: a.astype(np.float16)), (lambda o: o.astype(np.float32)), \
            TOL[np.float16]
    else:
        wire, back, tol = attnd.float32_to_bf16, attnd.bf16_to_float32, TOL_BF16

    def tokens(h, m):
        return wire(rng.standard_normal((h, m, d)).astype(np.float32))

    with small_pages.client().session(_sid("wide"), heads_kv=hkv, head_dim=d, dtype=dtype,
                                      max_tokens=n + 4) as s:
        q, k, v = tokens(hq, n), tokens(hkv, n), tokens(hkv, n)
        ref = reference(back(q), back(k), back(v), causal=True)[0]
        _check(back(s.attend(q, k, v)), ref, tol)
        for _ in range(3):
            q1, k1, v1 = tokens(hq, 1), tokens(hkv, 1), tokens(hkv, 1)
            k, v = np.concatenate([k, k1], axis=1), np.concatenate([v, v1], axis=1)
            ref = reference(back(q1), back(k), back(v), causal=True)[0]
            _check(back(s.attend(q1, k1, v1)), ref, tol)
