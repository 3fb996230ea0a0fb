"""A session moved through the Python client (``Session.export`` and
``Client.import_session``) against a real attnd: a session of two layers of different
lengths (Dv != D, and a latent one) exported, deleted and imported again; its next call
equals the one made before the move bit for bit and attn_ref's float64 formula, its export
after the import is byte-identical, and an import over an existing id is 409.
"""

import itertools

import numpy as np
import pytest

from attn_ref import TOL, reference, rel_err
from conftest import attnd_error

_ids = itertools.count()


@pytest.mark.parametrize("d,dv,latent", [(32, 48, False), (64, 32, True)])
def test_export_then_import(client, d, dv, latent):
    rng = np.random.default_rng(d + dv)
    q = rng.standard_normal((4, 13, d)).astype(np.float32)
    k = rng.standard_normal((2, 13, d)).astype(np.float32)
    v = k[:, :, :dv].copy() if latent else rng.standard_normal((2, 13, dv)).astype(np.float32)
    sid = "pytest-move-%d" % next(_ids)
    kind = {"v_from_k": dv} if latent else {"head_dim_v": dv}
    s = client.session(sid, heads_kv=2, head_dim=d, layers=2, max_tokens=32, **kind)
    send = (lambda a, b: None) if latent else (lambda a, b: v[:, a:b])
    s.attend(q[:, :12], k[:, :12], send(0, 12), layer=0)
    s.attend(q[:, :5], k[:, :5], send(0, 5), layer=1)
    data = s.export()
    assert isinstance(data, bytes)
    before = s.attend(q[:, 12:13], k[:, 12:13], send(12, 13), layer=0)
    s.truncate(12)  # layer 0 back to where the export was
    e = attnd_error(client.import_session, sid, data)
    assert (e.status, e.code) == (409, "session_exists"), e
    s.delete()
    moved = client.import_session(sid, data)
    try:
        assert moved.lengths == [12, 5] and moved.head_dim_v == dv
        assert moved.v_from_k == latent
        assert moved.export() == data
        after = moved.attend(q[:, 12:13], k[:, 12:13], send(12, 13), layer=0)
        assert np.array_equal(after, before)
        ref = reference(q[:, 12:13], k, v, causal=True)[0]
        assert rel_err(after, ref) <= TOL[np.float32]
    finally:
        moved.delete(missing_ok=True)
