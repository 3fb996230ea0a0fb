"""One kept-alive plain HTTP/1.1 connection of :class:`attnd.Client`.

http.client parses every reply's head through the email package and sends a request's
head one header at a time: some 150 microseconds of Python a call, where a session's decode
step costs the server about twenty. Here a request goes out in one send and a reply is read
through one buffer, its head split by hand. Replies attnd sends carry Content-Length; one
chunked or delimited by the close (a proxy's) is read too. HTTPS stays with http.client.
"""

import socket
import time

_READ = 256 * 1024  # bytes asked of each recv


class PeerClosed(Exception):
    """The peer closed the connection before the first byte of a reply; ``err`` says how."""

    def __init__(self, err):
        super().__init__(str(err))
        self.err = err


class ReplyError(OSError):
    """A reply that is not HTTP/1.x, or that ended in its middle."""


class Reply:
    """A reply: its status, reason, headers (by lower-case name) and whole body."""

    __slots__ = ("status", "reason", "headers", "body")

    def getheader(self, name, default=None):
        return self.headers.get(name.lower(), default)


class Connection:
    """A connection opened on the first request, kept between requests, closed on any
    error (the next request opens another). spin_us: see :class:`attnd.Client`."""

    def __init__(self, host, port, timeout, spin_us=0):
        self.host, self.port, self.timeout = host, port, timeout
        self.spin_s = spin_us * 1e-6
        self.sock = None
        self.sent = 0  # bytes of requests written, heads included, in all
        self._buf = bytearray()
        self._host_line = "Host: %s:%d\r\n" % (host if ":" not in host else "[%s]" % host, port)

    def close(self):
        if self.sock is not None:
            self.sock.close()
        self.sock = None
        self._buf = bytearray()

    def request(self, method, target, body=None, headers=None):
        """Sends the request and reads its reply (a :class:`Reply`); raises
        :class:`PeerClosed` when the peer closed the connection before any reply byte."""
        if self.sock is None:
            self.sock = socket.create_connection((self.host, self.port), self.timeout)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        body = b"" if body is None else body
        head = ["%s %s HTTP/1.1\r\n" % (method, target), self._host_line]
        head += ["%s: %s\r\n" % kv for kv in (headers or {}).items()]
        head.append("Content-Length: %d\r\n\r\n" % len(body))
        data = "".join(head).encode("latin-1")
        self.sent += len(data) + len(body)
        try:
            self.sock.sendall(data + body if len(body) < 65536 else data)
            if len(body) >= 65536:
                self.sock.sendall(body)
        except (BrokenPipeError, ConnectionResetError):
            # The server may answer before reading the whole body (413 from
            # Content-Length, 503 queue_full) and close: its reply is still readable.
            pass
        return self._reply(method)

    def _spin(self):
        """The reply's first bytes, polled for up to spin_s before sleeping in recv: a
        thread that sleeps is woken some tens of microseconds after the reply lands (on a
        virtual machine's idle CPU, more), a decode step's whole server time."""
        end = time.perf_counter() + self.spin_s
        while time.perf_counter() < end:
            try:
                return self.sock.recv(_READ, socket.MSG_DONTWAIT)
            except BlockingIOError:
                pass
        return self.sock.recv(_READ)

    def _fill(self, first):
        try:
            chunk = self._spin() if first and self.spin_s > 0 else self.sock.recv(_READ)
        except ConnectionResetError as e:
            if first:
                raise PeerClosed(e)
            raise
        if not chunk and first:
            raise PeerClosed(ConnectionResetError("the server closed the connection"))
        if not chunk:
            raise ReplyError("the reply ended in its head")
        self._buf += chunk

    def _head(self):
        """The reply's head, taken out of the buffer (a 1xx reply skipped)."""
        while True:
            first = not self._buf
            end = self._buf.find(b"\r\n\r\n")
            while end < 0:
                self._fill(first)
                first = False
                end = self._buf.find(b"\r\n\r\n")
            lines = bytes(self._buf[:end]).decode("latin-1").split("\r\n")
            del self._buf[:end + 4]
            parts = lines[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
                raise ReplyError("not an HTTP/1.x reply: %r" % lines[0][:80])
            if not 100 <= int(parts[1]) < 200:
                return int(parts[1]), parts[2] if len(parts) > 2 else "", lines[1:]

    def _reply(self, method):
        r = Reply()
        r.status, r.reason, lines = self._head()
        r.headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            r.headers[name.strip().lower()] = value.strip()
        n = r.headers.get("content-length")
        close = r.headers.get("connection", "").lower() == "close"
        if method == "HEAD" or r.status in (204, 304):
            r.body = bytearray()
        elif "chunked" in r.headers.get("transfer-encoding", "").lower():
            r.body = self._chunked()
        elif n is not None and n.isdigit():
            r.body = self._exactly(int(n))
        else:
            r.body, close = self._to_close(), True
        if close:
            self.close()
        return r

    def _exactly(self, n):
        """n body bytes, into one bytearray (writable: arrays may view it)."""
        body = bytearray(n)
        got = min(n, len(self._buf))
        body[:got] = self._buf[:got]
        del self._buf[:got]
        view = memoryview(body)
        while got < n:
            k = self.sock.recv_into(view[got:])
            if k == 0:
                raise ReplyError("the reply was cut after %d of %d bytes" % (got, n))
            got += k
        return body

    def _line(self):
        end = self._buf.find(b"\r\n")
        while end < 0:
            self._fill(False)
            end = self._buf.find(b"\r\n")
        line = bytes(self._buf[:end])
        del self._buf[:end + 2]
        return line

    def _chunked(self):
        body = bytearray()
        while True:
            size = int(self._line().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self._line():  # trailers, up to the empty line
                    pass
                return body
            body += self._exactly(size)
            self._line()

    def _to_close(self):
        body = bytearray(self._buf)
        self._buf = bytearray()
        while True:
            chunk = self.sock.recv(_READ)
            if not chunk:
                return body
            body += chunk
