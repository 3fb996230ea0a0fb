"""attnd --handover behind HAProxy: three replicas, each handing its sessions to the proxy
when it stops (the proxy then routes each id to the replica that inherits it on the ring).

Sessions decode through the proxy; one replica gets SIGTERM with --drain-delay, the proxy
takes it out of rotation, the replica drains and PUTs each of its sessions to the proxy,
which routes the import to the inheritor. The calls of those sessions pause from the signal
to the exit; after it, every session goes on where the ring now sends it with no 404 (the
client never rebuilds: attnd.Session counts its re-creations), each step against float64
attention over the session's whole history, and the replica's log holds the summary.

No test measures time: each waits for the event it names (a health check's verdict, an
exit) within a bound only a broken setup reaches.

Run: make build/attnd, then ATTND_BIN=build/attnd build/venv/bin/python -m pytest -q
tests/scale/test_scale_handover.py
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cluster  # noqa: E402
from test_scale import attnd_bin, decoding, owner  # noqa: E402

pytestmark = pytest.mark.skipif(cluster.HAPROXY is None,
                                reason="haproxy is not installed (make deps installs Debian's)")

DRAIN_DELAY = 3       # many of the proxy's 0.1 s checks


@pytest.fixture
def fleet(tmp_path):
    work = str(tmp_path)
    port = cluster.free_port()
    args = ["--threads", "1", "--http-threads", "1", "--trusted-proxy", "127.0.0.1",
            "--drain-delay", str(DRAIN_DELAY), "--session-memory", "64M",
            "--handover", "http://127.0.0.1:%d" % port, "--handover-timeout", "60"]
    replicas = [cluster.Replica(attnd_bin(), "r%d" % i, work, args) for i in range(3)]
    for r in replicas:
        r.start()
    proxy = cluster.Proxy(replicas, work, port=port)
    for r in replicas:
        proxy.wait_status(r.name, "UP")
    try:
        yield replicas, proxy
    finally:
        proxy.stop()
        for r in replicas:
            r.stop()


def test_a_stopping_replica_hands_its_sessions_to_their_inheritors(fleet):
    replicas, proxy = fleet
    decoders = decoding(proxy, "ho", 12, 3, seed=5)
    where = {d.s.id: owner(replicas, d.s.id) for d in decoders}
    victim = replicas[1]
    mine = [d for d in decoders if where[d.s.id] is victim]
    others = [d for d in decoders if where[d.s.id] is not victim]
    assert mine and others
    victim.term()
    proxy.wait_status(victim.name, "DOWN", limit=DRAIN_DELAY * 4)
    for d in others:            # the rest of the fleet serves on through the drain
        d.step()
    assert victim.wait_exit(limit=120) == 0 and not victim.sanitizer_reports()
    log = victim.log()
    summary = "handover to %s: %d moved" % (proxy.url, len(mine))
    assert summary in log and ", 0 kept" in log, log[-3000:]
    for d in decoders:          # the paused sessions go on where the ring sends them now
        d.step()
        d.step()
    assert all(d.s.recreated == 0 for d in decoders), [d.s.recreated for d in decoders]
    for d in mine:
        assert owner(replicas, d.s.id) is not victim
        assert d.s.info()["lengths"] == [5]     # 3 before, 2 after: nothing lost
    for d in others:            # untouched: still where they were
        assert owner(replicas, d.s.id) is where[d.s.id]
    for d in decoders:
        d.s.delete()
