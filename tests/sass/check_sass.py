#!/usr/bin/env python3
"""The SASS check: what the CUDA kernels must compile to, read without a GPU.

Usage: check_sass.py OBJECT...   (the objects nvcc made of engine/cuda/*.cu)

cuobjdump (and the nvdisasm it calls) come from PyPI's nvidia-cuda-cuobjdump
and nvidia-cuda-nvdisasm, installed in the test venv this script runs from.

Every kernel of every object, for every architecture it holds:
  - no local memory (LDL, STL): a kernel that spills or keeps an array in
    local memory runs many times slower, and ptxas's report covers spills
    only;
and every Hopper forward instance (hopper_fwd, sm_90a):
  - its matrix products are wgmma (HGMMA), not mma.sync;
  - in each of its main loops, between the wait that leaves one wgmma
    group in flight (WARPGROUP.DEPBAR.LE gsb0, 0x1: S = Q K^T is done,
    O += P V still runs) and the wait for the last one (..., 0x0), the
    softmax's exponentials (MUFU.EX2) begin: the softmax overlaps the PV
    product. When ptxas hoists the second wait above the softmax, the
    kernel still computes the right thing, at a fraction of the speed, and
    only this check notices without a GPU.
Prints a line per Hopper kernel and exits 1 on the first object that fails.
"""
import glob
import os
import re
import subprocess
import sys

WAIT1 = re.compile(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x1\b")
WAIT0 = re.compile(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x0\b")
EX2 = re.compile(r"\bMUFU\.EX2\b")
LOCAL = re.compile(r"\b(LDL|STL)(\.[A-Z0-9.]+)?\s")
HGMMA = re.compile(r"\bHGMMA\.")


def tools():
    """cuobjdump and nvdisasm's folder, from this interpreter's venv."""
    for sp in glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages")):
        hits = sorted(glob.glob(os.path.join(sp, "nvidia", "cu*", "bin", "cuobjdump")))
        if hits:
            return hits[-1], os.path.dirname(hits[-1])
    return None, None


def functions(sass):
    """(arch, name, instruction lines) for each kernel of a cuobjdump dump."""
    arch, name, body, out = None, None, [], []
    for line in sass.splitlines():
        m = re.match(r"\s*arch = (\S+)", line)
        if m:
            arch = m.group(1)
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            if name:
                out.append((arch, name, body))
            name, body = m.group(1), []
        elif name and "/*" in line:
            body.append(line)
    if name:
        out.append((arch, name, body))
    return out


def short(name):
    """hopper_fwd<bf16, 128> for its mangled name."""
    m = re.search(r"hopper_fwdI(\d+)(\w+?)Li(\d+)E", name)
    if not m:
        return name
    t = {"__nv_bfloat16": "bf16", "__half": "f16"}.get(m.group(2), m.group(2))
    return "hopper_fwd<%s, %s>" % (t, m.group(3))


def overlap(body):
    """EX2 counts between each 0x1 wait and the 0x0 wait after it."""
    windows, open_at = [], None
    for i, line in enumerate(body):
        if WAIT1.search(line):
            open_at = i
        elif WAIT0.search(line) and open_at is not None:
            windows.append(sum(1 for x in body[open_at:i] if EX2.search(x)))
            open_at = None
    return windows


def check(cuobjdump, env, obj):
    """Problems found in one object (an empty list: it passes)."""
    r = subprocess.run([cuobjdump, "--dump-sass", obj], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return ["cuobjdump failed on %s: %s" % (obj, r.stderr.strip())]
    bad, kernels = [], functions(r.stdout)
    if not kernels:
        return ["%s: cuobjdump found no kernels" % obj]
    for arch, name, body in kernels:
        local = [x.split("*/")[1].split(";")[0].strip() for x in body if LOCAL.search(x)]
        if local:
            bad.append("%s %s: %d local-memory accesses (e.g. %s)" % (arch, name, len(local),
                                                                      local[0]))
        if "hopper_fwd" not in name:
            continue
        w = overlap(body)
        ok = bool(w) and all(n > 0 for n in w) and any(HGMMA.search(x) for x in body)
        print("%s %s %s: MUFU.EX2 between the two waits of each loop: %s" %
              ("ok  " if ok else "FAIL", arch, short(name), w or "no 0x1 wait"))
        if not ok:
            bad.append("%s %s: the softmax does not overlap O += P V (or no wgmma)" %
                       (arch, short(name)))
    return bad


def main(objs):
    cuobjdump, bindir = tools()
    if not cuobjdump:
        print("tests/sass: cuobjdump is not in %s (requirements-test.txt installs it)" %
              sys.prefix, file=sys.stderr)
        return 1
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    bad = []
    for obj in objs:
        bad += check(cuobjdump, env, obj)
    for b in bad:
        print("tests/sass: " + b, file=sys.stderr)
    print("tests/sass: %d objects, %s" % (len(objs), "%d problems" % len(bad) if bad else "passed"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]) if len(sys.argv) > 1 else 2)
