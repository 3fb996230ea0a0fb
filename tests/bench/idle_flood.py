#!/usr/bin/env python3
"""How long /healthz and a small POST take with many idle connections open
(make bench-idle).

Starts attnd (ATTND_BIN, default build/attnd) on a free port, opens N
connections that send nothing (default 2,000; the script raises its own
open-file limit for them), then times one GET /healthz and one small POST on
fresh connections, and counts how many idle ones the server kept. A server
whose slots idle clients hold leaves the new ones in the backlog until its
idle timeout (30 s). With --ulimit L the server runs under `ulimit -n L`.
Not part of make test: it prints times, it does not judge them.
"""
import argparse
import os
import re
import resource
import socket
import subprocess
import time

ATTND = os.environ.get("ATTND_BIN", "build/attnd")
BODY = b'{"q": [[1, 0]], "k": [[1, 0]], "v": [[1, 2]]}'


def start(limit):
    cmd = [ATTND, "--listen", "127.0.0.1:0"]
    if limit:
        cmd = ["sh", "-c", 'ulimit -n %d && exec "$0" "$@"' % limit] + cmd
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    notes = []
    for line in p.stderr:
        if "listening on" in line:
            return p, int(re.search(r":(\d+),", line).group(1)), notes
        notes.append(line.strip())
    raise SystemExit("attnd did not start: %s" % " ".join(notes))


def timed(port, request):
    t0 = time.perf_counter()
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(request)
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            break
        head += chunk
    s.close()
    return head.split(b"\r\n")[0].decode(), time.perf_counter() - t0


def still_open(socks):
    n = 0
    for s in socks:
        s.setblocking(False)
        try:
            n += s.recv(1) != b""
        except BlockingIOError:
            n += 1
        except OSError:
            pass
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--connections", type=int, default=2000)
    ap.add_argument("--ulimit", type=int, default=0, help="the server's open-file limit")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, a.connections + 256), hard))
    p, port, notes = start(a.ulimit)
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(a.connections)]
    get = timed(port, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    post = timed(port, b"POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json"
                       b"\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY))
    kept = still_open(socks)
    for s in socks:
        s.close()
    p.terminate()
    p.wait()
    for n in notes:
        print(n)
    print("%d idle connections%s: GET /healthz %s in %.1f ms, POST /attention %s in %.1f ms; "
          "%d idle ones still open" % (a.connections,
                                        " (server under ulimit -n %d)" % a.ulimit if a.ulimit else "",
                                        get[0], get[1] * 1e3, post[0], post[1] * 1e3, kept))


if __name__ == "__main__":
    main()
