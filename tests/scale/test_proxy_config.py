"""docker/proxy-config on its own and with HAProxy: its refusals, configurations that
`haproxy -c` accepts, server ids that follow the names (the hash ring), about 1/N of the
sessions moving when a replica is added, and the API keys checked at the proxy.

Run: ATTND_BIN=build/attnd build/venv/bin/python -m pytest -q tests/scale
"""

import hashlib
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cluster  # noqa: E402

needs_haproxy = pytest.mark.skipif(cluster.HAPROXY is None,
                                   reason="haproxy is not installed (make deps installs Debian's)")


def proxy_config(*args):
    return subprocess.run([cluster.PROXY_CONFIG] + list(args), capture_output=True, text=True,
                          timeout=30)


def servers(cfg, backend):
    """{name: id} of a backend's server lines."""
    block = cfg.split("\nbackend %s\n" % backend)[1].split("\nbackend ")[0]
    return dict(re.findall(r"^\s+server (\S+) \S+ id (\d+) ", block, re.M))


def attnd_bin():
    b = os.environ.get("ATTND_BIN", os.path.join(cluster.ROOT, "build", "attnd"))
    return b if os.path.isabs(b) else os.path.join(cluster.ROOT, b)


@pytest.mark.parametrize("args, says", [
    ((), "--listen HOST:PORT is required"),
    (("--listen", "8080", "a:1"), "--listen takes HOST:PORT"),
    (("--listen", ":80"), "no replica given"),
    (("--listen", ":80", "nohost"), "is not HOST:PORT"),
    (("--listen", ":80", "a:http"), "the port is not a number"),
    (("--listen", ":80", "::1:80"), "[ADDR]:PORT"),
    (("--listen", ":80", "x=a:1", "x=b:2"), "given twice"),
    (("--listen", ":80", "b@d=a:1"), "use A-Z a-z 0-9"),
    (("--listen", ":80", "bad name=a:1"), "no blanks"),
    (("--listen", ":80", "--timeout", "soon", "a:1"), "whole number"),
    (("--listen", ":80", "--api-key-file", "/nonexistent", "a:1"), "cannot read it"),
    (("--listen", ":80", "--frobnicate", "a:1"), "unknown option"),
    (("--listen",), "needs a value"),
])
def test_bad_arguments_are_refused(args, says):
    r = proxy_config(*args)
    assert r.returncode == 2 and says in r.stderr, (r.returncode, r.stderr)
    assert r.stdout == "", "half a configuration printed: %r" % r.stdout[:200]


# Values that would write more into the configuration than they say: '#' comments out the
# rest of a line (a server's id, port and health check), a blank starts another word (a
# socket's "mode 666 level admin"), a newline another line.
@pytest.mark.parametrize("args, says", [
    (("--listen", ":80", "a#b:1"), "the host may hold only"),
    (("--listen", ":80", "x=h#1:1"), "the host may hold only"),
    (("--listen", ":80", "h'x:1"), "the host may hold only"),
    (("--listen", ":80", "[::1#]:1"), "is not an IPv6 address"),
    (("--listen", ":80", "a:0"), "not 1 to 65535"),
    (("--listen", ":80", "a:65536"), "not 1 to 65535"),
    (("--listen", ":80", "a:1#"), "the port is not a number"),
    (("--listen", ":80", "--", "a:1 b:2"), "no blanks"),
    (("--listen", ":80", "--", "a:1", "b:2 #"), "no blanks"),
    (("--listen", ":80", "--", "a:1\nserver evil 10.0.0.9:80"), "control character"),
    (("--listen", ":80", "a:1\tb:2"), "control character"),
    (("--listen", ":80", "--stats-socket", "/p mode 666 level admin #", "a:1"),
     "--stats-socket"),
    (("--listen", ":80", "--stats-socket", "/tmp/s#", "a:1"), "--stats-socket"),
    (("--listen", ":80", "--stats-socket", '/tmp/"s"', "a:1"), "--stats-socket"),
    (("--listen", ":80", "--stats-socket", "/tmp/$HOME", "a:1"), "--stats-socket"),
    (("--listen", ":80", "--stats-socket", "ipv4@0.0.0.0:9999", "a:1"), "absolute path"),
    (("--listen", ":80", "--stats-socket", "/tmp/s,ipv4@0.0.0.0:9999", "a:1"), "--stats-socket"),
    (("--listen", ":80", "--stats-socket", "s.sock", "a:1"), "absolute path"),
    (("--listen", ":80 #", "a:1"), "the port is not a number"),
    (("--listen", "0.0.0.0:80 ssl crt /x", "a:1"), "the port is not a number"),
    (("--listen", "a b:80", "a:1"), "the host may hold only"),
    (("--listen", ":80\nlisten evil", "a:1"), "control character"),
    (("--listen", ":0", "a:1"), "not 1 to 65535"),
    (("--listen", ":80", "--resolvers", "10.0.0.1:53 #", "a:1"), "the port is not a number"),
    (("--listen", ":80", "--resolvers", "resolv.conf\n    nameserver x 1.2.3.4:53", "a:1"),
     "control character"),
    (("--listen", ":80", "--resolvers", "ns#1:53", "a:1"), "the host may hold only"),
    (("--listen", ":80", "--resolvers", "10.0.0.1", "a:1"), "is not HOST:PORT"),
    (("--listen", ":80", "--api-key-file", "/tmp/k\nglobal", "a:1"), "control character"),
    (("--listen", ":80", "--timeout", "99999999999", "a:1"), "1 to 999999999"),
])
def test_hostile_values_are_refused(args, says):
    r = proxy_config(*args)
    assert r.returncode == 2 and says in r.stderr, (args, r.returncode, r.stderr)
    assert r.stdout == "", "half a configuration printed: %r" % r.stdout[:200]


@pytest.mark.parametrize("listen, replica", [
    (":8080", "a=10.0.0.1:8080"), ("*:8080", "a.b-c_d:1"), ("[::]:8080", "[::1]:65535"),
    ("127.0.0.1:8080", "x=[fe80::1]:80"),
])
def test_plain_values_pass(listen, replica):
    r = proxy_config("--listen", listen, "--stats-socket", "/run/haproxy/admin.sock",
                     "--resolvers", "10.0.0.1:53", replica)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "    bind %s\n" % listen in r.stdout


def test_help_and_the_command_it_was_printed_by():
    r = proxy_config("--help")
    assert r.returncode == 0 and "--listen HOST:PORT" in r.stdout and "not_routable" in r.stdout
    r = proxy_config("--listen", ":8080", "a=10.0.0.1:8080", "[::1]:8081")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[2] == "#   docker/proxy-config --listen :8080 a=10.0.0.1:8080 " \
                                       "'[::1]:8081'"


def test_a_keyfile_puts_digests_not_keys_in_the_config(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# ops\nalice: s3cret-alice\n\n  bare-key-2  \n")
    r = proxy_config("--listen", ":80", "--api-key-file", str(keys), "a:1")
    assert r.returncode == 0, r.stderr
    assert "s3cret-alice" not in r.stdout and "bare-key-2" not in r.stdout
    acl = [ln for ln in r.stdout.splitlines() if "acl key_ok" in ln][0]
    want = {hashlib.sha256(k).hexdigest() for k in (b"s3cret-alice", b"bare-key-2")}
    assert set(re.findall(r" ([0-9a-f]{64})\b", acl)) == want, acl   # as attnd trims them
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n\n")
    r = proxy_config("--listen", ":80", "--api-key-file", str(empty), "a:1")
    assert r.returncode == 2 and "holds no key" in r.stderr and r.stdout == ""


def test_ids_follow_names_so_the_ring_keeps_its_places():
    """A replica's server id depends on its name alone: adding or removing another (or
    changing its address) leaves every other id as it was."""
    three = proxy_config("--listen", ":80", "a=h1:1", "b=h2:1", "c=h3:1").stdout
    two = proxy_config("--listen", ":80", "c=elsewhere:9", "a=h1:1").stdout
    ids3, ids2 = servers(three, "sessions"), servers(two, "sessions")
    assert ids3 == servers(three, "stateless") and len(set(ids3.values())) == 3
    assert ids2 == {"a": ids3["a"], "c": ids3["c"]}


@needs_haproxy
@pytest.mark.parametrize("extra", [(), ("--resolvers", "resolv.conf"),
                                   ("--resolvers", "127.0.0.53:53", "--maxconn", "100",
                                    "--check-interval", "250", "--timeout", "600")])
def test_haproxy_accepts_the_configuration(extra, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("k1:abc\n")
    cfg = tmp_path / "haproxy.cfg"
    r = proxy_config("--listen", "127.0.0.1:18080", "--api-key-file", str(keys), "--stats-socket",
                     str(tmp_path / "s.sock"), *extra, "r0=127.0.0.1:1", "r1=localhost:2")
    assert r.returncode == 0, r.stderr
    cfg.write_text(r.stdout)
    c = subprocess.run([cluster.HAPROXY, "-c", "-f", str(cfg)], capture_output=True, text=True,
                       timeout=30)
    assert c.returncode == 0, c.stdout + c.stderr


@needs_haproxy
def test_adding_a_replica_moves_about_a_third_of_the_sessions(tmp_path):
    """Which replica each of 300 session ids reaches, with two replicas and then three:
    only ids that move to the new replica move at all, and they are about 1/3."""
    rs = [cluster.Replica(attnd_bin(), "r%d" % i, str(tmp_path), ["--threads", "1"])
          for i in range(3)]
    proxies = []
    try:
        for r in rs:
            r.start()
        for n in (2, 3):
            d = tmp_path / ("p%d" % n)
            d.mkdir()
            proxies.append(cluster.Proxy(rs[:n], str(d)))
            for r in rs[:n]:
                proxies[-1].wait_status(r.name, "UP")
        ids = ["chat-%03d" % i for i in range(300)]

        def where(p):
            return {i: cluster.request(p.port, "GET", "/v1/sessions/" + i)[1]["x-served-by"]
                    for i in ids}
        two, three = where(proxies[0]), where(proxies[1])
        moved = [i for i in ids if two[i] != three[i]]
        assert all(three[i] == "r2" for i in moved), "a session moved between old replicas"
        assert 0.2 < len(moved) / len(ids) < 0.47, len(moved)
    finally:
        for p in proxies:
            p.stop()
        for r in rs:
            r.stop()


@needs_haproxy
def test_keys_are_checked_at_the_proxy(tmp_path):
    """With --api-key-file the proxy answers 401 itself (no replica reached) to a token
    that is none of the keys; a good one passes to the replica, which checks it too; the
    open routes need none."""
    keys = tmp_path / "keys"
    keys.write_text("alice:alice-key-0123\nbob:bob-key-4567\n")
    r = cluster.Replica(attnd_bin(), "r0", str(tmp_path),
                        ["--threads", "1", "--api-key-file", str(keys)])
    p = None
    try:
        r.start()
        p = cluster.Proxy([r], str(tmp_path), extra=("--api-key-file", str(keys)))
        p.wait_status("r0", "UP")
        for auth in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "alice-key-0123"}):
            status, headers, body = cluster.request(p.port, "GET", "/v1/info", headers=auth)
            assert status == 401 and b'"unauthorized"' in body, (auth, status, body)
            assert "x-served-by" not in headers, "the replica was reached"
        for tok in ("Bearer alice-key-0123", "bearer   bob-key-4567  "):
            status, headers, body = cluster.request(p.port, "GET", "/v1/info",
                                                    headers={"Authorization": tok})
            assert status == 200 and headers["x-served-by"] == "r0", (tok, status, body)
        status, _, _ = cluster.request(p.port, "GET", "/readyz")
        assert status == 200
    finally:
        if p:
            p.stop()
        r.stop()
