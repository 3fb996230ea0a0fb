"""attnd replicas on loopback behind HAProxy, configured by docker/proxy-config.

Used by tests/scale (the checks) and tests/bench/scale.py (make bench-scale). A Replica
keeps its name and port across restarts, as a StatefulSet pod does, so that the proxy's
hash ring places it where it was. Every wait is for an event (a health check's verdict, a
process's exit), bounded by a limit that only a broken setup reaches.
"""

import csv
import http.client
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROXY_CONFIG = os.path.join(ROOT, "docker", "proxy-config")
HAPROXY = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy")
                                      else None)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, body=None, headers=None, timeout=60):
    """(status, headers dict with lower-case names, body bytes) of one call on a fresh
    connection to 127.0.0.1:port."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def wait_for(what, cond, limit):
    """Polls cond() until it is true; AssertionError naming what after limit seconds."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError("waited %.0f s for %s" % (limit, what))


class Replica:
    """One attnd: ``name``, ``port``, ``start()``, ``kill()``, ``term()``, ``log()``."""

    def __init__(self, binary, name, workdir, args=(), env=None):
        self.binary, self.name, self.args = binary, name, list(args)
        self.env = dict(os.environ, **env) if env else None   # added to the test's own
        self.port = free_port()
        self.log_path = os.path.join(workdir, name + ".log")
        self.proc = None

    @property
    def addr(self):
        return "127.0.0.1:%d" % self.port

    def start(self, limit=20):
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([self.binary, "--listen", self.addr] + self.args,
                                         stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=self.env)
        wait_for("%s to answer /healthz" % self.name, self._healthy, limit)

    def _healthy(self):
        if self.proc.poll() is not None:
            raise AssertionError("%s exited with status %d:\n%s" % (self.name, self.proc.returncode,
                                                                   self.log()[-2000:]))
        try:
            return request(self.port, "GET", "/healthz", timeout=2)[0] == 200
        except OSError:
            return False

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def term(self):
        self.proc.send_signal(signal.SIGTERM)

    def wait_exit(self, limit=60):
        return self.proc.wait(timeout=limit)

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def stop(self, limit=60):
        """SIGTERM and wait; AssertionError unless it exits 0 with a log free of sanitizer
        reports (a SAN=1 build writes them there, LeakSanitizer's at the exit)."""
        if not self.alive():
            return
        self.term()
        status = self.wait_exit(limit)
        bad = self.sanitizer_reports()
        assert status == 0 and not bad, "%s exited %d:\n%s" % (self.name, status,
                                                                  "\n".join(bad) or
                                                                  self.log()[-2000:])

    def sanitizer_reports(self):
        return [ln for ln in self.log().splitlines()
                if "Sanitizer" in ln or "runtime error:" in ln]

    def sessions(self):
        """The ids of the sessions this replica holds (asked directly, not through the
        proxy)."""
        status, _, body = request(self.port, "GET", "/v1/sessions")
        assert status == 200, body
        return {s["id"] for s in json.loads(body)["sessions"]}


class Proxy:
    """HAProxy in front of replicas, from docker/proxy-config's output: ``port``,
    ``states(name)`` (the health checks' verdicts through the runtime API), ``stop()``."""

    def __init__(self, replicas, workdir, check_ms=100, extra=(), port=None):
        """port: the one to listen on (free_port() when None); replicas that hand their
        sessions over to the proxy (--handover) are given it before the proxy starts."""
        if not HAPROXY:
            raise RuntimeError("haproxy is not installed (make deps installs Debian's)")
        self.port = port or free_port()
        self.socket = os.path.join(workdir, "haproxy.sock")
        self.cfg = os.path.join(workdir, "haproxy.cfg")
        cmd = [PROXY_CONFIG, "--listen", "127.0.0.1:%d" % self.port, "--stats-socket",
               self.socket, "--check-interval", str(check_ms)] + list(extra)
        cmd += ["%s=%s" % (r.name, r.addr) for r in replicas]
        with open(self.cfg, "w") as f:
            subprocess.run(cmd, check=True, stdout=f)
        subprocess.run([HAPROXY, "-c", "-q", "-f", self.cfg], check=True)
        self.log_path = os.path.join(workdir, "haproxy.log")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([HAPROXY, "-db", "-f", self.cfg],
                                         stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT)
        wait_for("HAProxy's runtime API", lambda: self._stat_or_none() is not None, 20)

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def runtime(self, command):
        """One command of HAProxy's runtime API, its answer as text."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(self.socket)
            s.sendall(command.encode() + b"\n")
            out = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return out.decode()
                out += chunk

    def _stat_or_none(self):
        try:
            return self.runtime("show stat")
        except OSError:
            if self.proc.poll() is not None:
                raise AssertionError("haproxy exited:\n" + open(self.log_path).read()[-2000:])
            return None

    def states(self, name):
        """{backend: state} of server name (UP, DOWN, MAINT, or a transition: UP 1/2...),
        from one `show stat`."""
        rows = csv.DictReader(io.StringIO(self.runtime("show stat").lstrip("# ")))
        got = {row["pxname"]: row["status"] for row in rows if row["svname"] == name}
        if not got:
            raise AssertionError("no server %s at the proxy" % name)
        return got

    def wait_status(self, name, want, limit=30):
        """Waits until both backends (each checks its servers) see name as want."""
        return wait_for("%s to be %s at the proxy" % (name, want),
                        lambda: set(self.states(name).values()) == {want}, limit)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
