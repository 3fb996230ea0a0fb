#!/usr/bin/env python3
"""make bench-sessions: what a session (the server-held KV cache) saves a decode step.

One run, on this machine, one table (row, value, baseline, ratio, target):

  (a) bytes sent per decode step, headers and body as written to the socket: a
      session step (one q token, one k,v token, safetensors) against the stateless
      POST /attention of the same step (q and the whole K, V), at 1K, 4K, 32K keys;
  (b) a decode step's latency, client-side, loopback, safetensors: the session
      step against torch's SDPA on a preallocated [1, Hkv, 32K, D] cache (the new
      token written in place, then SDPA over the first N keys; torch in its own
      process, torch.set_num_threads = attnd's --threads) and against the stateless
      request, at 4K and 32K keys; in --rounds rounds of session, torch and
      stateless steps in turn, each side idle while the other is timed, so that a
      shared machine's other load falls on all of them alike;
  (c) decode tokens/s of 1, 8 and 64 sessions at once (each its own connection,
      stepping as fast as the server answers for --steps steps), with
      --session-batch on and off, and the same pair with --max-running-per-client 0
      (four servers started together and timed in turn, run by run), and on/off;
  (d) build/bench-peak --bandwidth: the CPU kernel's paged decode step at 32K keys
      in GB/s of K and V read, each dtype, against the machine's streaming read;
  (e) moving a session between two attnd on loopback: GET /v1/sessions/{id}/export
      from one and PUT /v1/sessions/{id}/import into the other of a 32K-token,
      8-layer session (the decode rows' Hkv, D and dtype: 1 GiB of rows), in GB/s
      of session file over the two calls' time, the median of --move-reps moves
      (the copy deleted, untimed, between them). The file is just past the default
      --max-body (1G), so both servers start with --max-body 2G.
  (f) forks (POST /v1/sessions/{id}/fork): a session of a 4K-token prompt forked 16
      ways at its full length, each fork then decoding FORK_STEPS tokens of its own, one
      a call (a beam); the session memory all 17 reserve (/v1/info's
      sessions.memory.reserved_bytes) against what the prompt's session reserved alone,
      for reserve whole and grow, and for two shapes: the GQA layer above (256 tokens a
      64 KiB page) and DeepSeek's latent decode (Hkv 1, D 576, v_from_k 512: 48 tokens a
      page). A fork's own pages are at least one per KV head (K and V) whatever it adds,
      so the ratio is about 1 + 16 / (the prompt's pages per KV head): the page size, not
      the sharing, decides whether a shape meets the target.
  (g) quantized decode at 32K keys: the (b) session step on sessions of kv_dtype
      F8_E4M3 and I8 (their rows a byte an element and a scale), timed in the same
      rounds, as tokens/s against the BF16 session's (target >= 1.7x).

The shape is a GQA decoder layer: Hq 32, Hkv 8, D 128, BF16, one query token. "N
keys" means the step attends over N keys: the session holds N - 1 and the step
appends the N-th; the stateless request carries all N. Between timed steps an
untimed truncate puts the session back at N - 1, so every step is the same work.
Latencies are medians over the rounds' steps, each row warmed up; the client is a plain
socket (no http.client), and bodies are encoded before the clock starts, on both
sides. The torch rows need the peers venv (make bench-peers makes it); without
it they say "skipped: torch not installed".

  sessions.py --build build [--threads T] [--reps N] [--rounds R] [--steps S] [--runs R]
              [--move-reps N] [--only e|f]
  sessions.py --worker torch --data DIR --threads T   (internal: "N WAY REPS" lines on stdin)
"""

import argparse
import datetime
import json
import os
import re
import resource
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
from attnd import safetensors  # noqa: E402
from attnd import bf16_to_float32, float32_to_bf16  # noqa: E402

SEED = 20261201
HQ, HKV, D = 32, 8, 128
DT = "BF16"
ES = 2  # bytes per BF16 element
MAX_KEYS = 32768
BYTES_LENGTHS = (1024, 4096, 32768)       # (a)
LATENCY_LENGTHS = (4096, 32768)           # (b)
CONCURRENCY = (1, 8, 64)                  # (c)
CONC_KEYS = 4096                          # (c): every session holds 4K keys at the start
SESSION_MEMORY = "8G"
MOVE_LAYERS = 8                           # (e): a 32K-token session of 8 layers
MOVE_MAX_BODY = "2G"                      # (e): past the 1 GiB file (the default is 1G)
FORK_PROMPT, FORKS, FORK_STEPS = 4096, 16, 8   # (f)

QUANT = ("F8_E4M3", "I8")                 # (g): kv_dtypes, at 32K keys


# ---- data ---------------------------------------------------------------------------

def make_data():
    """q [Hq, 1, D] and K, V [Hkv, 32K, D], N(0,1) rounded to BF16 (uint16 bits)."""
    rng = np.random.default_rng(SEED)
    q = float32_to_bf16(rng.standard_normal((HQ, 1, D), dtype=np.float32))
    k = float32_to_bf16(rng.standard_normal((HKV, MAX_KEYS, D), dtype=np.float32))
    v = float32_to_bf16(rng.standard_normal((HKV, MAX_KEYS, D), dtype=np.float32))
    return q, k, v


def st_body(tensors, meta=None):
    return bytes(safetensors.encode([(n, DT, np.ascontiguousarray(x)) for n, x in tensors], meta))


def o_of(body):
    t, meta = safetensors.decode(bytearray(body))
    return bf16_to_float32(t["o"]).reshape(HQ, D), meta


def rel_diff(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# ---- a plain HTTP/1.1 client: every byte it writes is counted -------------------------

class Conn:
    """One keep-alive connection; request() returns (status, headers, body, bytes sent)."""

    def __init__(self, port):
        self.port = port
        self.s = socket.create_connection(("127.0.0.1", port), timeout=600)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def head(self, method, path, body, ctype):
        h = "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % (method, path, self.port)
        if body or method in ("POST", "PUT"):
            h += "Content-Type: %s\r\nContent-Length: %d\r\n" % (ctype, len(body))
        return (h + "\r\n").encode()

    def send(self, method, path, body=b"", ctype="application/octet-stream"):
        head = self.head(method, path, body, ctype)
        if len(body) < 65536:
            self.s.sendall(head + body)
        else:  # a big body goes as it is, not copied behind its head
            self.s.sendall(head)
            self.s.sendall(body)
        return len(head) + len(body)

    def recv(self, into=None):
        """The next reply; a large body is read into the bytearray into (grown to fit, and
        then kept warm by its owner for the next reply: a fresh gigabyte costs a page fault
        per 4 KiB) and returned as a view of it."""
        while b"\r\n\r\n" not in self.buf:
            chunk = self.s.recv(1 << 20)
            if not chunk:
                raise ConnectionError("attnd closed the connection")
            self.buf += chunk
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        n = int(headers.get("content-length", "0"))
        if len(rest) >= n:
            self.buf = rest[n:]
            return status, headers, rest[:n]
        # the body read into one buffer: recv(n) would allocate n bytes a call
        data = into if into is not None else bytearray(n)
        if len(data) < n:
            data.extend(bytes(n - len(data)))
        view, have = memoryview(data)[:n], len(rest)
        view[:have] = rest
        while have < n:
            got = self.s.recv_into(view[have:])
            if not got:
                raise ConnectionError("attnd closed the connection")
            have += got
        self.buf = b""
        return status, headers, view if into is not None else data

    def request(self, method, path, body=b"", ctype="application/octet-stream", want=None,
                into=None):
        sent = self.send(method, path, body, ctype)
        status, headers, data = self.recv(into)
        if want is not None and status not in want:
            raise RuntimeError("%s %s: HTTP %d: %s" % (method, path, status, data[:300]))
        return status, headers, data, sent

    def close(self):
        self.s.close()


def server_timing(headers):
    """Server-Timing's parts in ms: queue, compute (decode + engine + encode), total."""
    out = {}
    for part in headers.get("server-timing", "").split(","):
        m = re.match(r"\s*(\w+);dur=([0-9.]+)", part)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


# ---- attnd --------------------------------------------------------------------------

class Attnd:
    def __init__(self, build, threads, batch, extra=()):
        cmd = [os.path.join(build, "attnd"), "--listen", "127.0.0.1:0", "--threads",
               str(threads), "--session-memory", SESSION_MEMORY, "--session-batch", batch,
               *extra]
        self.cmd = " ".join(cmd[1:])
        self.p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        self.banner = ""
        line = self.p.stderr.readline()
        while "listening on" not in line:
            if not line:
                sys.exit("sessions.py: attnd did not start: %s" % " ".join(cmd))
            line = self.p.stderr.readline()
        self.banner = line.strip()
        self.port = int(re.search(r"127\.0\.0\.1:(\d+)", line).group(1))
        threading.Thread(target=self.p.stderr.read, daemon=True).start()
        deadline = time.time() + 30
        while True:
            try:
                c = Conn(self.port)
                st = c.request("GET", "/readyz")[0]
                c.close()
                if st == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                self.stop()
                sys.exit("sessions.py: attnd's /readyz never said 200")
            time.sleep(0.05)

    def metrics(self):
        c = Conn(self.port)
        _, _, data, _ = c.request("GET", "/metrics", want=(200,))
        c.close()
        out = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.rpartition(" ")
                out[k] = float(v)
        return out

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def create(c, sid, max_tokens, kv_dtype=None):
    doc = {"heads_kv": HKV, "head_dim": D, "dtype": DT, "layers": 1, "max_tokens": max_tokens,
           "ttl_s": 3600}
    if kv_dtype:
        doc["kv_dtype"] = kv_dtype
    body = json.dumps(doc).encode()
    c.request("PUT", "/v1/sessions/" + sid, body, "application/json", want=(200, 201))


def prefill(c, sid, q, k, v, n, chunk=8192):
    """Appends tokens [0, n) of k, v to a new session, in calls of `chunk` tokens."""
    for p in range(0, n, chunk):
        e = min(n, p + chunk)
        body = st_body([("q", q), ("k", k[:, p:e]), ("v", v[:, p:e])], {"pos": str(p)})
        c.request("POST", "/v1/sessions/%s/attention" % sid, body, want=(200,))


def truncate(c, sid, n):
    c.request("POST", "/v1/sessions/%s/truncate" % sid, json.dumps({"length": n}).encode(),
              "application/json", want=(200,))


def step_body(q, k, v, pos):
    """The session step appending token pos (one q token, one k, v token)."""
    return st_body([("q", q), ("k", k[:, pos:pos + 1]), ("v", v[:, pos:pos + 1])],
                   {"pos": str(pos)})


def stateless_body(q, k, v, n):
    """POST /attention for the same step: q [1, Hq, 1, D] and all n keys [1, Hkv, n, D]."""
    return st_body([("q", q[None]), ("k", k[None, :, :n]), ("v", v[None, :, :n])])


def session_steps(c, sid, q, k, v, n, reps):
    """reps session steps at n keys (warm-up first), each followed by an untimed
    truncate back to n - 1: per-step wall times (s), Server-Timing parts, the
    last reply's o and its bytes sent and received."""
    body = step_body(q, k, v, n - 1)
    path = "/v1/sessions/%s/attention" % sid
    wall, timing = [], []
    for i in range(reps + 1):
        t0 = time.perf_counter()
        st, h, data, sent = c.request("POST", path, body, want=(200,))
        dt = time.perf_counter() - t0
        if int(h.get("x-session-length", "-1")) != n:
            raise RuntimeError("session %s: length %s after a step, not %d"
                               % (sid, h.get("x-session-length"), n))
        truncate(c, sid, n - 1)
        if i:
            wall.append(dt)
            timing.append(server_timing(h))
    return wall, timing, o_of(data)[0], sent, len(data)


def stateless_steps(c, q, k, v, n, reps):
    body = stateless_body(q, k, v, n)
    wall, timing = [], []
    for i in range(reps + 1):
        t0 = time.perf_counter()
        st, h, data, sent = c.request("POST", "/attention", body, want=(200,))
        dt = time.perf_counter() - t0
        if i:
            wall.append(dt)
            timing.append(server_timing(h))
    o = bf16_to_float32(safetensors.decode(bytearray(data))[0]["o"]).reshape(HQ, D)
    return wall, timing, o, sent


def sink_floor(build, body, reps):
    """The same upload into build/bench-http-sink (recv() into a touched buffer, then
    200 and close: no server that reads the body is faster on this socket), timed
    as the stateless request is, from the first byte sent to the reply's last, on a
    connection opened beforehand: the median of reps, or None without the sink."""
    exe = os.path.join(build, "bench-http-sink")
    if not os.access(exe, os.X_OK):
        return None
    p = subprocess.Popen([exe, "0", str(len(body) // (1 << 20) + 16)], stdout=subprocess.PIPE,
                         text=True)
    try:
        line = p.stdout.readline()
        m = re.search(r":(\d+)", line)
        if not m:
            return None
        port, t = int(m.group(1)), []
        for i in range(reps + 1):
            c = Conn(port)
            t0 = time.perf_counter()
            c.request("POST", "/attention", body, want=(200,))
            if i:
                t.append(time.perf_counter() - t0)
            c.close()
        return med(t)
    finally:
        p.terminate()
        p.wait()


def med(xs):
    return float(np.median(xs))


def med_part(timing, key):
    vals = [t[key] for t in timing if key in t]
    return med(vals) if vals else float("nan")


# ---- (c): many sessions at once, one event loop ---------------------------------------

def concurrent_run(port, sids, bodies, pos0):
    """Every session steps as soon as its last step is answered, len(bodies[i])
    steps each, from one thread (non-blocking sockets, a selector): tokens/s over
    the whole run, and the client's own CPU seconds in it."""
    sel = selectors.DefaultSelector()
    conns = []
    for i, sid in enumerate(sids):
        c = Conn(port)
        c.s.setblocking(False)
        conns.append(dict(c=c, i=i, step=0, path="/v1/sessions/%s/attention" % sid, buf=b""))
    done = 0
    total = sum(len(b) for b in bodies)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()

    def send(st):
        body = bodies[st["i"]][st["step"]]
        st["c"].s.setblocking(True)
        st["c"].send("POST", st["path"], body)
        st["c"].s.setblocking(False)

    for st in conns:
        send(st)
        sel.register(st["c"].s, selectors.EVENT_READ, st)
    while done < total:
        for key, _ in sel.select():
            st = key.data
            try:
                chunk = st["c"].s.recv(1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                raise ConnectionError("attnd closed a session's connection")
            st["buf"] += chunk
            buf = st["buf"]
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                continue
            m = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", buf[:end])
            n = int(m.group(1)) if m else 0
            if len(buf) < end + 4 + n:
                continue
            status = int(buf[9:12])
            if status != 200:
                raise RuntimeError("session step: HTTP %d: %s" % (status, buf[end + 4:][:300]))
            st["buf"] = buf[end + 4 + n:]
            st["step"] += 1
            done += 1
            if st["step"] < len(bodies[st["i"]]):
                send(st)
            else:
                sel.unregister(st["c"].s)
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    for st in conns:
        st["c"].close()
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return total / wall, cpu / wall


# (c)'s servers: --session-batch on and off with the defaults, then the same
# pair with --max-running-per-client 0 (every running slot open to one client
# address: all the sessions here come from 127.0.0.1).
CONC_CONFIGS = (("on", ()), ("off", ()),
                ("on", ("--max-running-per-client", "0")),
                ("off", ("--max-running-per-client", "0")))


def concurrency(build, threads, q, k, v, steps, runs):
    """tokens/s of each count of sessions in CONCURRENCY, per server of
    CONC_CONFIGS (all started at once, idle but for the one being timed, and
    timed in turn, run by run, so that the machine's other load falls on each
    alike): the median of `runs` runs, the server's mean session calls per
    engine job and the client's CPU share."""
    servers = []
    out = [dict(batch=b, extra=" ".join(x)) for b, x in CONC_CONFIGS]
    try:
        n = max(CONCURRENCY)
        sids = ["c%02d" % i for i in range(n)]
        for b, x in CONC_CONFIGS:
            srv = Attnd(build, threads, b, x)
            servers.append(srv)
            print("  (c) %s: %d sessions, prefill ..." % (srv.cmd, n), file=sys.stderr,
                  flush=True)
            c = Conn(srv.port)
            for sid in sids:
                create(c, sid, CONC_KEYS + steps)
                prefill(c, sid, q, k, v, CONC_KEYS)
            c.close()
        # step j of every session appends token CONC_KEYS + j (the same values
        # for each session: the work, not the numbers, is what is timed)
        bodies = [step_body(q, k, v, CONC_KEYS + j) for j in range(steps)]
        for m in CONCURRENCY:
            cells = [dict(rates=[], cpus=[], batches=[]) for _ in servers]
            for _ in range(runs):
                for srv, cell in zip(servers, cells):
                    c = Conn(srv.port)  # a new one: an idle one is closed after --idle-timeout
                    for sid in sids[:m]:
                        truncate(c, sid, CONC_KEYS)
                    c.close()
                    m0 = srv.metrics()
                    rate, cpu = concurrent_run(srv.port, sids[:m], [bodies] * m, CONC_KEYS)
                    m1 = srv.metrics()
                    jobs = m1.get("attnd_session_batch_size_count", 0) - \
                        m0.get("attnd_session_batch_size_count", 0)
                    calls = m1.get("attnd_session_batch_size_sum", 0) - \
                        m0.get("attnd_session_batch_size_sum", 0)
                    cell["rates"].append(rate)
                    cell["cpus"].append(cpu)
                    cell["batches"].append(calls / jobs if jobs else float("nan"))
            for o, cell in zip(out, cells):
                o[m] = dict(rate=med(cell["rates"]), client_cpu=med(cell["cpus"]),
                            batch=med(cell["batches"]), rates=cell["rates"])
                print("  (c) --session-batch %s%s, %d session(s): %s tokens/s"
                      % (o["batch"], " " + o["extra"] if o["extra"] else "", m,
                         ", ".join("%.0f" % r for r in cell["rates"])),
                      file=sys.stderr, flush=True)
    finally:
        for srv in servers:
            srv.stop()
    return out


# ---- torch, in its own process ---------------------------------------------------------

def torch_python(build):
    """The peers venv's interpreter when it imports torch, else None."""
    py = os.path.join(build, "peers-venv", "bin", "python")
    if not os.access(py, os.X_OK):
        return None
    p = subprocess.run([py, "-c", "import torch"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    return py if p.returncode == 0 else None


def torch_worker(a):
    """Decode steps on a preallocated [1, Hkv, 32K, D] BF16 cache: the new token
    written in place at N - 1, then SDPA of the one query over the first N keys;
    two ways of GQA: enable_gqa (or repeat_interleave on a torch without it), and
    q folded to [1, Hkv, Hq/Hkv, D] (the same product without the head broadcast).
    A server of the driver: each stdin line "N WAY REPS" runs a warm-up and REPS
    timed steps and answers one JSON line of their times (saving o once per N and
    WAY), so that the driver can interleave torch's steps with attnd's."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(a.threads)

    def bf16(name):
        x = np.load(os.path.join(a.data, name + ".npy"))
        return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)

    q = bf16("q").reshape(1, HQ, 1, D)
    kc = bf16("k").reshape(1, HKV, MAX_KEYS, D).clone()  # the preallocated cache
    vc = bf16("v").reshape(1, HKV, MAX_KEYS, D).clone()
    g = HQ // HKV
    native = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")

    def step(n, way):
        k_new, v_new = kc[:, :, n - 1:n].clone(), vc[:, :, n - 1:n].clone()

        def gqa():
            kc[:, :, n - 1:n] = k_new
            vc[:, :, n - 1:n] = v_new
            if native:
                return F.scaled_dot_product_attention(q, kc[:, :, :n], vc[:, :, :n],
                                                      enable_gqa=True)
            return F.scaled_dot_product_attention(q, kc[:, :, :n].repeat_interleave(g, 1),
                                                  vc[:, :, :n].repeat_interleave(g, 1))

        def folded():
            kc[:, :, n - 1:n] = k_new
            vc[:, :, n - 1:n] = v_new
            return F.scaled_dot_product_attention(q.view(1, HKV, g, D), kc[:, :, :n],
                                                  vc[:, :, :n]).view(1, HQ, 1, D)
        return gqa if way == "gqa" else folded

    print(json.dumps({"version": torch.__version__, "threads": torch.get_num_threads(),
                      "gqa": "enable_gqa" if native else "repeat_interleave"}), flush=True)
    saved = set()
    with torch.inference_mode():
        for line in sys.stdin:
            n, way, reps = line.split()
            n, reps = int(n), int(reps)
            fn = step(n, way)
            o = fn()
            t = []
            for _ in range(reps):
                t0 = time.perf_counter()
                o = fn()
                t.append(time.perf_counter() - t0)
            if (n, way) not in saved:
                np.save(os.path.join(a.data, "o_torch_%s_%d.npy" % (way, n)),
                        o.float().reshape(HQ, D).numpy())
                saved.add((n, way))
            print(json.dumps({"times": t}), flush=True)


class Torch:
    """The torch worker, kept running; idle (reading stdin) while attnd is timed."""

    def __init__(self, py, data, threads):
        self.data = data
        self.p = subprocess.Popen([py, os.path.abspath(__file__), "--worker", "torch", "--data",
                                   data, "--threads", str(threads)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        self.info = json.loads(self.readline())

    def readline(self):
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("the torch worker ended (exit %s)" % self.p.wait())
        return line

    def steps(self, n, way, reps):
        self.p.stdin.write("%d %s %d\n" % (n, way, reps))
        self.p.stdin.flush()
        return json.loads(self.readline())["times"]

    def o(self, n, way):
        return np.load(os.path.join(self.data, "o_torch_%s_%d.npy" % (way, n)))

    def stop(self):
        self.p.stdin.close()
        self.p.wait()


# ---- (e): a session moved between two servers -----------------------------------------

def move_session(build, threads, q, k, v, reps):
    """(e): the median over reps of a GET export from one server plus a PUT import into
    the other, with the two calls' medians apart; the file's bytes; the servers' flags."""
    a_srv = Attnd(build, threads, "on", ("--max-body", MOVE_MAX_BODY))
    b_srv = Attnd(build, threads, "on", ("--max-body", MOVE_MAX_BODY))
    try:
        ca = Conn(a_srv.port)
        body = json.dumps({"heads_kv": HKV, "head_dim": D, "dtype": DT, "layers": MOVE_LAYERS,
                           "max_tokens": MAX_KEYS, "ttl_s": 3600}).encode()
        ca.request("PUT", "/v1/sessions/move", body, "application/json", want=(201,))
        for layer in range(MOVE_LAYERS):
            print("  (e) prefill layer %d/%d ..." % (layer + 1, MOVE_LAYERS), file=sys.stderr,
                  flush=True)
            for p in range(0, MAX_KEYS, 8192):
                b = st_body([("q", q), ("k", k[:, p:p + 8192]), ("v", v[:, p:p + 8192])],
                            {"pos": str(p), "layer": str(layer)})
                ca.request("POST", "/v1/sessions/move/attention", b, want=(200,))
        cb = Conn(b_srv.port)  # now: one idle through the prefill would be closed
        gets, puts, f, warm = [], [], None, bytearray()
        for i in range(reps + 1):
            t0 = time.perf_counter()
            f = ca.request("GET", "/v1/sessions/move/export", want=(200,), into=warm)[2]
            t1 = time.perf_counter()
            cb.request("PUT", "/v1/sessions/move/import", f, want=(201,))
            t2 = time.perf_counter()
            if i:  # the first move warms both servers' body buffers and pages, and ours
                gets.append(t1 - t0)
                puts.append(t2 - t1)
            if i < reps:
                cb.request("DELETE", "/v1/sessions/move", want=(204,))
        if cb.request("GET", "/v1/sessions/move/export", want=(200,))[2] != f:
            raise RuntimeError("(e): the imported session's export is not the exported file")
        ca.close()
        cb.close()
        return [g + p for g, p in zip(gets, puts)], gets, puts, len(f), a_srv.cmd
    finally:
        a_srv.stop()
        b_srv.stop()


def move_row(a, threads, table, notes):
    q, k, v = make_data()
    total, gets, puts, nbytes, cmd = move_session(a.build, threads, q, k, v, a.move_reps)
    gbps = nbytes / med(total) * 1e-9
    table.add("(e) session move, 32K tokens x %d layers: GET export + PUT import" % MOVE_LAYERS,
              "%.2f GB/s" % gbps, "%.2f s" % med(total), "", ">= 1 GB/s", gbps >= 1)
    notes.append("(e) a %d-byte session file (Hkv %d, D %d, %s, %d layers of 32K tokens); "
                 "median of %d moves: GET export %.3f s (%.2f GB/s), PUT import %.3f s "
                 "(%.2f GB/s), together %.3f s; the import's export equals the file byte for "
                 "byte; both servers: %s"
                 % (nbytes, HKV, D, DT, MOVE_LAYERS, len(total), med(gets),
                    nbytes / med(gets) * 1e-9, med(puts), nbytes / med(puts) * 1e-9,
                    med(total), cmd))


# ---- (f) forks ----------------------------------------------------------------------

# (name, Hq, Hkv, D, v_from_k or None, attnd's --session-page-bytes in KiB): the tokens a page
# holds follow from D (BF16) and the page size. The GQA shape runs at the default 64 KiB pages
# (256 tokens) and at 16 KiB (64 tokens), the one that meets the target; the latent shape's
# 1152-byte rows need 32 KiB pages or more, and run at the default.
FORK_SHAPES = (("GQA Hkv 8, D 128", HQ, HKV, D, None, 64),
               ("GQA Hkv 8, D 128", HQ, HKV, D, None, 16),
               ("latent Hkv 1, D 576, Dv 512", 16, 1, 576, 512, 64))


def page_tokens(d, page_kib):
    """The tokens a page of page_kib KiB holds of BF16 rows of d (the store's rule: a multiple
    of 64 where 64 fit, else of 16)."""
    n = (page_kib << 10) // (d * ES)
    step = 64 if n >= 64 else 16
    return n // step * step


def memory_of(c):
    _, _, data, _ = c.request("GET", "/v1/info", want=(200,))
    return json.loads(data)["sessions"]["memory"]


def fork_beam(c, shape, reserve):
    """One (f) row's numbers: the prompt's session alone, then with its 16 forks after
    their decodes; the bytes reserved and used, and the forks' shared bytes."""
    _, hq, hkv, d, latent, _ = shape
    rng = np.random.default_rng(SEED + d)
    n = FORK_PROMPT + FORK_STEPS
    q = float32_to_bf16(rng.standard_normal((hq, 1, d), dtype=np.float32))
    k = float32_to_bf16(rng.standard_normal((hkv, n, d), dtype=np.float32))
    v = None if latent else float32_to_bf16(rng.standard_normal((hkv, n, d), dtype=np.float32))
    doc = {"heads_kv": hkv, "head_dim": d, "dtype": DT, "max_tokens": n, "ttl_s": 3600,
           "reserve": reserve}
    if latent:
        doc["v_from_k"] = latent
    c.request("PUT", "/v1/sessions/prompt", json.dumps(doc).encode(), "application/json",
              want=(201,))
    for p in range(0, FORK_PROMPT, 1024):
        t = [("q", q), ("k", k[:, p:p + 1024])] + ([] if latent else [("v", v[:, p:p + 1024])])
        c.request("POST", "/v1/sessions/prompt/attention", st_body(t, {"pos": str(p)}),
                  want=(200,))
    alone = memory_of(c)
    ids = ["beam%d" % i for i in range(FORKS)]
    for sid in ids:
        c.request("POST", "/v1/sessions/prompt/fork", json.dumps({"id": sid}).encode(),
                  "application/json", want=(201,))
    for pos in range(FORK_PROMPT, n):
        for i, sid in enumerate(ids):  # each beam its own token: a divergent history
            row = rng.standard_normal((hkv, 1, d), dtype=np.float32) + i
            t = [("q", q), ("k", float32_to_bf16(row))]
            if not latent:
                t.append(("v", float32_to_bf16(row)))
            c.request("POST", "/v1/sessions/%s/attention" % sid, st_body(t, {"pos": str(pos)}),
                      want=(200,))
    beam = memory_of(c)
    for sid in ["prompt"] + ids:
        c.request("DELETE", "/v1/sessions/" + sid, want=(204,))
    return alone, beam


def forks(build, threads, table, notes):
    for page_kib in sorted({s[5] for s in FORK_SHAPES}, reverse=True):
        srv = Attnd(build, threads, "on", ("--session-page-bytes", "%dK" % page_kib))
        try:
            c = Conn(srv.port)
            for shape in (s for s in FORK_SHAPES if s[5] == page_kib):
                fork_rows(c, shape, table, notes)
            c.close()
        finally:
            srv.stop()
    notes.append("(f) without sharing the 17 sessions would reserve 17x one's; with it each fork "
                 "adds at least its first new page per KV head, K and V (the copy of the "
                 "partial page, or a fresh one at a page's end): 1 / (the prompt's pages per "
                 "head) of the prompt's, 1/16 with 256 tokens a page (64 KiB pages, the "
                 "default), 1/64 with 64 (attnd --session-page-bytes 16K), 1/86 with 48; the "
                 "target is for the small pages' row")


def fork_rows(c, shape, table, notes):
    """Row (f) of one shape at the page size its server runs, whole and grow."""
    name, d, page_kib = shape[0], shape[3], shape[5]
    pt = page_tokens(d, page_kib)
    for reserve in ("whole", "grow"):
        print("  (f) %s, %d KiB pages, %s: prompt, %d forks ..." % (name, page_kib, reserve, FORKS),
              file=sys.stderr, flush=True)
        alone, beam = fork_beam(c, shape, reserve)
        r = beam["reserved_bytes"] / alone["reserved_bytes"]
        small = page_kib < 64 or shape[4] is not None
        table.add("(f) %d forks of a %s-token session (at its length, each then %d decode "
                  "steps), %s, %d KiB pages, %s: reserved / one session's"
                  % (FORKS, keys(FORK_PROMPT), FORK_STEPS, name, page_kib, reserve),
                  kib(beam["reserved_bytes"]), kib(alone["reserved_bytes"]), "%.2f" % r,
                  "<= 1.25" if small else "", (r <= 1.25) if small else None)
        notes.append("(f) %s, %d KiB pages (%d tokens a page), reserve %s: the prompt alone "
                     "reserves %s and uses %s; with its %d forks after %d decode steps each, %s "
                     "reserved, %s used (%.2fx), %s in pages held by more than one, %s saved by "
                     "sharing"
                     % (name, page_kib, pt, reserve, kib(alone["reserved_bytes"]),
                        kib(alone["used_bytes"]), FORKS, FORK_STEPS, kib(beam["reserved_bytes"]),
                        kib(beam["used_bytes"]), beam["used_bytes"] / alone["used_bytes"],
                        kib(beam["shared_bytes"]), kib(beam["saved_bytes"])))


# ---- the report ------------------------------------------------------------------------

def st_sent_of(stateless, n):
    return stateless[n][3]


def cpu_model():
    """lscpu's model name, with family and model (a hypervisor often shortens the name)."""
    try:
        out = subprocess.run(["lscpu"], stdout=subprocess.PIPE, text=True).stdout
        f = dict((k.strip(), v.strip()) for k, _, v in
                 (line.partition(":") for line in out.splitlines()))
        return "%s (family %s, model %s)" % (f.get("Model name", "?"), f.get("CPU family", "?"),
                                             f.get("Model", "?"))
    except OSError:
        return "?"


def kib(n):
    return "%.1f KiB" % (n / 1024) if n < 1 << 20 else "%.1f MiB" % (n / (1 << 20))


def ms(s):
    return "%.2f ms" % (s * 1e3)


def keys(n):
    return "%dK" % (n // 1024)


class Table:
    def __init__(self):
        self.rows = []
        self.misses = []

    def add(self, name, value, baseline, ratio, target="", met=None):
        mark = "" if met is None else (" ok" if met else " MISSED")
        if met is False:
            self.misses.append(name)
        self.rows.append((name, value, baseline, ratio, target + mark))

    def print(self):
        hdr = ("row", "value", "baseline", "ratio", "target")
        w = [max(len(str(r[i])) for r in self.rows + [hdr]) for i in range(5)]
        fmt = "%-*s | %*s | %*s | %*s | %-*s"
        line = fmt % (w[0], hdr[0], w[1], hdr[1], w[2], hdr[2], w[3], hdr[3], w[4], hdr[4])
        print(line)
        print("-" * len(line))
        for r in self.rows:
            print(fmt % (w[0], r[0], w[1], r[1], w[2], r[2], w[3], r[3], w[4], r[4]))


def forks_only(a):
    table, notes = Table(), []
    forks(a.build, a.threads, table, notes)
    table.print()
    print()
    for n in notes:
        print(n)
    if table.misses:
        print("missed: " + "; ".join(table.misses))


def main_driver(a):
    threads = a.threads
    t_start = datetime.datetime.now(datetime.timezone.utc)
    print("attnd sessions benchmark, %s, %s, %d threads (attnd --threads, "
          "torch.set_num_threads, bench-peak --threads)"
          % (t_start.strftime("%Y-%m-%d %H:%M UTC"), cpu_model(), threads))
    print("decode step: Hq %d, Hkv %d, D %d, %s, one query token; safetensors bodies; "
          "loopback; (b) medians of %d rounds x %d steps (stateless %d), interleaved"
          % (HQ, HKV, D, DT, a.rounds, a.reps, max(2, a.reps // 3)))
    load0 = os.getloadavg()[0]
    sys.stdout.flush()
    table = Table()
    notes = []
    if a.only == "e":
        move_row(a, threads, table, notes)
        print()
        table.print()
        print()
        for n in notes:
            print(n)
        return

    # (d) first, alone on the machine: the kernel in process and the stream read
    print("  (d) bench-peak --bandwidth ...", file=sys.stderr, flush=True)
    peak_cmd = [os.path.join(a.build, "bench-peak"), "--threads", str(threads), "--bandwidth"]
    peak_line = subprocess.run(peak_cmd, stdout=subprocess.PIPE, text=True,
                               check=True).stdout.strip().splitlines()[-1]
    peak = json.loads(peak_line)

    print("  data: q, K, V at 32K keys ...", file=sys.stderr, flush=True)
    q, k, v = make_data()

    # (a) and (b): attnd (batching on, the default) and the torch worker side by
    # side, each idle while the other is timed; (b) in ROUNDS rounds of session,
    # torch and stateless steps in turn, so that the shared machine's other load
    # falls on all of them alike. Medians over every round's steps.
    py = torch_python(a.build)
    tor = None
    with tempfile.TemporaryDirectory(dir=a.build, prefix="sessions-") as tmp:
        if py:
            print("  (b) torch worker: the cache ...", file=sys.stderr, flush=True)
            for name, x in (("q", q), ("k", k), ("v", v)):
                np.save(os.path.join(tmp, name + ".npy"), x)
            tor = Torch(py, tmp, threads)
        srv = Attnd(a.build, threads, "on")
        try:
            c = Conn(srv.port)
            sess, stateless, floors = {}, {}, {}
            tsteps = {(n, w): [] for n in LATENCY_LENGTHS for w in ("gqa", "folded")}
            for n in sorted(set(BYTES_LENGTHS) | set(LATENCY_LENGTHS)):
                print("  (a, b) session at %s keys: prefill ..." % keys(n), file=sys.stderr,
                      flush=True)
                create(c, "step%d" % n, n)
                prefill(c, "step%d" % n, q, k, v, n - 1)
            qsess = {}
            for kd in QUANT:
                print("  (g) %s session at 32K keys: prefill ..." % kd, file=sys.stderr,
                      flush=True)
                create(c, "q" + kd, MAX_KEYS, kd)
                prefill(c, "q" + kd, q, k, v, MAX_KEYS - 1)
            for n in BYTES_LENGTHS:
                if n not in LATENCY_LENGTHS:
                    sess[n] = session_steps(c, "step%d" % n, q, k, v, n, 3)
                    stateless[n] = stateless_steps(c, q, k, v, n, 1)
            st_reps = max(2, a.reps // 3)
            for rnd in range(a.rounds):
                for n in LATENCY_LENGTHS:
                    print("  (b) round %d/%d, %s keys: session, torch, stateless ..."
                          % (rnd + 1, a.rounds, keys(n)), file=sys.stderr, flush=True)
                    r = session_steps(c, "step%d" % n, q, k, v, n, a.reps)
                    if n in sess:
                        sess[n][0].extend(r[0])
                        sess[n][1].extend(r[1])
                    else:
                        sess[n] = r
                    for kd in QUANT if n == MAX_KEYS else ():
                        r = session_steps(c, "q" + kd, q, k, v, n, a.reps)
                        if kd in qsess:
                            qsess[kd][0].extend(r[0])
                        else:
                            qsess[kd] = r
                    if tor:
                        time.sleep(0.2)  # attnd's workers asleep before torch's start
                        for w in ("gqa", "folded"):
                            tsteps[(n, w)].extend(tor.steps(n, w, a.reps))
                        time.sleep(0.2)  # and torch's OpenMP threads done spinning
                    r = stateless_steps(c, q, k, v, n, st_reps)
                    if n in stateless:
                        stateless[n][0].extend(r[0])
                        stateless[n][1].extend(r[1])
                    else:
                        stateless[n] = r
            for n in LATENCY_LENGTHS:
                floors[n] = sink_floor(a.build, stateless_body(q, k, v, n), st_reps)
            c.close()
            srv_cmd, banner = srv.cmd, srv.banner
        finally:
            srv.stop()
            if tor:
                tor.stop()
        tres = None
        if tor:
            tres = dict(tor.info, rows={})
            for n in LATENCY_LENGTHS:
                tres["rows"][str(n)] = {w: med(tsteps[(n, w)]) for w in ("gqa", "folded")}
                for w in ("gqa", "folded"):
                    tres["rows"][str(n)]["o_" + w] = tor.o(n, w)

    # (a)
    for n in BYTES_LENGTHS:
        s_sent, st_sent = sess[n][3], stateless[n][3]
        r = st_sent / s_sent
        target, met = (">= 100x fewer", r >= 100) if n == 4096 else ("", None)
        table.add("(a) bytes sent per step, %s keys: session / stateless" % keys(n),
                  "%d B" % s_sent, "%d B" % st_sent, "%.0fx fewer" % r, target, met)
    notes.append("(a) bytes: request line + headers + body as written to the socket; a "
                 "session step's reply is %d B of safetensors body (o) plus headers"
                 % sess[4096][4])

    # (b)
    for n in LATENCY_LENGTHS:
        s_wall, s_tim, s_o = sess[n][0], sess[n][1], sess[n][2]
        st_wall, st_tim, st_o = stateless[n][0], stateless[n][1], stateless[n][2]
        s_med, st_med = med(s_wall), med(st_wall)
        if tres:
            row = tres["rows"][str(n)]
            t_med = row["gqa"]
            table.add("(b) step latency, %s keys: session / torch SDPA (%s)" % (keys(n),
                                                                             tres["gqa"]),
                      ms(s_med), ms(t_med), "%.2fx torch's time" % (s_med / t_med),
                      "<= 1.3x", s_med / t_med <= 1.3)
            table.add("(b) step latency, %s keys: session / torch SDPA (q folded)" % keys(n),
                      ms(s_med), ms(row["folded"]), "%.2fx torch's time"
                      % (s_med / row["folded"]), "", None)
            notes.append("(b) %s keys: |o_session - o_torch| / |o_torch| = %.1e (enable_gqa), "
                         "%.1e (folded)" % (keys(n), rel_diff(s_o, row["o_gqa"]),
                                            rel_diff(s_o, row["o_folded"])))
        else:
            table.add("(b) step latency, %s keys: session / torch SDPA" % keys(n),
                      ms(s_med), "skipped: torch not installed", "-", "<= 1.3x", None)
        target, met = ("session >= 10x faster", st_med / s_med >= 10) if n == 32768 else \
            ("", None)
        table.add("(b) step latency, %s keys: session / stateless" % keys(n), ms(s_med),
                  ms(st_med), "%.1fx faster" % (st_med / s_med), target, met)
        kv = 2 * HKV * n * D * ES
        best = min(t["compute"] for t in s_tim if "compute" in t)
        notes.append("(b) %s keys, session step: client %s = server total %.2f ms (queue %.3f, "
                     "compute %.2f: body decode + append + engine + encode) + %.2f ms outside "
                     "the server (client, loopback, HTTP head); compute reads K, V (%s) at "
                     "%.1f GB/s (median), %.1f GB/s (best step, %.2f ms)"
                     % (keys(n), ms(s_med), med_part(s_tim, "total"), med_part(s_tim, "queue"),
                        med_part(s_tim, "compute"), s_med * 1e3 - med_part(s_tim, "total"),
                        kib(kv), kv / (med_part(s_tim, "compute") * 1e-3) * 1e-9,
                        kv / (best * 1e-3) * 1e-9, best))
        notes.append("(b) %s keys, stateless: client %s = server total %.1f ms (compute %.1f) "
                     "+ %.1f ms outside; |o_session - o_stateless| / |o_stateless| = %.1e"
                     % (keys(n), ms(st_med), med_part(st_tim, "total"),
                        med_part(st_tim, "compute"), st_med * 1e3 - med_part(st_tim, "total"),
                        rel_diff(s_o, st_o)))
        if floors.get(n):
            notes.append("(b) %s keys, stateless floor: the same %s upload into bench-http-sink "
                         "takes %s; a server as fast as that floor, plus the session step's "
                         "compute, would take %s: %.1fx the session step (the most a perfect "
                         "HTTP front leaves on this machine's loopback)"
                         % (keys(n), kib(st_sent_of(stateless, n)), ms(floors[n]),
                            ms(floors[n] + med_part(s_tim, "compute") * 1e-3),
                            (floors[n] + med_part(s_tim, "compute") * 1e-3) / s_med))

    # (c)
    conc = concurrency(a.build, threads, q, k, v, a.steps, a.runs)
    for i in (0, 2):
        on, off = conc[i], conc[i + 1]
        for m in CONCURRENCY:
            if i and m == 1:
                continue  # one connection: the per-client cap never binds
            name = "(c) decode tokens/s, %d session(s), %s keys%s: batch on / off" % (
                m, keys(CONC_KEYS), ", " + on["extra"] if on["extra"] else "")
            table.add(name, "%.0f" % on[m]["rate"], "%.0f" % off[m]["rate"],
                      "%.2fx" % (on[m]["rate"] / off[m]["rate"]))
    notes.append("(c) each session its own connection, %s keys held at the start, %d steps "
                 "each (one layer, one token a step), median of %d runs, the servers timed in "
                 "turn; the client is one thread on the same CPUs, using %s of a core "
                 "(batch on, 1/8/64 sessions)"
                 % (keys(CONC_KEYS), a.steps, a.runs,
                    "/".join("%.0f%%" % (100 * conc[0][m]["client_cpu"]) for m in CONCURRENCY)))
    step_kv = 2 * HKV * (CONC_KEYS + a.steps // 2) * D * ES  # K, V a step reads, on average
    kern = peak.get("paged_decode_BF16", {}).get("gbps")
    notes.append("(c) K, V read by all sessions together (tokens/s x %s a step): %s GB/s "
                 "(batch on, 1/8/64 sessions), %s GB/s --max-running-per-client 0; the CPU "
                 "kernel alone reads %s GB/s (d, BF16)"
                 % (kib(step_kv),
                    "/".join("%.1f" % (conc[0][m]["rate"] * step_kv * 1e-9) for m in CONCURRENCY),
                    "/".join("%.1f" % (conc[2][m]["rate"] * step_kv * 1e-9)
                             for m in CONCURRENCY[1:]),
                    "%.1f" % kern if kern else "?"))
    for o in conc:
        notes.append("(c) session calls per engine job (attnd_session_batch_size sum/count), "
                     "--session-batch %s%s: %s (1/8/64 sessions)"
                     % (o["batch"], " " + o["extra"] if o["extra"] else "",
                        "/".join("%.2f" % o[m]["batch"] for m in CONCURRENCY)))

    # (d)
    stream = peak.get("stream_read", {}).get("gbps")
    for dt in ("F32", "F16", "BF16"):
        r = peak.get("paged_decode_" + dt, {})
        if "gbps" in r and stream:
            table.add("(d) CPU decode kernel, 32K keys, %s: K+V read / stream read" % dt,
                      "%.1f GB/s" % r["gbps"], "%.1f GB/s" % stream, "%.2f" % r["of_stream"])
        else:
            table.add("(d) CPU decode kernel, 32K keys, %s" % dt,
                      "skipped: %s" % r.get("skipped", "?"), "-", "-")

    # (e)
    move_row(a, threads, table, notes)

    # (f)
    forks(a.build, threads, table, notes)

    # (g)
    bf_med = med(sess[MAX_KEYS][0])
    for kd in QUANT:
        q_med = med(qsess[kd][0])
        r = bf_med / q_med
        table.add("(g) quantized decode, 32K keys: %s / BF16 session tokens/s" % kd,
                  "%.0f" % (1 / q_med), "%.0f" % (1 / bf_med), "%.2fx" % r, ">= 1.7x", r >= 1.7)
        notes.append("(g) %s: |o_quantized - o_BF16| / |o_BF16| = %.1e (the rows it stores: a "
                     "byte an element and a scale a row)"
                     % (kd, rel_diff(qsess[kd][2], sess[MAX_KEYS][2])))

    print()
    table.print()
    print()
    for n in notes:
        print(n)
    print("attnd: %s" % banner)
    print("attnd flags: %s for (a) and (b); (c) four servers: --session-batch on, off, and "
          "each with --max-running-per-client 0" % srv_cmd)
    if tres:
        print("torch %s, %d threads, GQA via %s; the cache [1, %d, %d, %d] %s, preallocated"
              % (tres["version"], tres["threads"], tres["gqa"], HKV, MAX_KEYS, D, DT))
    else:
        print("torch: skipped: torch not installed (make bench-peers makes build/peers-venv)")
    print("bench-peak: %s" % " ".join(peak_cmd[1:]))
    print(peak_line)
    print("load average (1 min) at start %.1f, at end %.1f, on %d online CPUs; %.0f s"
          % (load0, os.getloadavg()[0], os.cpu_count(),
             (datetime.datetime.now(datetime.timezone.utc) - t_start).total_seconds()))
    if table.misses:
        print("missed: " + "; ".join(table.misses))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--reps", type=int, default=10,
                   help="(b): timed steps per row and round (10; the stateless a third)")
    p.add_argument("--rounds", type=int, default=3,
                   help="(b): rounds of session, torch and stateless steps in turn (3)")
    p.add_argument("--steps", type=int, default=64, help="(c): steps per session (64)")
    p.add_argument("--runs", type=int, default=5, help="(c): runs per cell, median (5)")
    p.add_argument("--move-reps", type=int, default=3,
                   help="(e): timed moves, median (3; one more warms up)")
    p.add_argument("--only", choices=("e", "f"), help="run row (e) or (f) alone")
    p.add_argument("--worker", choices=("torch",), help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker == "torch":
        torch_worker(a)
    elif a.only == "f":
        forks_only(a)
    else:
        main_driver(a)


if __name__ == "__main__":
    main()
