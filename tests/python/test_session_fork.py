"""Forked sessions through the Python client against a real attnd (``Session.fork``): a prompt
forked four ways as a beam search does, each fork then decoding its own tokens, every reply
equal to attn_ref's float64 formula over exactly that fork's history (the prompt, then its own
tokens); the forks share the prompt's full pages (``shared_bytes``, and a reservation of only
what each may add), and deleting the prompt's session leaves them intact.
"""

import itertools

import numpy as np
import pytest

from attn_ref import TOL, reference, rel_err
from conftest import attnd_error

_ids = itertools.count()
PAIR = 2 * 65536  # one page of K and one of V
PT = 256  # tokens a page holds: head_dim 64, F32


def _sid(tag):
    return "pytest-fork-%s-%d" % (tag, next(_ids))


def _check(o, q, k, v):
    err = rel_err(o, reference(q, k, v, causal=True)[0])
    assert err <= TOL[np.float32], "normalized error %.3g" % err


def test_beam_of_forks_decodes_each_own_history(client):
    rng = np.random.default_rng(11)
    n0, steps, beams = 2 * PT + 37, 6, 4

    def tokens(n):
        return (rng.standard_normal((4, n, 64)).astype(np.float32),
                rng.standard_normal((1, n, 64)).astype(np.float32),
                rng.standard_normal((1, n, 64)).astype(np.float32))

    q, k, v = tokens(n0)
    with client.session(_sid("p"), heads_kv=1, head_dim=64, max_tokens=4 * PT) as p:
        _check(p.attend(q, k, v), q, k, v)
        forks = [p.fork(_sid("b")) for _ in range(beams)]
        for f in forks:
            info = f.info()
            assert f.lengths == [n0] and info["shared_bytes"] == 3 * PAIR, info
            # 4 pairs less the 2 full ones it shares: only what it may add
            assert info["reserved_bytes"] == 2 * PAIR, info
        assert p.info()["shared_bytes"] == 3 * PAIR
        hist = [(q, k, v) for _ in forks]
        for _ in range(steps):
            for i, f in enumerate(forks):
                q1, k1, v1 = tokens(1)
                hq, hk, hv = (np.concatenate([a, b], axis=1) for a, b in zip(hist[i], (q1, k1, v1)))
                hist[i] = (hq, hk, hv)
                _check(f.attend(q1, k1, v1), q1, hk, hv)
        for f in forks:  # the partial page copied; the full ones still shared
            assert f.info()["shared_bytes"] == 2 * PAIR
    # the prompt's session gone, the payment for the full pages it shared passed to a fork:
    # they are still stored (and counted) once
    assert sum(f.info()["reserved_bytes"] for f in forks) == beams * 2 * PAIR + 2 * PAIR
    for i, f in enumerate(forks):  # each fork intact
        q1, k1, v1 = tokens(3)
        hk, hv = (np.concatenate([a, b], axis=1) for a, b in zip(hist[i][1:], (k1, v1)))
        _check(f.attend(q1, k1, v1), q1, hk, hv)
    for i, f in enumerate(forks):
        assert f.info()["shared_bytes"] == (0 if i == beams - 1 else 2 * PAIR)
        f.delete()


def test_fork_at_a_branch_point_and_refusals(client):
    rng = np.random.default_rng(12)
    q, k, v = (rng.standard_normal((h, 40, 64)).astype(np.float32) for h in (2, 1, 1))
    with client.session(_sid("s"), heads_kv=1, head_dim=64, max_tokens=PT, ttl_s=60) as s:
        s.attend(q, k, v)
        with s.fork(_sid("f"), length=25, ttl_s=30) as f:
            assert f.lengths == [25] and f.info()["ttl_s"] == 30
            q1, k1, v1 = (rng.standard_normal((h, 2, 64)).astype(np.float32) for h in (2, 1, 1))
            o = f.attend(q1, k1, v1)
            _check(o, q1, np.concatenate([k[:, :25], k1], axis=1),
                   np.concatenate([v[:, :25], v1], axis=1))
            e = attnd_error(s.fork, f.id)
            assert e.status == 409 and e.code == "session_exists", e
        e = attnd_error(s.fork, _sid("g"), 41)
        assert e.status == 422 and "layer 0" in str(e), e
        with pytest.raises(ValueError):
            s.fork("_bad")
