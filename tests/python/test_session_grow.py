"""Sessions of ``reserve="grow"`` through the Python client against a real attnd whose
session memory is small: the session's memory follows its tokens (``reserved_bytes``), its
replies equal attn_ref's float64 formula over exactly the keys it holds, an append the
memory cannot hold raises 507 ``session_memory_full`` with nothing appended, and the same
append goes through once another session is deleted.
"""

import itertools

import numpy as np
import pytest

from attn_ref import TOL, reference, rel_err
from conftest import _serve, attnd_error

_ids = itertools.count()
PAIR = 2 * 65536  # one page of K and one of V


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """attnd with 8 pages of session memory."""
    yield from _serve(["--threads", "2", "--session-memory", "512K"], tmp_path_factory)


def _sid(tag):
    return "pytest-grow-%s-%d" % (tag, next(_ids))


def _check(o, q, k, v):
    ref = reference(q, k, v, causal=True)[0]
    err = rel_err(o, ref)
    assert err <= TOL[np.float32], "normalized error %.3g" % err


def test_grow_session_takes_memory_as_tokens_arrive(small):
    client = small.client()
    rng = np.random.default_rng(3)
    pt = 256  # tokens a page holds: head_dim 64, F32
    n = 3 * pt + 1
    q = rng.standard_normal((2, n, 64)).astype(np.float32)
    k = rng.standard_normal((1, n, 64)).astype(np.float32)
    v = rng.standard_normal((1, n, 64)).astype(np.float32)
    with client.session(_sid("g"), heads_kv=1, head_dim=64, max_tokens=4096,
                        reserve="grow") as g:
        info = g.info()
        assert info["reserve"] == "grow" and info["reserved_bytes"] == 0, info
        o = g.attend(q[:, :pt + 1], k[:, :pt + 1], v[:, :pt + 1])
        _check(o, q[:, :pt + 1], k[:, :pt + 1], v[:, :pt + 1])
        assert g.info()["reserved_bytes"] == 2 * PAIR
        # two whole sessions take the other 4 pages: g cannot grow past its 2 pairs
        w = [client.session(_sid("w"), heads_kv=1, head_dim=64, max_tokens=pt)
             for _ in range(2)]
        assert w[0].info()["reserve"] == "whole"
        e = attnd_error(g.attend, q[:, pt + 1:n], k[:, pt + 1:n], v[:, pt + 1:n])
        assert e.status == 507 and e.code == "session_memory_full", e
        assert g.info()["lengths"] == [pt + 1]
        w[1].delete()
        o = g.attend(q[:, pt + 1:2 * pt + 1], k[:, pt + 1:2 * pt + 1], v[:, pt + 1:2 * pt + 1])
        _check(o, q[:, pt + 1:2 * pt + 1], k[:, :2 * pt + 1], v[:, :2 * pt + 1])
        assert g.info()["reserved_bytes"] == 3 * PAIR
        again = type(g).attach(client, g.id)
        assert again.reserve == "grow"
        w[0].delete()
        o = g.attend(q[:, 2 * pt + 1:], k[:, 2 * pt + 1:], v[:, 2 * pt + 1:])
        _check(o, q[:, 2 * pt + 1:], k, v)
        g.truncate(10)
        assert g.info()["reserved_bytes"] == PAIR


def test_reserve_is_checked_on_the_client(client):
    with pytest.raises(ValueError):
        client.session(_sid("bad"), heads_kv=1, head_dim=8, max_tokens=8, reserve="some")
