#!/usr/bin/env python3
"""Instructions attnd spends per small request, counted by callgrind (make
bench-small).

Runs attnd (ATTND_BIN, default build/attnd) under `valgrind --tool=callgrind`
twice per kind of request, and sends it N1 then N2 (default 200 and 2,000)
sequential keep-alive requests on one connection: GET /healthz, and a tiny
POST /attention (2 x 2 q, k and v as JSON). The difference of the two runs'
totals over N2 - N1 is the instructions of one request, in every thread of
the server, start-up and shutdown cancelled out; instruction counts hold
where wall-clock times on a shared machine do not. With --top K, the K
functions whose cost grows most per request (inclusive) follow. Not part of
make test: it prints counts, it does not judge them.
"""
import argparse
import os
import re
import socket
import subprocess
import tempfile
import time

ATTND = os.environ.get("ATTND_BIN", "build/attnd")
BODY = b'{"q": [[1, 0], [0, 1]], "k": [[1, 0], [0, 1]], "v": [[1, 2], [3, 4]]}'
REQUESTS = {
    "healthz": b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n",
    "post": b"POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY,
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drive(port, n, req):
    """n requests, each sent once the reply before it is whole."""
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b""
    for _ in range(n):
        s.sendall(req)
        while True:
            h = buf.find(b"\r\n\r\n")
            if h >= 0:
                m = re.search(rb"\r\ncontent-length: *(\d+)", buf[:h], re.I)
                end = h + 4 + (int(m.group(1)) if m else 0)
                if len(buf) >= end:
                    if not buf.startswith(b"HTTP/1.1 200"):
                        raise SystemExit("not a 200: %r" % buf[:200])
                    buf = buf[end:]
                    break
            d = s.recv(65536)
            if not d:
                raise SystemExit("the server closed the connection")
            buf += d
    s.close()


def run(kind, n, out):
    port = free_port()
    p = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out, ATTND, "--listen",
         "127.0.0.1:%d" % port, "--threads", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            break
        except OSError:
            time.sleep(0.1)
    drive(port, n, REQUESTS[kind])
    p.terminate()
    p.wait()
    with open(out) as f:
        for line in f:
            if line.startswith("summary:") or line.startswith("totals:"):
                return int(line.split()[1])
    raise SystemExit("no totals in " + out)


def functions(path):
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
                         capture_output=True, text=True).stdout
    costs = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+(\S.*?)(?: \[.*\])?$", line)
        if m and "PROGRAM TOTALS" not in line:
            # a function can be listed twice (by two spellings of its file)
            name = m.group(2).split(":")[-1]
            costs[name] = max(costs.get(name, 0), int(m.group(1).replace(",", "")))
    return costs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n1", type=int, default=200)
    ap.add_argument("--n2", type=int, default=2000)
    ap.add_argument("--top", type=int, default=0, help="list the K costliest functions")
    ap.add_argument("kinds", nargs="*", default=["healthz", "post"])
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        for kind in a.kinds:
            f1, f2 = os.path.join(d, kind + ".1"), os.path.join(d, kind + ".2")
            t1, t2 = run(kind, a.n1, f1), run(kind, a.n2, f2)
            print("%-8s %8.0f instructions per request  (%d requests: %d, %d: %d)" %
                  (kind, (t2 - t1) / (a.n2 - a.n1), a.n1, t1, a.n2, t2))
            if a.top:
                c1, c2 = functions(f1), functions(f2)
                rows = sorted(((c2.get(k, 0) - c1.get(k, 0)) / (a.n2 - a.n1), k) for k in c2)
                for v, k in reversed(rows[-a.top:]):
                    print("  %9.0f  %s" % (v, k))


if __name__ == "__main__":
    main()
