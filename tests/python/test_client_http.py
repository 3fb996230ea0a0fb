"""The Python client's own HTTP/1.1 connection (clients/python/attnd/_http.py) against a
canned peer: replies with Content-Length, chunked, delimited by the close, after a 100
Continue, without a body (204); Connection: close honoured; a peer that closes
before any reply byte reported as such (the client's reconnect rule rests on it); the bytes
counted; polling for a reply (spin_us) giving the same results as sleeping. And through a
real attnd: a session's decode steps with spin_us, checked against a float64 reference."""

import os
import socket
import threading

import numpy as np
import pytest

import attnd
from attnd import _http
from attn_ref import reference


class Peer:
    """A listening socket that answers each request it reads, on one connection, with the
    next of ``replies`` (bytes; None: close without a byte), and records what it read."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.requests = []
        self.ls = socket.socket()
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(4)
        self.port = self.ls.getsockname()[1]
        self.t = threading.Thread(target=self._serve, daemon=True)
        self.t.start()

    def _read_request(self, conn, buf):
        while b"\r\n\r\n" not in buf:
            chunk = conn.recv(65536)
            if not chunk:
                return None, buf
            buf += chunk
        head, rest = buf.split(b"\r\n\r\n", 1)
        n = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                n = int(value)
        while len(rest) < n:
            rest += conn.recv(65536)
        return head + b"\r\n\r\n" + rest[:n], rest[n:]

    def _serve(self):
        while self.replies:
            conn, _ = self.ls.accept()
            buf = b""
            while self.replies:
                req, buf = self._read_request(conn, buf)
                if req is None:
                    break
                self.requests.append(req)
                reply = self.replies.pop(0)
                if reply is None:
                    break
                conn.sendall(reply)
                if b"Connection: close" in reply.split(b"\r\n\r\n")[0]:
                    break
            conn.close()

    def close(self):
        self.ls.close()


def ok(body, extra=b""):
    return b"HTTP/1.1 200 OK\r\n" + extra + b"Content-Length: %d\r\n\r\n" % len(body) + body


def test_reply_forms():
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-Trailer: y\r\n\r\n")
    peer = Peer([ok(b"first"), chunked,
                 b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"after 100"),
                 b"HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n", ok(b"x" * 300000),
                 b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the end"])
    c = _http.Connection("127.0.0.1", peer.port, 5)
    got = [c.request("GET", "/a").body, c.request("POST", "/b", b"xyz").body,
           c.request("GET", "/c").body, c.request("GET", "/d").body]
    assert got == [b"first", b"hello, world", b"after 100", b""]
    big = c.request("GET", "/e")
    assert big.status == 200 and len(big.body) == 300000 and isinstance(big.body, bytearray)
    last = c.request("GET", "/f")
    assert last.body == b"to the end" and c.sock is None, "a reply ended by the close"
    assert c.sent == sum(len(r) for r in peer.requests), "every byte written is counted"
    assert peer.requests[1].endswith(b"Content-Length: 3\r\n\r\nxyz")
    assert all(r.count(b"\r\nHost: 127.0.0.1:%d\r\n" % peer.port) == 1 for r in peer.requests)
    peer.close()


def test_headers_and_connection_close():
    peer = Peer([ok(b"{}", b"X-Session-Length: 49\r\nContent-Type: application/json\r\n"),
                 ok(b"bye", b"Connection: close\r\n"), ok(b"again")])
    c = _http.Connection("127.0.0.1", peer.port, 5)
    r = c.request("GET", "/x", headers={"Accept": "application/json"})
    assert r.getheader("x-session-length") == "49" and r.getheader("X-SESSION-LENGTH") == "49"
    assert r.getheader("missing", "d") == "d" and r.reason == "OK"
    assert b"\r\nAccept: application/json\r\n" in peer.requests[0]
    assert c.request("GET", "/y").body == b"bye" and c.sock is None
    assert c.request("GET", "/z").body == b"again", "a new connection after the close"
    peer.close()


def expect_raise(replies, exc):
    peer = Peer(replies)
    c = _http.Connection("127.0.0.1", peer.port, 5)
    with pytest.raises(exc):
        c.request("GET", "/")
    c.close()
    peer.close()


def test_peer_closed_before_any_byte_and_a_cut_reply():
    expect_raise([None], _http.PeerClosed)
    expect_raise([b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 100\r\n\r\n"
                  b"only this"], _http.ReplyError)
    expect_raise([b"SSH-2.0-OpenSSH\r\n\r\n"], _http.ReplyError)


def test_spin_gives_the_same_replies():
    peer = Peer([ok(b"%d" % i) for i in range(20)])
    c = _http.Connection("127.0.0.1", peer.port, 5, spin_us=300)
    assert [bytes(c.request("GET", "/%d" % i).body) for i in range(20)] == \
        [b"%d" % i for i in range(20)]
    peer.close()
    with pytest.raises(ValueError):
        attnd.Client("http://127.0.0.1:1", spin_us=-1)


def test_session_steps_with_spin(server):
    """Decode steps through a real attnd with the client polling for replies: each step's
    o against float64 over every key sent so far."""
    c = server.client(spin_us=200)
    s = c.session("spin-%d" % os.getpid(), heads_kv=2, head_dim=16, dtype="F32",
                  max_tokens=64)
    rng = np.random.default_rng(7)
    q = rng.standard_normal((4, 20, 16), dtype=np.float32)
    k = rng.standard_normal((2, 20, 16), dtype=np.float32)
    v = rng.standard_normal((2, 20, 16), dtype=np.float32)
    s.attend(q[:, :12], k[:, :12], v[:, :12])
    for t in range(12, 20):
        o = s.attend(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1])
        want = reference(q[:, t:t + 1], k[:, :t + 1], v[:, :t + 1], causal=True)[0]
        assert np.max(np.abs(o - want)) < 1e-5, "step %d" % t
    assert s.lengths == [20]
    s.delete()
