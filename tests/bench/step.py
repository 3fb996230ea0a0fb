#!/usr/bin/env python3
"""make bench-step: one session decode step of attnd against a Redis SET of the same bytes.

A decode step that appends one token to a server-held KV cache and attends over 49 keys
is a small request: a few KiB in, a few KiB out, microseconds of arithmetic. Its floor is
what any key-value server takes to store that many bytes over one keep-alive loopback
connection. This benchmark measures the step against that floor in the same run:

  attnd   POST /v1/sessions/{id}/attention, safetensors: q [9, 1, 64], k and v [3, 1, 64],
          F32 (Hq 9, Hkv 3, D 64, one query token), `pos` and `layer` in __metadata__;
          the session holds 48 keys, the step appends the 49th; an untimed truncate after
          each step puts it back at 48, so every step is the same work;
  redis   SET of a value of the step's tensor bytes (q + k + v, 3,840 bytes), RESP.

Both go through the same client loop on one TCP_NODELAY connection each: send bytes
encoded before the clock starts, read until one whole reply is buffered (HTTP: the head
and Content-Length bytes; RESP: a simple-string line). Rounds alternate the order of the
two, each side idle for --gap seconds before it is timed; a warm-up round comes first.
The table gives p50, p90 and p99 in microseconds and attnd / redis at each, and the
p50 of attnd's Server-Timing (compute: body decode, append, engine, encode; total).

A second table times POST /v1/sessions/_batch of 64 sessions' one-token steps (each
session at 48 keys, the same shape; untimed truncates put all back): the call's p50 and
p90, its cost per entry (p50 / 64) and that cost against the single step's p50; then the
same 64 entries sent as single steps, one session each in turn (their keys as cold as the
batch finds them), and the batch call against their sum.

attnd's log goes to a temporary file: a thread of this process draining a pipe would take
the GIL from the timed loop once a request.

The step's o and the batch's are checked once, untimed, against a float64 numpy reference
over the 49 keys; every attnd reply must be 200 with the session at 49 keys.

  step.py --build build [--threads T] [--rounds R] [--reps N] [--batch-reps B] [--gap S]
          [--json]
"""

import argparse
import collections
import datetime
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
from attnd import safetensors  # noqa: E402

SEED = 20261203
HQ, HKV, D = 9, 3, 64
DT = "F32"
HELD = 48            # keys in a session between steps; a step attends over HELD + 1
BATCH = 64           # sessions in one _batch call
MAX_TOKENS = 64
SESSION_MEMORY = "256M"  # 65 sessions x 384 KiB reserved, with room to spare


# ---- one client loop for both servers -------------------------------------------------

def http_end(buf):
    """Where the first whole HTTP reply in buf ends, or -1."""
    h = buf.find(b"\r\n\r\n")
    if h < 0:
        return -1
    m = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", buf[:h])
    end = h + 4 + (int(m.group(1)) if m else 0)
    return end if len(buf) >= end else -1


def resp_end(buf):
    """Where the first RESP simple string or error in buf ends, or -1."""
    i = buf.find(b"\r\n")
    return i + 2 if i >= 0 else -1


class Link:
    """One keep-alive connection; call() sends pre-encoded bytes and returns one reply."""

    def __init__(self, port, reply_end):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reply_end = reply_end
        self.buf = b""

    def call(self, req):
        self.s.sendall(req)
        buf = self.buf
        while True:
            end = self.reply_end(buf)
            if end >= 0:
                self.buf = buf[end:]
                return buf[:end]
            chunk = self.s.recv(65536)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            buf += chunk

    def timed(self, req):
        """One call: (reply, microseconds from the first byte sent to the reply's last)."""
        t0 = time.perf_counter_ns()
        reply = self.call(req)
        return reply, (time.perf_counter_ns() - t0) / 1e3

    def close(self):
        self.s.close()


def http_request(port, method, path, body=b"", ctype="application/octet-stream"):
    head = "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % (method, path, port)
    if body or method in ("POST", "PUT"):
        head += "Content-Type: %s\r\nContent-Length: %d\r\n" % (ctype, len(body))
    return (head + "\r\n").encode() + bytes(body)


def http_status(reply):
    return int(reply[9:12])


def http_body(reply):
    return reply[reply.find(b"\r\n\r\n") + 4:]


def expect(reply, what, statuses=(200,)):
    if http_status(reply) not in statuses:
        raise SystemExit("step.py: %s: %s" % (what, reply[:400].decode("latin-1")))
    return reply


def resp_set(key, value):
    """RESP: SET key value, as an array of bulk strings."""
    parts = [b"SET", key, bytes(value)]
    out = b"*%d\r\n" % len(parts)
    for p in parts:
        out += b"$%d\r\n%s\r\n" % (len(p), p)
    return out


# ---- the servers ------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Attnd:
    """build/attnd on a port it picks; its port read from its "listening on" line."""

    def __init__(self, build, threads):
        exe = os.path.join(build, "attnd")
        if not os.access(exe, os.X_OK):
            raise SystemExit("step.py: no %s (make %s builds it)" % (exe, exe))
        self.cmd = [exe, "--listen", "127.0.0.1:0", "--threads",
                    str(threads), "--session-memory", SESSION_MEMORY]
        # Its log goes to a file, not a pipe: a thread of this process reading
        # a line per request would take the GIL from the timed loop, a cost
        # Redis (which logs nothing per request) would not pay.
        self.log = tempfile.TemporaryFile(mode="w+")
        self.p = subprocess.Popen(self.cmd, stderr=self.log, text=True)
        self.port = self.listening_port()
        wait_ready(lambda: http_status(self.get("/readyz")) == 200, "attnd's /readyz")

    def listening_port(self, seconds=30):
        deadline = time.time() + seconds
        while time.time() < deadline:
            self.log.seek(0)
            m = re.search(r"listening on .*?127\.0\.0\.1:(\d+)", self.log.read())
            if m:
                return int(m.group(1))
            if self.p.poll() is not None:
                break
            time.sleep(0.02)
        raise SystemExit("step.py: attnd did not start: %s" % " ".join(self.cmd))

    def get(self, path):
        c = Link(self.port, http_end)
        try:
            return c.call(http_request(self.port, "GET", path))
        finally:
            c.close()

    def stop(self):
        stop(self.p, signal.SIGTERM)


class Redis:
    """redis-server on a free port, nothing saved, no config file."""

    def __init__(self):
        exe = shutil.which("redis-server")
        if not exe:
            raise SystemExit("step.py: redis-server not found (make bench-step installs it)")
        self.port = free_port()
        self.cmd = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "no"]
        self.p = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        out = subprocess.run([exe, "--version"], stdout=subprocess.PIPE, text=True).stdout
        m = re.search(r"v=(\S+)", out)
        self.version = "redis-server " + (m.group(1) if m else "?")
        wait_ready(self.ping, "redis-server's PING")

    def ping(self):
        c = Link(self.port, resp_end)
        try:
            return c.call(b"*1\r\n$4\r\nPING\r\n") == b"+PONG\r\n"
        finally:
            c.close()

    def stop(self):
        stop(self.p, signal.SIGTERM)


def wait_ready(check, what, seconds=30):
    deadline = time.time() + seconds
    while True:
        try:
            if check():
                return
        except OSError:
            pass
        if time.time() > deadline:
            raise SystemExit("step.py: %s never answered" % what)
        time.sleep(0.05)


def stop(p, sig):
    if p.poll() is not None:
        return
    p.send_signal(sig)
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


# ---- data and the reference ---------------------------------------------------------------

def make_data():
    """K, V [Hkv, 49, D] (48 held, the 49th appended by the step) and BATCH queries
    [BATCH, Hq, 1, D]: the single step uses the first, each batch entry its own."""
    rng = np.random.default_rng(SEED)
    k = rng.standard_normal((HKV, HELD + 1, D), dtype=np.float32)
    v = rng.standard_normal((HKV, HELD + 1, D), dtype=np.float32)
    q = rng.standard_normal((BATCH, HQ, 1, D), dtype=np.float32)
    return q, k, v


def reference(q, k, v):
    """softmax(q K^T / sqrt(D)) V in float64, query head h on KV head h / (Hq / Hkv)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    g = HQ // HKV
    kk, vv = np.repeat(k, g, axis=0), np.repeat(v, g, axis=0)
    s = np.einsum("hqd,hkd->hqk", q, kk) / np.sqrt(D)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("hqk,hkd->hqd", p, vv)


def check_o(reply, want, what):
    t, _ = safetensors.decode(bytearray(http_body(reply)))
    got = np.asarray(t["o"], np.float64).reshape(want.shape)
    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    if not err < 1e-5:
        raise SystemExit("step.py: %s: o differs from the float64 reference by %.3g (relative, "
                         "norm); the benchmark would time a wrong step" % (what, err))
    return err


def st(tensors, meta):
    return bytes(safetensors.encode([(n, t, np.ascontiguousarray(x)) for n, t, x in tensors],
                                    meta))


# ---- the requests, encoded once ---------------------------------------------------------

class Requests:
    """Every request the run sends, as bytes, made before any clock starts."""

    def __init__(self, port, q, k, v):
        self.step_sid = "step"
        self.batch_sids = ["b%02d" % i for i in range(BATCH)]
        new = (k[:, HELD:HELD + 1], v[:, HELD:HELD + 1])
        self.step = http_request(port, "POST", "/v1/sessions/step/attention", st(
            [("q", DT, q[0]), ("k", DT, new[0]), ("v", DT, new[1])],
            {"pos": HELD, "layer": 0}))
        self.tensor_bytes = q[0].nbytes + new[0].nbytes + new[1].nbytes
        self.set = resp_set(b"step", np.concatenate(
            [q[0].ravel(), new[0].ravel(), new[1].ravel()]).tobytes())
        self.batch = http_request(port, "POST", "/v1/sessions/_batch", self.batch_body(q, new))
        # the batch's entries as single steps, one session each
        self.singles = [http_request(port, "POST", "/v1/sessions/%s/attention" % sid, st(
            [("q", DT, q[i]), ("k", DT, new[0]), ("v", DT, new[1])], {"pos": HELD, "layer": 0}))
            for i, sid in enumerate(self.batch_sids)]
        trunc = json.dumps({"length": HELD}).encode()
        self.truncate = {sid: http_request(port, "POST", "/v1/sessions/%s/truncate" % sid, trunc,
                                           "application/json")
                         for sid in [self.step_sid] + self.batch_sids}
        self.create = {sid: http_request(port, "PUT", "/v1/sessions/" + sid, json.dumps(
            {"heads_kv": HKV, "head_dim": D, "dtype": DT, "layers": 1,
             "max_tokens": MAX_TOKENS, "ttl_s": 3600}).encode(), "application/json")
            for sid in self.truncate}
        self.prefill = {sid: http_request(port, "POST", "/v1/sessions/%s/attention" % sid, st(
            [("q", DT, q[0]), ("k", DT, k[:, :HELD]), ("v", DT, v[:, :HELD])],
            {"pos": 0, "layer": 0})) for sid in self.truncate}

    def batch_body(self, q, new):
        """q [Hq, 64, D] (entry i's query at row i), k, v [Hkv, 64, D] (the same new token
        for each entry), cu_seqlens one row an entry."""
        qb = np.concatenate(list(q), axis=1)
        kb, vb = (np.repeat(x, BATCH, axis=1) for x in new)
        cu = np.arange(BATCH + 1, dtype=np.int32)
        return st([("q", DT, qb), ("k", DT, kb), ("v", DT, vb), ("cu_seqlens_q", "I32", cu),
                   ("cu_seqlens_kv", "I32", cu)],
                  {"sessions": ",".join(self.batch_sids), "pos": ",".join([str(HELD)] * BATCH),
                   "layer": 0})


# ---- the run ------------------------------------------------------------------------------

def setup_sessions(link, req):
    for sid in req.create:
        expect(link.call(req.create[sid]), "create session " + sid, (200, 201))
        expect(link.call(req.prefill[sid]), "prefill session " + sid)


def verify(link, req, q, k, v):
    """The step and the batch once each, untimed, against the float64 reference."""
    reply = expect(link.call(req.step), "the step")
    err = check_o(reply, reference(q[0], k, v), "the session step")
    expect(link.call(req.truncate[req.step_sid]), "truncate")
    reply = expect(link.call(req.batch), "the batch")
    want = np.concatenate([reference(q[i], k, v) for i in range(BATCH)], axis=1)
    err = max(err, check_o(reply, want, "the _batch call"))
    truncate_batch(link, req)
    return err


def truncate_batch(link, req):
    for sid in req.batch_sids:
        expect(link.call(req.truncate[sid]), "truncate " + sid)


def server_timing(reply):
    """Server-Timing's compute and total, in microseconds: where the step's time goes
    inside attnd, the rest being the socket and the client."""
    head = reply[:reply.find(b"\r\n\r\n")].decode("latin-1")
    got = dict((k, float(v) * 1e3) for k, v in re.findall(r"(\w+);dur=([0-9.]+)", head))
    return got.get("compute", float("nan")), got.get("total", float("nan"))


def attnd_block(link, req, reps, t):
    for _ in range(reps):
        reply, us = link.timed(req.step)
        expect(reply, "the step")
        if not re.search(rb"(?i)\r\nx-session-length:\s*%d\r\n" % (HELD + 1),
                         reply[:reply.find(b"\r\n\r\n") + 2]):
            raise SystemExit("step.py: the step did not leave the session at %d keys: %r"
                             % (HELD + 1, reply[:400]))
        expect(link.call(req.truncate[req.step_sid]), "truncate")
        t["step"].append(us)
        compute, total = server_timing(reply)
        t["compute"].append(compute)
        t["total"].append(total)


def redis_block(link, req, reps, t):
    for _ in range(reps):
        reply, us = link.timed(req.set)
        if reply != b"+OK\r\n":
            raise SystemExit("step.py: redis SET answered %r" % reply[:200])
        t["redis"].append(us)


def batch_block(link, req, reps, t):
    for _ in range(reps):
        reply, us = link.timed(req.batch)
        expect(reply, "the _batch call")
        truncate_batch(link, req)
        t["batch"].append(us)


def singles_block(link, req, reps, t):
    """The batch's 64 entries as 64 single steps, one per session in turn: each session's
    keys as cold in cache as the batch finds them. Their sum is one sample."""
    for _ in range(reps):
        total = 0.0
        for one in req.singles:
            reply, us = link.timed(one)
            expect(reply, "a single step of a batch session")
            total += us
        truncate_batch(link, req)
        t["singles"].append(total)


def rounds(a, alink, rlink, req):
    """A warm-up round, then a.rounds rounds of attnd steps, Redis SETs and _batch
    calls, each round in the order opposite to the one before."""
    t = collections.defaultdict(list)
    blocks = [(attnd_block, alink, a.reps), (redis_block, rlink, a.reps),
              (batch_block, alink, a.batch_reps), (singles_block, alink, a.batch_reps)]
    for fn, link, reps in blocks:
        fn(link, req, max(1, reps // 2), collections.defaultdict(list))
    for r in range(a.rounds):
        for fn, link, reps in (blocks if r % 2 == 0 else blocks[::-1]):
            # the side timed last goes idle (attnd's workers stop spinning) before
            # this one starts, so that neither is timed beside the other's wake
            time.sleep(a.gap)
            fn(link, req, reps, t)
    return t


# ---- the report ---------------------------------------------------------------------------

def cpu_model():
    try:
        out = subprocess.run(["lscpu"], stdout=subprocess.PIPE, text=True).stdout
    except OSError:
        return "?"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.partition(":")[2].strip()
    return "?"


def commit():
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True).stdout.strip() or "?"
    except OSError:
        return "?"


def pct(xs, p):
    return float(np.percentile(xs, p))


def summarize(a, t, req, err, attnd, redis, load):
    s = {p: pct(t["step"], p) for p in (50, 90, 99)}
    r = {p: pct(t["redis"], p) for p in (50, 90, 99)}
    b = {p: pct(t["batch"], p) for p in (50, 90)}
    one = {p: pct(t["singles"], p) for p in (50, 90)}
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": "%s, %d CPUs" % (cpu_model(), os.cpu_count() or 0),
        "commit": commit(),
        "loadavg_1min": [round(load[0], 2), round(os.getloadavg()[0], 2)],
        "attnd": " ".join(attnd.cmd[1:]), "redis": redis.version,
        "shape": {"hq": HQ, "hkv": HKV, "d": D, "dtype": DT, "keys": HELD + 1},
        "rounds": a.rounds, "reps": a.reps, "batch_reps": a.batch_reps,
        "tensor_bytes": req.tensor_bytes, "step_request_bytes": len(req.step),
        "set_request_bytes": len(req.set), "reference_rel_err": err,
        "step_us": {"p%d" % p: s[p] for p in s}, "redis_us": {"p%d" % p: r[p] for p in r},
        "step_server_us": {"compute_p50": pct(t["compute"], 50),
                           "total_p50": pct(t["total"], 50)},
        "ratio": {"p%d" % p: s[p] / r[p] for p in s},
        "batch": {"sessions": BATCH, "p50_us": b[50], "p90_us": b[90],
                  "per_entry_us": b[50] / BATCH, "per_entry_over_step": b[50] / BATCH / s[50],
                  "singles_p50_us": one[50], "singles_p90_us": one[90],
                  "over_singles": b[50] / one[50]},
    }


def report(res):
    sh = res["shape"]
    print("attnd session decode step against Redis SET, %s, %s, commit %s"
          % (res["date"], res["machine"], res["commit"]))
    print("attnd %s; %s; load average %.2f at the start, %.2f at the end"
          % ((res["attnd"], res["redis"]) + tuple(res["loadavg_1min"])))
    print("step: Hq %d, Hkv %d, D %d, %s, one query token over %d keys (%d B of tensors, "
          "%d B request); SET of %d B (%d B request); %d rounds x %d each, alternating; "
          "o within %.1e of float64\n"
          % (sh["hq"], sh["hkv"], sh["d"], sh["dtype"], sh["keys"], res["tensor_bytes"],
             res["step_request_bytes"], res["tensor_bytes"], res["set_request_bytes"],
             res["rounds"], res["reps"], res["reference_rel_err"]))
    print("%-6s %12s %12s %12s" % ("", "p50 us", "p90 us", "p99 us"))
    for name, row, fmt in (("attnd", res["step_us"], "%12.1f"),
                           ("redis", res["redis_us"], "%12.1f"),
                           ("ratio", res["ratio"], "%11.2fx")):
        print("%-6s" % name + "".join(" " + fmt % row[p] for p in ("p50", "p90", "p99")))
    sv = res["step_server_us"]
    print("attnd's Server-Timing, p50: compute %.1f us, total %.1f us (outside total: attnd's "
          "HTTP front, the socket and the client)" % (sv["compute_p50"], sv["total_p50"]))
    b = res["batch"]
    print("\n_batch of %d sessions' one-token steps (%d rounds x %d calls):"
          % (b["sessions"], res["rounds"], res["batch_reps"]))
    print("%12s %12s %16s %22s" % ("p50 us", "p90 us", "per entry us", "per entry / step p50"))
    print("%12.1f %12.1f %16.2f %21.3fx" % (b["p50_us"], b["p90_us"], b["per_entry_us"],
                                            b["per_entry_over_step"]))
    print("the same %d entries as single steps, one per session in turn (their sum): p50 %.1f "
          "us, p90 %.1f us, %.2f us a step;\nthe _batch call / the %d single steps: %.3fx "
          "(target: well under 1)" % (b["sessions"], b["singles_p50_us"], b["singles_p90_us"],
                                      b["singles_p50_us"] / b["sessions"], b["sessions"],
                                      b["over_singles"]))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--build", default="build", help="the folder holding attnd (build)")
    ap.add_argument("--threads", type=int, default=2, help="attnd --threads (2)")
    ap.add_argument("--rounds", type=int, default=20, help="alternating rounds (20)")
    ap.add_argument("--reps", type=int, default=500,
                    help="attnd steps, and Redis SETs, a round (500)")
    ap.add_argument("--batch-reps", type=int, default=20, help="_batch calls a round (20)")
    ap.add_argument("--gap", type=float, default=0.05,
                    help="seconds idle between blocks (0.05)")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON object")
    a = ap.parse_args()
    if min(a.rounds, a.reps, a.batch_reps, a.threads) < 1:
        ap.error("--rounds, --reps, --batch-reps and --threads must be at least 1")
    return a


def run(a, servers):
    load = os.getloadavg()
    attnd = Attnd(a.build, a.threads)
    servers.append(attnd)
    redis = Redis()
    servers.append(redis)
    q, k, v = make_data()
    req = Requests(attnd.port, q, k, v)
    alink, rlink = Link(attnd.port, http_end), Link(redis.port, resp_end)
    setup_sessions(alink, req)
    err = verify(alink, req, q, k, v)
    t = rounds(a, alink, rlink, req)
    alink.close()
    rlink.close()
    return summarize(a, t, req, err, attnd, redis, load)


def main():
    a = parse_args()
    # SIGTERM unwinds as Ctrl-C does, so that both servers are stopped on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    servers = []
    try:
        res = run(a, servers)
    except KeyboardInterrupt:
        sys.exit("step.py: interrupted; attnd and redis-server stopped")
    finally:
        for s in reversed(servers):
            s.stop()
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        report(res)


if __name__ == "__main__":
    main()
