"""Percent-escapes in session paths, through HAProxy from docker/proxy-config.

The proxy hashes a session call by its path as sent and refuses _batch by its letters,
while a replica would read the path decoded: "dup%2D1" and "dup-1" would be two keys of
the ring for one session, and "%5Fbatch" would pass for "_batch". Both refuse a '%' in a
session path with 422 invalid_request: the proxy itself (no replica is reached), and each
replica for a client that calls it directly.

Run: make build/attnd, then ATTND_BIN=build/attnd build/venv/bin/python -m pytest -q
tests/scale -k escape
"""

import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cluster  # noqa: E402

pytestmark = pytest.mark.skipif(cluster.HAPROXY is None,
                                reason="haproxy is not installed (make deps installs Debian's)")

SHAPE = json.dumps({"heads_kv": 1, "head_dim": 4, "dtype": "F32", "max_tokens": 4})
JSON = {"Content-Type": "application/json"}
BATCH = json.dumps({"sessions": ["dup-1"], "layer": 0})


def attnd_bin():
    b = os.environ.get("ATTND_BIN", os.path.join(cluster.ROOT, "build", "attnd"))
    return b if os.path.isabs(b) else os.path.join(cluster.ROOT, b)


@pytest.fixture(scope="module")
def trio(tmp_path_factory):
    work = str(tmp_path_factory.mktemp("escapes"))
    rs = [cluster.Replica(attnd_bin(), "r%d" % i, work,
                          ["--threads", "1", "--session-memory", "16M"]) for i in range(3)]
    p = None
    try:
        for r in rs:
            r.start()
        p = cluster.Proxy(rs, work)
        for r in rs:
            p.wait_status(r.name, "UP")
        yield p, rs
    finally:
        if p:
            p.stop()
        for r in rs:
            r.stop()


def refused(status, headers, body, what, by_proxy):
    assert status == 422, (what, status, body)
    err = json.loads(body)["error"]
    assert err["code"] == "invalid_request" and "percent-encoded" in err["message"], (what, err)
    if by_proxy:
        assert "x-served-by" not in headers, "%s reached %s" % (what, headers["x-served-by"])


@pytest.mark.parametrize("method, path, body", [
    ("PUT", "/v1/sessions/dup%2D1", SHAPE),
    ("PUT", "/v1/sessions/%64up-1", SHAPE),
    ("GET", "/v1/sessions/dup%2d1", None),
    ("POST", "/v1/sessions/dup-1/%61ttention", "{}"),
    ("POST", "/v1/sessions/%5Fbatch", BATCH),
    ("POST", "/v1/%73essions/_batch", BATCH),
    ("GET", "/v1/session%73", None),
])
def test_an_escaped_session_path_is_refused_by_the_proxy_and_by_a_replica(trio, method, path,
                                                                          body):
    p, rs = trio
    h = JSON if body else {}
    refused(*cluster.request(p.port, method, path, body=body, headers=h), path, True)
    refused(*cluster.request(rs[0].port, method, path, body=body, headers=h), path, False)


def test_an_escaped_id_never_makes_a_second_session(trio):
    """PUT /v1/sessions/dup%2D1 then PUT /v1/sessions/dup-1: one session, on one replica."""
    p, rs = trio
    status, _, body = cluster.request(p.port, "PUT", "/v1/sessions/dup%2D1", SHAPE, JSON)
    assert status == 422, body
    status, headers, body = cluster.request(p.port, "PUT", "/v1/sessions/dup-1", SHAPE, JSON)
    assert status == 201, body
    holders = [r.name for r in rs if "dup-1" in r.sessions()]
    assert holders == [headers["x-served-by"]], holders
    status, _, body = cluster.request(p.port, "PUT", "/v1/sessions/dup%2D1", SHAPE, JSON)
    assert status == 422, body
    assert [r.name for r in rs if "dup-1" in r.sessions()] == holders
    status, _, _ = cluster.request(p.port, "DELETE", "/v1/sessions/dup-1")
    assert status == 204
