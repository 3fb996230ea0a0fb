#!/usr/bin/env python3
"""Peak and settled memory of attnd under hostile bodies (make bench-memory).

Two bursts, each against a fresh server, reading VmRSS and VmHWM from
/proc/PID/status:
  1. JSON: four 33.5 MB bodies of zeros (q and k [131070, 64], v malformed),
     one after another; each is refused with 422.
  2. 12 uploads at once near --max-body (safetensors, valid, Nq = 1 so the
     compute is small), all answered.
Prints one table: idle RSS, peak RSS (VmHWM), RSS after the burst, and the
peak over idle as a multiple of the largest body. Not part of make test: it
measures, it does not judge.
"""
import http.client
import json
import os
import re
import struct
import subprocess
import sys
import threading
import time

ATTND = os.environ.get("ATTND_BIN", "build/attnd")


def mem(pid):
    text = open(f"/proc/{pid}/status").read()
    get = lambda k: int(re.search(rf"{k}:\s+(\d+) kB", text).group(1)) * 1024
    return get("VmRSS"), get("VmHWM")


def start(*flags):
    p = subprocess.Popen([ATTND, "--listen", "127.0.0.1:0", *flags],
                         stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()
    while "listening on" not in line:
        if not line:
            sys.exit("attnd did not start")
        line = p.stderr.readline()
    port = int(re.search(r":(\d+),", line).group(1))
    threading.Thread(target=lambda: p.stderr.read(), daemon=True).start()
    return p, port


def post(port, body, ctype):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/attention", body=body, headers={"Content-Type": ctype})
    r = c.getresponse()
    r.read()
    c.close()
    return r.status


def settle(pid, seconds=2.0):
    time.sleep(seconds)
    return mem(pid)[0]


def json_burst():
    zeros = ",".join(["0"] * (131070 * 64))
    t = '{"shape": [131070, 64], "dtype": "F32", "data": [%s]}' % zeros
    body = ('{"q": %s, "k": %s, "v": {"shape": [1, 64], "dtype": "F32", "data": [1]}}'
            % (t, t)).encode()
    p, port = start()
    post(port, b'{"q": [[1]], "k": [[1]], "v": [[1]]}', "application/json")
    idle = settle(p.pid)
    codes = [post(port, body, "application/json") for _ in range(4)]
    after = settle(p.pid)
    peak = mem(p.pid)[1]
    p.terminate()
    p.wait()
    return "JSON 4 x %.1f MB (%s)" % (len(body) / 1e6, ",".join(map(str, set(codes)))), \
        idle, peak, after, len(body)


def st_body(nkv, d=128):
    tensors, off, meta = {}, 0, {}
    for name, n in (("q", 1), ("k", nkv), ("v", nkv)):
        size = n * d * 4
        meta[name] = {"dtype": "F32", "shape": [1, 1, n, d], "data_offsets": [off, off + size]}
        off += size
    h = json.dumps(meta).encode()
    h += b" " * (-len(h) % 8)
    # K and V of small values: the body is mostly one repeated pattern
    data = struct.pack("<f", 0.01) * (off // 4)
    return struct.pack("<Q", len(h)) + h + data


def upload_burst(max_body_mb=128, n=12):
    body = st_body(int((max_body_mb << 20) * 0.95) // (2 * 128 * 4))
    p, port = start("--max-body", f"{max_body_mb}M", "--max-queue", "64")
    post(port, st_body(16), "application/octet-stream")
    idle = settle(p.pid)
    codes = []
    ts = [threading.Thread(target=lambda: codes.append(post(port, body,
                                                            "application/octet-stream")))
          for _ in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    after = settle(p.pid)
    peak = mem(p.pid)[1]
    p.terminate()
    p.wait()
    return "%d parallel uploads x %.0f MB, --max-body %dM (%s)" % (
        n, len(body) / 1e6, max_body_mb, ",".join(map(str, sorted(set(codes))))), \
        idle, peak, after, len(body)


def main():
    rows = [json_burst(), upload_burst()]
    mb = lambda b: "%8.1f" % (b / 2**20)
    print("%-52s %9s %9s %9s %12s" % ("burst (status)", "idle MiB", "peak MiB", "after MiB",
                                         "peak-idle/body"))
    for name, idle, peak, after, blen in rows:
        print("%-52s %9s %9s %9s %12.2f" % (name, mb(idle), mb(peak), mb(after),
                                             (peak - idle) / blen))


if __name__ == "__main__":
    main()
