"""Fixtures: a real build/attnd on a free port, and the client package on sys.path.

ATTND_BIN names the server binary (default build/attnd under the repository root).
Run: ATTND_BIN=build/attnd /usr/bin/python3 -m pytest -q tests/python
"""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))

import attnd  # noqa: E402


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A running attnd: ``url``, ``client()``, ``log()``, ``stop()``; on ``port`` when
    given, else a free one."""

    def __init__(self, args, tmp_path, port=None):
        binary = os.environ.get("ATTND_BIN", os.path.join(ROOT, "build", "attnd"))
        if not os.path.isabs(binary):
            binary = os.path.join(ROOT, binary)
        if not os.access(binary, os.X_OK):
            pytest.fail("no attnd binary at %s (make build/attnd, or set ATTND_BIN)" % binary)
        self.log_path = os.path.join(str(tmp_path), "attnd.log")
        last = None
        # A port of our choosing can be taken between choosing and binding it: choose again.
        # A given port (a restart in its predecessor's place) has one try.
        for _ in range(1 if port else 5):
            self.port = port or _free_port()
            self.url = "http://127.0.0.1:%d" % self.port
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(
                    [binary, "--listen", "127.0.0.1:%d" % self.port] + list(args),
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
            last = self._wait_healthy()
            if last is None:
                return
        pytest.fail("attnd did not come up: %s\n%s" % (last, self.log()))

    def _wait_healthy(self, limit=10.0):
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return "exited with status %d" % self.proc.returncode
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1) as r:
                    if r.status == 200:
                        return None
            except OSError:
                pass
            time.sleep(0.02)
        self.proc.kill()
        self.proc.wait()
        return "no 200 from /healthz within %.0f s" % limit

    def client(self, **kw):
        return attnd.Client(self.url, **kw)

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def stop(self):
        """SIGTERM, wait, and return the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                pytest.fail("attnd did not exit within 30 s of SIGTERM\n" + self.log())
        return self.proc.returncode


def _serve(args, tmp_path_factory):
    srv = Server(args, tmp_path_factory.mktemp("attnd"))
    yield srv
    status = srv.stop()
    assert status == 0, "attnd exited with status %d\n%s" % (status, srv.log())


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """attnd --threads 2, shared by the whole session; stopped with SIGTERM (exit 0)."""
    yield from _serve(["--threads", "2"], tmp_path_factory)


@pytest.fixture(scope="module")
def small_queue_server(tmp_path_factory):
    """attnd --max-queue 0: every POST /attention gets 503 queue_full, with no
    race between requests (the tests must pass on a loaded machine)."""
    yield from _serve(["--max-queue", "0"], tmp_path_factory)


@pytest.fixture
def client(server):
    return server.client()


def attnd_error(fn, *a, **kw):
    """The AttndError that fn(*a, **kw) raises (the test fails if it raises none)."""
    with pytest.raises(attnd.AttndError) as e:
        fn(*a, **kw)
    return e.value
