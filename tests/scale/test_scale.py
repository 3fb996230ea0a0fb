"""Three attnd replicas on loopback behind HAProxy, configured by docker/proxy-config.

Stateless requests spread over every replica; each session lives on one replica and gives
the float64 answer through the proxy; a replica killed loses only its own sessions, which
answer 404 session_not_found and are re-created by attnd.Session from its history, while
the other sessions go on untouched; SIGTERM drains a replica (the proxy takes it out of
rotation, the call it was computing finishes) with no failed call; and a graceful restart
with --session-dir brings its sessions back on the same replica.

No test measures time: each waits for the event it names (a health check's verdict, an
exit, a reply) within a bound only a broken setup reaches. The replicas are
build/tests/attnd-hold (tests/lib/hold_backend.c): attnd whose backend=reference jobs wait
for a release file, so the drain test's call is still running when the signal comes
however fast the machine, instead of being a problem big enough to be slow.

Run: make build/attnd build/tests/attnd-hold, then
ATTND_BIN=build/attnd build/venv/bin/python -m pytest -q tests/scale
"""

import os
import sys
import threading

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cluster  # noqa: E402

sys.path.insert(0, os.path.join(cluster.ROOT, "clients", "python"))
sys.path.insert(0, os.path.join(cluster.ROOT, "tests", "python"))
import attnd  # noqa: E402
from attn_ref import reference, rel_err  # noqa: E402

pytestmark = pytest.mark.skipif(cluster.HAPROXY is None,
                                reason="haproxy is not installed (make deps installs Debian's)")

H, D = 2, 16          # a session's heads (q and kv alike) and head size
DRAIN_DELAY = 5       # the replicas' --drain-delay: many of the proxy's 0.1 s checks
# the replicas' --drain-timeout and --timeout, and how long attnd-hold holds a job at most
# ($ATTN_HOLD_MAX_S): bounds only a broken drain reaches, far past the drain test's wait
# for the proxy to take its replica out, during which its call is held
DRAIN_TIMEOUT = 300
TOL = 1e-5            # F32 against float64


def attnd_bin():
    b = os.environ.get("ATTND_BIN", os.path.join(cluster.ROOT, "build", "attnd"))
    return b if os.path.isabs(b) else os.path.join(cluster.ROOT, b)


def hold_bin():
    """$ATTND_HOLD_BIN, or tests/attnd-hold beside attnd_bin() (as the C suites find it)."""
    b = os.environ.get("ATTND_HOLD_BIN") or os.path.join(os.path.dirname(attnd_bin()), "tests",
                                                         "attnd-hold")
    return b if os.path.isabs(b) else os.path.join(cluster.ROOT, b)


@pytest.fixture(scope="module")
def gate(tmp_path_factory):
    """The file whose creation releases the replicas' held jobs; absent until then."""
    return str(tmp_path_factory.mktemp("hold") / "release")


def release(path):
    open(path, "a").close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, gate):
    work = str(tmp_path_factory.mktemp("scale"))
    env = {"ATTN_HOLD_RELEASE": gate, "ATTN_HOLD_MAX_S": str(DRAIN_TIMEOUT)}
    args = ["--threads", "1", "--http-threads", "1", "--trusted-proxy", "127.0.0.1",
            "--drain-delay", str(DRAIN_DELAY), "--drain-timeout", str(DRAIN_TIMEOUT),
            "--timeout", str(DRAIN_TIMEOUT), "--session-memory", "64M",
            "--session-dir", None]
    replicas = []
    for i in range(3):
        d = os.path.join(work, "sessions-%d" % i)
        os.mkdir(d)
        r = cluster.Replica(hold_bin(), "r%d" % i, work, args[:-1] + [d], env)
        r.start()
        replicas.append(r)
    proxy = cluster.Proxy(replicas, work)
    for r in replicas:
        proxy.wait_status(r.name, "UP")
    try:
        yield replicas, proxy
    finally:
        proxy.stop()
        for r in replicas:
            r.stop()


@pytest.fixture
def whole(fleet):
    """The fleet, every replica up at the proxy once the test is done."""
    replicas, proxy = fleet
    yield replicas, proxy
    for r in replicas:
        if not r.alive():
            r.start()
        proxy.wait_status(r.name, "UP")


class Decoder:
    """A session decoding through the proxy: keeps every token's k, v (its history, which
    attnd.Session re-prefills from) and checks each step against float64."""

    def __init__(self, url, sid, rng, max_tokens=256):
        self.k = np.zeros((H, 0, D), np.float32)
        self.v = np.zeros((H, 0, D), np.float32)
        self.rng = rng
        self.s = attnd.Session(attnd.Client(url), sid, heads_kv=H, head_dim=D,
                               max_tokens=max_tokens, history=self.history)

    def history(self, layer, length):
        assert layer == 0
        return self.k[:, :length], self.v[:, :length]

    def step(self):
        q, k, v = (self.rng.standard_normal((H, 1, D)).astype(np.float32) for _ in range(3))
        o = self.s.attend(q, k, v)
        self.k = np.concatenate([self.k, k], axis=1)
        self.v = np.concatenate([self.v, v], axis=1)
        want = reference(q, self.k, self.v, causal=True)[0]
        err = rel_err(o, want)
        assert err < TOL, "session %s at length %d: error %g" % (self.s.id, self.k.shape[1], err)
        assert self.s.lengths[0] == self.k.shape[1]


def decoding(proxy, prefix, n, steps, seed):
    """n sessions through the proxy, each decoded steps steps."""
    rng = np.random.default_rng(seed)
    decoders = [Decoder(proxy.url, "%s-%02d" % (prefix, i), rng) for i in range(n)]
    for _ in range(steps):
        for d in decoders:
            d.step()
    return decoders


def owner(replicas, sid):
    """The one replica holding sid (asked directly); fails if none or several do."""
    holders = [r for r in replicas if r.alive() and sid in r.sessions()]
    assert len(holders) == 1, "session %s is on %s" % (sid, [r.name for r in holders])
    return holders[0]


def tiny(port, xff=None):
    body = b'{"q": [[1, 0]], "k": [[1, 0]], "v": [[1, 2]]}'
    headers = {"Content-Type": "application/json"}
    if xff:
        headers["X-Forwarded-For"] = xff
    return cluster.request(port, "POST", "/attention", body, headers)


def test_stateless_requests_spread_over_every_replica(fleet):
    replicas, proxy = fleet
    served = {}
    for _ in range(30):
        status, headers, body = tiny(proxy.port)
        assert status == 200, body
        served[headers["x-served-by"]] = served.get(headers["x-served-by"], 0) + 1
    assert set(served) == {r.name for r in replicas}, served


def test_request_ids_and_client_addresses_pass_through(fleet):
    replicas, proxy = fleet
    status, headers, _ = cluster.request(proxy.port, "GET", "/v1/info",
                                         headers={"X-Request-Id": "trace-77"})
    assert status == 200 and headers["x-request-id"] == "trace-77"
    status, headers, _ = cluster.request(proxy.port, "GET", "/v1/info")
    assert status == 200 and len(headers["x-request-id"]) == 36     # the proxy's uuid
    status, headers, _ = tiny(proxy.port, xff="203.0.113.9")
    assert status == 200
    r = next(r for r in replicas if r.name == headers["x-served-by"])
    line = cluster.wait_for("the call's log line", lambda: [
        ln for ln in r.log().splitlines() if headers["x-request-id"] in ln], 10)[0]
    # the proxy (127.0.0.1, trusted) appended the caller's address after the header the
    # caller sent; the replica reads from the right past trusted hops
    assert " client=127.0.0.1 " not in line or "203.0.113.9" in line, line
    assert " client=203.0.113.9 " in line, line


def test_thirty_sessions_live_on_one_replica_each(fleet):
    replicas, proxy = fleet
    decoders = decoding(proxy, "spread", 30, 4, seed=1)
    where = {d.s.id: owner(replicas, d.s.id).name for d in decoders}
    assert set(where.values()) == {r.name for r in replicas}, where
    assert all(d.s.recreated == 0 for d in decoders)
    for d in decoders:
        d.s.delete()


def test_batch_and_list_are_refused_by_the_proxy(fleet):
    _, proxy = fleet
    status, _, body = cluster.request(proxy.port, "POST", "/v1/sessions/_batch", b"{}",
                                      {"Content-Type": "application/json"})
    assert status == 400 and b'"not_routable"' in body and b"one replica" in body, body
    status, _, body = cluster.request(proxy.port, "GET", "/v1/sessions")
    assert status == 400 and b'"not_routable"' in body, body


def test_killed_replica_loses_only_its_sessions(whole):
    replicas, proxy = whole
    decoders = decoding(proxy, "kill", 12, 2, seed=2)
    where = {d.s.id: owner(replicas, d.s.id) for d in decoders}
    victim = replicas[1]
    lost = [d for d in decoders if where[d.s.id] is victim]
    kept = [d for d in decoders if where[d.s.id] is not victim]
    assert lost and kept
    victim.kill()
    for d in decoders:      # the first calls may reach the proxy before its check does
        d.step()
    assert all(d.s.recreated == 1 for d in lost), [d.s.recreated for d in lost]
    assert all(d.s.recreated == 0 for d in kept), [d.s.recreated for d in kept]
    for d in kept:          # untouched: still where they were
        assert owner(replicas, d.s.id) is where[d.s.id]
    for d in lost:          # re-created, whole, on a replica that lives
        assert owner(replicas, d.s.id) is not victim
        assert d.s.info()["lengths"] == [3]
    for d in decoders:
        d.s.delete(missing_ok=True)


def test_sigterm_drains_with_no_failed_call(whole, gate):
    replicas, proxy = whole
    victim = replicas[2]
    failures, done = [], threading.Event()

    def stateless_load():
        while not done.is_set():
            status, _, body = tiny(proxy.port)
            if status != 200:
                failures.append((status, body))

    def session_load(i):
        rng = np.random.default_rng(10 + i)
        try:
            for n in range(10**6):      # sessions of 64 tokens, one after another
                d = Decoder(proxy.url, "drain-%d-%d" % (i, n), rng)
                for _ in range(64):
                    if done.is_set():
                        return
                    d.step()
                # missing_ok: a session whose every call ran on the victim before the proxy
                # took it out is deleted at the replica that inherits its id, which never
                # held it (404; the victim keeps its copy in --session-dir)
                d.s.delete(missing_ok=True)
        except Exception as e:  # noqa: BLE001 - every failure is reported
            failures.append(repr(e))

    # a call in flight on the victim when the signal comes, started before the load so that
    # it is the replica's only job when it is seen: attnd-hold keeps it running until the
    # gate opens, once the proxy has taken the replica out, so the drain must wait for it
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 64, 64)).astype(np.float32) for _ in range(3))
    held = {}

    def held_call():
        client = attnd.Client("http://" + victim.addr, timeout=DRAIN_TIMEOUT + 60)
        try:
            held["o"] = client.attention(q, k, v, backend="reference")
        except Exception as e:  # noqa: BLE001 - reported with the others
            failures.append("the held call: " + repr(e))

    inflight = threading.Thread(target=held_call)
    inflight.start()
    cluster.wait_for("the held call to run on %s" % victim.name,
                     lambda: "\nattnd_inflight 1" in metrics(victim), 60)
    workers = [threading.Thread(target=stateless_load) for _ in range(2)]
    workers += [threading.Thread(target=session_load, args=(i,)) for i in range(3)]
    for t in workers:
        t.start()
    try:
        victim.term()
        proxy.wait_status(victim.name, "DOWN", limit=DRAIN_DELAY * 4)
        assert victim.alive(), "the replica stopped before the proxy took it out of rotation"
        assert inflight.is_alive(), "the held call was answered before its release"
        release(gate)
        assert victim.wait_exit(limit=DRAIN_TIMEOUT + 60) == 0
        inflight.join(timeout=DRAIN_TIMEOUT + 60)
    finally:
        release(gate)           # a failed check must not leave the call held
        done.set()
        for t in workers:
            t.join(timeout=60)
    assert not failures, failures[:5]
    assert not victim.sanitizer_reports()
    assert rel_err(held["o"], reference(q, k, v)[0]) < TOL
    tail = victim.log().split("/readyz answers 503")
    assert len(tail) == 2, "no drain-delay note in the log"
    refused = [ln for ln in tail[1].splitlines() if " 503 " in ln and "/readyz" not in ln]
    assert not refused, refused[:5]


def metrics(r):
    status, _, body = cluster.request(r.port, "GET", "/metrics")
    return body.decode() if status == 200 else ""


def test_graceful_restart_keeps_sessions_on_their_replica(whole):
    replicas, proxy = whole
    decoders = decoding(proxy, "restart", 9, 1, seed=4)
    victim = replicas[0]
    mine = [d for d in decoders if owner(replicas, d.s.id) is victim]
    assert mine
    victim.term()                 # saves its sessions to --session-dir
    assert victim.wait_exit(limit=60) == 0 and not victim.sanitizer_reports()
    victim.start()                # same name and port: the same place on the ring
    proxy.wait_status(victim.name, "UP")
    for d in decoders:
        d.step()
    assert all(d.s.recreated == 0 for d in decoders), [d.s.recreated for d in decoders]
    for d in mine:
        assert owner(replicas, d.s.id) is victim
        d.s.delete()
    for d in decoders:
        d.s.delete(missing_ok=True)
