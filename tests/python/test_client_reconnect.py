"""The client's kept-alive connection: a call after the server closed it while idle
(--idle-timeout) opens another and succeeds; a reply lost on a kept-alive connection makes
the call go once more, which a session answers as a replay; and a call is never sent twice
when its connection was new or when part of the reply had come."""

import json
import select
import socket
import threading

import numpy as np
import pytest

import attnd
from conftest import _serve, attnd_error


@pytest.fixture(scope="module")
def idle_server(tmp_path_factory):
    """attnd closing keep-alive connections idle for about a second."""
    yield from _serve(["--threads", "2", "--idle-timeout", "1", "--header-timeout", "1"],
                      tmp_path_factory)


def _attention(q, k, v):
    s = q @ k.T / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def _wait_for_eof(sock):
    """Returns once the peer has closed ``sock`` (EOF or reset), reading nothing from it."""
    for _ in range(600):
        if not select.select([sock], [], [], 0.5)[0]:
            continue
        try:
            if sock.recv(1, socket.MSG_PEEK) == b"":
                return
        except ConnectionResetError:
            return
        pytest.fail("the server sent bytes on an idle connection")
    pytest.fail("the server never closed the idle connection")


def test_call_after_idle_close(idle_server):
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((4, 16)).astype(np.float32) for _ in range(3))
    c = idle_server.client()
    np.testing.assert_allclose(c.attention(q, k, v), _attention(q, k, v), rtol=1e-5, atol=1e-5)
    kept = c._local.conn.sock
    _wait_for_eof(kept)
    q2 = q[::-1].copy()
    np.testing.assert_allclose(c.attention(q2, k, v), _attention(q2, k, v), rtol=1e-5,
                               atol=1e-5)
    assert c._local.conn.sock is not None and c._local.conn.sock is not kept
    c.close()


def _read_message(f):
    """One HTTP/1.1 request or reply (with Content-Length) from file ``f``; None at EOF."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        line = f.readline()
        if not line:
            return None
        head += line
    n = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            n = int(value)
    return head + f.read(n)


class LosingProxy:
    """A relay to attnd, HTTP message by message, that can lose one reply: when ``lose`` is
    ``(path_prefix, keep)``, the next request whose path starts with path_prefix is passed
    on, and of attnd's reply only the first ``keep`` bytes go back before the client's
    connection is closed. ``log`` holds each request's (path, reply, bytes passed back)."""

    def __init__(self, upstream_port):
        self.upstream = upstream_port
        self.lose = None
        self.log = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = "http://127.0.0.1:%d" % self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn):
        with conn, socket.create_connection(("127.0.0.1", self.upstream)) as up:
            cf, uf = conn.makefile("rb"), up.makefile("rb")
            while True:
                req = _read_message(cf)
                if req is None:
                    return
                up.sendall(req)
                reply = _read_message(uf)
                path = req.split(b" ", 2)[1].decode()
                lose, keep = self.lose or ("", None), len(reply)
                if self.lose and path.startswith(lose[0]):
                    self.lose, keep = None, lose[1]
                conn.sendall(reply[:keep])
                self.log.append((path, reply, keep))
                if keep < len(reply):
                    return

    def close(self):
        self.listener.close()


@pytest.fixture
def proxy(server):
    p = LosingProxy(server.port)
    yield p
    p.close()


def _body(reply):
    """The JSON reply's object."""
    return json.loads(reply.split(b"\r\n\r\n", 1)[1])


def test_lost_session_reply_is_replayed(proxy):
    c = attnd.Client(proxy.url)
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((2, 3, 8)).astype(np.float32) for _ in range(3))
    with c.session("reconnect-replay", heads_kv=2, head_dim=8, max_tokens=16) as s:
        s.attend(q, k, v)
        q1, k1, v1 = (x[:, :1].copy() for x in (q, k, v))
        # JSON, whose reply says whether it was a replay
        proxy.lose = ("/v1/sessions/reconnect-replay/attention", 0)
        o = s.attend(q1, k1, v1, json=True)
        assert s.lengths == [4] and s.info()["lengths"] == [4]
    (path, lost, kept), (path2, replayed, _) = proxy.log[2], proxy.log[3]
    assert path == path2 and kept == 0
    lost, replayed = _body(lost), _body(replayed)
    assert (lost["replay"], replayed["replay"]) == (False, True)
    assert lost["length"] == replayed["length"] == 4
    assert replayed["o"] == lost["o"]
    np.testing.assert_array_equal(o, np.array(lost["o"]["data"], np.float32).reshape(o.shape))


def test_no_second_send_on_a_new_connection(proxy):
    c = attnd.Client(proxy.url)
    proxy.lose = ("/v1/info", 0)
    e = attnd_error(c.info)
    assert (e.status, e.code) == (0, "unreachable")
    assert [p for p, _, _ in proxy.log] == ["/v1/info"]


def test_no_second_send_after_reply_bytes(proxy):
    c = attnd.Client(proxy.url)
    c.info()
    proxy.lose = ("/v1/info", 5)
    e = attnd_error(c.info)
    assert (e.status, e.code) == (0, "unreachable")
    assert [p for p, _, _ in proxy.log] == ["/v1/info", "/v1/info"]
