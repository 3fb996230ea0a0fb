"""attnd.Session's history callback: a session the server no longer has (404
session_not_found: a replica lost behind a proxy routing by session id, simulated here by a
DELETE behind the object's back or by a kill -9 and a fresh server on the same port) is
re-created, re-prefilled from history and the call made again; each reply is checked against
float64 attention (tests/python/attn_ref.py) over the whole history."""

import urllib.parse

import numpy as np

import attnd
from conftest import Server, attnd_error
from test_sessions_client import D, HKV, HQ, Mirror, _check, _rand, _sid


class History(Mirror):
    """A model runner's own copy of k and v, handed to the session as its history; it
    records the (layer, length) of each call."""

    def __init__(self, layers=1):
        super().__init__(layers)
        self.calls = []

    def __call__(self, layer, length):
        self.calls.append((layer, length))
        return self.k[layer][:, :length], self.v[layer][:, :length]


def _step(s, hist, rng, n=1, layer=0):
    """One call appending n tokens to a layer, checked against the reference."""
    q, k, v = _rand(rng, HQ, n), _rand(rng, HKV, n), _rand(rng, HKV, n)
    o = s.attend(q, k, v, layer=layer)
    hist.append(k, v, layer)
    _check(o, hist.expect(q, layer)[0])


def _lose(client, s):
    """What a lost replica looks like from the session: it is gone."""
    attnd.Session.attach(client, s.id).delete()


def test_recover_after_loss(client):
    """Three layers (the last never used) decode, the session is lost, and the next call
    re-creates it, re-prefills the two used layers to their lengths and answers right."""
    rng = np.random.default_rng(11)
    hist = History(layers=3)
    with client.session(_sid("recover"), heads_kv=HKV, head_dim=D, layers=3, max_tokens=64,
                        history=hist) as s:
        for layer, n in ((0, 9), (1, 7)):
            _step(s, hist, rng, n, layer)
            for _ in range(3):
                _step(s, hist, rng, 1, layer)
        assert s.lengths == [12, 10, 0] and s.recreated == 0 and hist.calls == []
        _lose(client, s)
        _step(s, hist, rng, 1, layer=1)
        assert s.recreated == 1
        assert sorted(hist.calls) == [(0, 12), (1, 10)]
        assert s.info()["lengths"] == [12, 11, 0]
        # the re-prefilled layers hold the history: the next steps on them are right too
        _step(s, hist, rng, 1, layer=0)
        _step(s, hist, rng, 2, layer=2)
        q = _rand(rng, HQ, 1)
        _check(s.attend(q, layer=1), hist.expect(q, 1)[0])   # no k, v: the whole layer
        assert s.recreated == 1 and s.lengths == [13, 11, 2]


def test_without_history_the_loss_raises(client):
    rng = np.random.default_rng(12)
    hist = History()
    with client.session(_sid("nohist"), heads_kv=HKV, head_dim=D, max_tokens=16) as s:
        _step(s, hist, rng, 4)
        _lose(client, s)
        e = attnd_error(_step, s, hist, rng)
        assert (e.status, e.code) == (404, "session_not_found")
        assert s.recreated == 0
        e = attnd_error(attnd.Session.attach, client, s.id)
        assert e.code == "session_not_found"


def test_history_of_the_wrong_shape(client):
    """A history that is not [heads_kv, length, head_dim] raises, and leaves no session
    holding part of it: the layer it did fill is deleted again, and once the history is
    right the next call rebuilds it all."""
    rng = np.random.default_rng(13)
    hist = History(layers=2)
    with client.session(_sid("shape"), heads_kv=HKV, head_dim=D, layers=2, max_tokens=32,
                        history=hist) as s:
        _step(s, hist, rng, 5, layer=0)
        _step(s, hist, rng, 6, layer=1)
        _lose(client, s)

        def short(layer, length):   # one token short on the second layer
            k, v = hist(layer, length)
            return (k, v) if layer == 0 else (k[:, 1:], v[:, 1:])
        s.history = short
        q = _rand(rng, HQ, 1)
        try:
            s.attend(q, layer=0)
        except ValueError as e:
            assert "history(1, 6) gave k of shape [2, 5, 16]" in str(e), e
            assert "[heads_kv, length, head_dim] = [2, 6, 16]" in str(e), e
        else:
            raise AssertionError("a short history was taken")
        assert s.recreated == 0 and s.lengths == [5, 6]
        e = attnd_error(attnd.Session.attach, client, s.id)
        assert e.code == "session_not_found"

        s.history = lambda layer, length: None
        try:
            s.attend(q, layer=0)
        except TypeError as e:
            assert "must return (k, v)" in str(e), e
        else:
            raise AssertionError("a history of no k, v was taken")

        s.history = hist
        _check(s.attend(q, layer=0), hist.expect(q, 0)[0])
        _step(s, hist, rng, 1, layer=1)
        assert s.recreated == 1 and s.lengths == [5, 7]


def test_lost_again_while_rebuilding_raises(client):
    """A 404 during the rebuild (the session lost again) is raised, not retried."""
    rng = np.random.default_rng(14)
    hist = History()
    with client.session(_sid("again"), heads_kv=HKV, head_dim=D, max_tokens=16) as s:
        _step(s, hist, rng, 3)
        _lose(client, s)

        def losing(layer, length):
            _lose(client, s)
            return hist(layer, length)
        s.history = losing
        e = attnd_error(_step, s, hist, rng)
        assert (e.status, e.code) == (404, "session_not_found")
        assert s.recreated == 0 and s.lengths == [3]


def test_truncate_rebuilds_the_kept_tokens(client):
    """A truncate that finds the session gone rebuilds only the tokens it keeps: the
    rejected draft need not be in the history any more."""
    rng = np.random.default_rng(15)
    hist = History()
    with client.session(_sid("trunc"), heads_kv=HKV, head_dim=D, max_tokens=32,
                        history=hist) as s:
        _step(s, hist, rng, 8)
        _step(s, hist, rng, 3)            # a draft of 3, to be rejected
        hist.truncate(8)
        _lose(client, s)
        s.truncate(8)
        assert s.recreated == 1 and hist.calls == [(0, 8)]
        assert s.lengths == [8] and s.info()["lengths"] == [8]
        _step(s, hist, rng, 1)


class Racing(attnd.Client):
    """A client that, before its next PUT, runs ``before_put``: another client re-creating
    the session between this one's 404 and its re-create."""

    before_put = None

    def _request(self, method, path, body=None, headers=None):
        if method == "PUT" and self.before_put is not None:
            run, self.before_put = self.before_put, None
            run()
        return super()._request(method, path, body, headers)


def test_back_already(server, client):
    """A session re-created by another client first: taken when it holds the lengths this
    object had seen (the other client re-prefilled the same history), 409 session_conflict
    when not, with nothing appended."""
    rng = np.random.default_rng(16)
    hist = History()
    racing = Racing(server.url)
    with racing.session(_sid("back"), heads_kv=HKV, head_dim=D, max_tokens=32,
                        history=hist) as s:
        _step(s, hist, rng, 6)

        def empty():
            client.session(s.id, heads_kv=HKV, head_dim=D, max_tokens=32)

        def refilled():
            client.session(s.id, heads_kv=HKV, head_dim=D, max_tokens=32).attend(
                _rand(rng, HQ, 1), hist.k[0], hist.v[0], pos=0)

        _lose(client, s)
        racing.before_put = empty
        e = attnd_error(_step, s, hist, rng)
        assert (e.status, e.code) == (409, "session_conflict")
        assert "lengths [0], not the [6]" in e.message, e.message
        assert s.recreated == 0 and s.lengths == [6]
        assert attnd.Session.attach(client, s.id).lengths == [0]

        _lose(client, s)
        racing.before_put = refilled
        _step(s, hist, rng)
        assert s.recreated == 1 and hist.calls == [] and s.lengths == [7]


def test_recover_after_restart(tmp_path):
    """kill -9 loses every session (none was saved); a fresh server on the same port has
    none, and the next call rebuilds the session there."""
    rng = np.random.default_rng(17)
    hist = History(layers=2)
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    first = Server(["--threads", "2"], tmp_path / "first")
    try:
        s = first.client().session(_sid("restart"), heads_kv=HKV, head_dim=D, layers=2,
                                   max_tokens=64, history=hist)
        _step(s, hist, rng, 10, layer=0)
        _step(s, hist, rng, 10, layer=1)
        for layer in (0, 1):
            _step(s, hist, rng, 1, layer)
    finally:
        first.proc.kill()
        first.proc.wait()
    second = Server(["--threads", "2"], tmp_path / "second", port=first.port)
    try:
        _step(s, hist, rng, 1, layer=1)
        assert s.recreated == 1 and s.info()["lengths"] == [11, 12]
        _step(s, hist, rng, 1, layer=0)
    finally:
        assert second.stop() == 0, second.log()


def test_prefill_in_chunks(client, monkeypatch):
    """A long history goes in several calls (here 3 tokens a call instead of 64 MiB)."""
    monkeypatch.setattr(attnd.sessions, "_PREFILL_BYTES", 3 * 2 * HKV * D * 4)
    rng = np.random.default_rng(18)
    hist = History()
    with client.session(_sid("chunks"), heads_kv=HKV, head_dim=D, max_tokens=32,
                        history=hist) as s:
        _step(s, hist, rng, 10)
        _lose(client, s)
        sent = []
        real = client._request

        def request(method, path, body=None, headers=None):
            sent.append(path)
            return real(method, path, body, headers)
        monkeypatch.setattr(client, "_request", request)
        _step(s, hist, rng)
        assert s.recreated == 1 and s.lengths == [11]
        pos = [urllib.parse.parse_qs(urllib.parse.urlsplit(p).query).get("pos")
               for p in sent if "/attention" in p]
        assert pos == [["10"], ["0"], ["3"], ["6"], ["9"], ["10"]]   # lost, 4 chunks, retry


def _stale_copy(client, s, hist, n):
    """What a replica back from a restart serves when the calls had moved on meanwhile:
    the session as it was n tokens in (the copy it saved)."""
    _lose(client, s)
    old = attnd.Session(client, s.id, heads_kv=HKV, head_dim=D, max_tokens=s.max_tokens)
    old.attend(_rand(np.random.default_rng(0), HKV, 1), hist.k[0][:, :n], hist.v[0][:, :n])
    assert old.info()["lengths"] == [n]


def test_an_older_copy_is_rebuilt(client):
    """An append at the tracked position meets an older copy (409 session_conflict, the
    server holding fewer tokens): it is deleted and rebuilt from history, and the reply
    is over the whole history; so is a call without k, v that the older copy answered
    over its own length."""
    rng = np.random.default_rng(17)
    hist = History()
    with client.session(_sid("older"), heads_kv=HKV, head_dim=D, max_tokens=64,
                        history=hist) as s:
        _step(s, hist, rng, 6)
        _stale_copy(client, s, hist, 3)
        _step(s, hist, rng)
        assert s.recreated == 1 and s.info()["lengths"] == [7]
        _stale_copy(client, s, hist, 5)
        q = _rand(rng, HQ, 1)
        _check(s.attend(q), hist.expect(q, 0)[0])
        assert s.recreated == 2 and s.lengths == [7] and s.info()["lengths"] == [7]


def test_a_newer_copy_is_not_clobbered(client):
    """A copy ahead of this object (another writer appended) is never deleted: the
    conflict is raised, and the session keeps the other writer's tokens."""
    rng = np.random.default_rng(18)
    hist = History()
    with client.session(_sid("newer"), heads_kv=HKV, head_dim=D, max_tokens=64,
                        history=hist) as s:
        _step(s, hist, rng, 4)
        other = attnd.Session.attach(client, s.id)
        other.attend(_rand(rng, HQ, 1), _rand(rng, HKV, 2), _rand(rng, HKV, 2))
        e = attnd_error(_step, s, hist, rng)
        assert (e.status, e.code) == (409, "session_conflict")
        e = attnd_error(s.attend, _rand(rng, HQ, 1))
        assert (e.status, e.code) == (409, "session_conflict")
        assert s.recreated == 0 and s.info()["lengths"] == [6]
