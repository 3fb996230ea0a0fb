#!/usr/bin/env python3
"""make bench-scale: what HAProxy in front of attnd costs, and what three replicas give.

One run, on this machine, one table. Three ways to reach attnd, each loaded by `attn load`
(keep-alive connections, closed loop):

  direct      replica r0 at its own address;
  proxy → 1   HAProxy from docker/proxy-config with r0 alone behind it;
  proxy → 3   HAProxy with r0, r1, r2 behind it.

Two loads: small stateless requests (POST /attention, --shape, --concurrency connections)
and session decode steps (--sessions sessions of --prefill tokens, --steps steps each, one
q token and one k, v token a step, GQA). Each row is the median over --runs runs; in each
run the three targets are timed in turn (the order rotating run by run), so that a shared
machine's other load falls on all of them alike. The proxy's added latency is its p50 and
p99 minus the direct ones, run by run, then the median.

On a machine of few cores the replicas, HAProxy and the load generator share them: the
three-replica column then measures the proxy's spreading, not added capacity. The report
says how many cores there were.

  scale.py --build build [--runs 3] [--seconds 5] [--concurrency 8] [--sessions 8]
           [--steps 1000] [--threads 1]
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "scale"))
import cluster  # noqa: E402


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--shape", default="1,4,32,64", help="a stateless request's q, k, v")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--prefill", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1, help="each replica's --threads")
    return ap.parse_args()


def load(attn, url, args, sessions):
    """One `attn load` run's JSON report."""
    cmd = [attn, "load", url, "--json"]
    if sessions:
        cmd += ["--session", str(args.sessions), "--steps", str(args.steps), "--prefill",
                str(args.prefill), "--shape", "1,8,1,64", "--shape-kv", "1,2,1,64"]
    else:
        cmd += ["--shape", args.shape, "--duration", str(args.seconds), "--concurrency",
                str(args.concurrency)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit("bench-scale: %s failed:\n%s%s" % (" ".join(cmd), out.stdout, out.stderr))
    rep = json.loads(out.stdout)
    failed = rep.get("steps_failed", 0) if sessions else rep["answered"] - rep["successful"]
    if failed:
        raise SystemExit("bench-scale: %d failed calls through %s:\n%s" % (failed, url, out.stdout))
    rate = rep["tokens_per_s"] if sessions else rep["successful_per_s"]
    return rate, rep["latency_ms"]["p50"], rep["latency_ms"]["p99"]


def measure(attn, targets, args):
    """{(load, target): [(rate, p50, p99) a run]}, the targets in turn within each run."""
    got = {}
    names = list(targets)
    for run in range(args.runs):
        order = names[run % len(names):] + names[:run % len(names)]
        for sessions in (False, True):
            for name in order:
                got.setdefault((sessions, name), []).append(load(attn, targets[name], args,
                                                                 sessions))
        print("bench-scale: run %d of %d done" % (run + 1, args.runs), file=sys.stderr)
    return got


def table(got, args):
    med = statistics.median
    rows = []
    for sessions, what, unit in ((False, "stateless %s, %d connections" % (args.shape,
                                                                          args.concurrency),
                                  "requests/s"),
                                 (True, "session steps, %d sessions" % args.sessions,
                                  "tokens/s")):
        d, p1, p3 = (got[(sessions, n)] for n in ("direct", "proxy → 1", "proxy → 3"))
        rate = [med(r[0] for r in x) for x in (d, p1, p3)]
        rows.append("| %s, %s | %.0f | %.0f (%.2f×) | %.0f (%.2f×) |" % (
            what, unit, rate[0], rate[1], rate[1] / rate[0], rate[2], rate[2] / rate[0]))
        for k, label in ((1, "p50"), (2, "p99")):
            lat = [med(r[k] for r in x) for x in (d, p1, p3)]
            added = med(b[k] - a[k] for a, b in zip(d, p1))
            rows.append("| %s, %s latency ms | %.3f | %.3f (+%.3f) | %.3f |" % (
                what, label, lat[0], lat[1], added, lat[2]))
    return rows


def haproxy_version():
    out = subprocess.run([cluster.HAPROXY, "-v"], capture_output=True, text=True).stdout
    return out.split("\n")[0].split(" - ")[0]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith("model name"):
                    return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main():
    args = parse_args()
    if not cluster.HAPROXY:
        raise SystemExit("bench-scale: haproxy is not installed (make deps installs Debian's)")
    attnd, attn = (os.path.join(ROOT, args.build, b) for b in ("attnd", "attn"))
    work = tempfile.mkdtemp(prefix="bench-scale-")
    flags = ["--threads", str(args.threads), "--trusted-proxy", "127.0.0.1"]
    replicas = [cluster.Replica(attnd, "r%d" % i, work, flags) for i in range(3)]
    proxies = []
    try:
        for r in replicas:
            r.start()
        for n, group in ((1, replicas[:1]), (3, replicas)):
            d = os.path.join(work, "proxy%d" % n)
            os.mkdir(d)
            proxies.append(cluster.Proxy(group, d, check_ms=1000))
            for r in group:
                proxies[-1].wait_status(r.name, "UP")
        targets = {"direct": "http://" + replicas[0].addr, "proxy → 1": proxies[0].url,
                   "proxy → 3": proxies[1].url}
        got = measure(attn, targets, args)
    finally:
        for p in proxies:
            p.stop()
        for r in replicas:
            if r.alive():
                r.kill()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print("make bench-scale, %s; %s, %d cores; %s; replicas --threads %d; medians of %d runs"
          % (now, cpu_model(), os.cpu_count(), haproxy_version(), args.threads, args.runs))
    if (os.cpu_count() or 1) < 8:
        print("(%d cores: replicas, HAProxy and the load share them, so `proxy → 3` measures "
              "the proxy's overhead and spreading, not added capacity)" % os.cpu_count())
    print()
    print("| load | direct | proxy → 1 | proxy → 3 |")
    print("|---|---|---|---|")
    for row in table(got, args):
        print(row)


if __name__ == "__main__":
    main()
