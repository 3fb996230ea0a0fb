"""make bench-peers: attnd against PyTorch's SDPA and numpy, same tensors, same threads.

For each row of ROWS this script draws Q, K, V with numpy (fixed seed), writes them
to one safetensors file, and times three implementations on that file, each in its
own process so that no thread pool of one competes with another's:

  attnd   build/bench-peers-attn: the engine's CPU backend through proto's
          safetensors decoder, warm-up then the median of N runs;
  torch   torch.nn.functional.scaled_dot_product_attention on the same values
          (BF16/F16 as torch dtypes), torch.set_num_threads(T);
  numpy   standard attention as a numpy user writes it, F32 rows only:
          softmax(Q·Kᵀ·scale)·V with float32 matmul (OpenBLAS), the causal mask
          as -inf outside np.tril; run with OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE
          removed from its environment (they are set on some development
          machines for an older OpenBLAS and slow the one numpy bundles).

GFLOP/s is 4·D per visible (query, key) pair for every implementation, so the
ratios are ratios of time (2·(D + Dv) for the rows whose values have a head dim
of their own, Dv: DeepSeek's MLA prefill, D 192 and Dv 128; torch's SDPA takes
such a v as it is, and attnd's CPU engine pads V to D, so its P·V side costs
D/Dv times the counted work). The peak column comes from build/bench-peak: the
matmul instruction the attnd kernel runs (named in the engine's backend detail),
on the same thread count. `diff` is ‖O_attnd − O_torch‖ / ‖O_torch‖.

Rows named "sinks ..." add gpt-oss's attention sinks (an F32 logit per query head,
a zero-valued key every row's softmax includes): attnd reads them from the same
file, and torch runs the formula a gpt-oss model runs without a fused kernel,
transformers' eager attention: the scores (K/V repeated per query head for GQA)
concatenated with the sink column, softmax in the row's dtype, the column
dropped, times V (SDPA has no sink). Their FLOPs are counted as for any row.

With --backward it times the backward pass instead (BWD_ROWS): attnd's dq, dk,
dv from q, k, v, o, dO and the forward's lse (bench-peers-attn --backward), against
torch autograd of the same SDPA call (torch.autograd.grad of its output with the
same dO; the forward runs once, untimed, and saves what its backward needs, as
attnd's forward saved the lse). GFLOP/s is 2.5 times the forward's 4·D per
visible pair; `diff` is over dq, dk and dv together.

  peers.py --build build [--threads T] [--isa NAME] [--runs K] [--only SUBSTR] [--backward]
  peers.py --worker torch|numpy|torch-bwd FILE --threads T --reps N --out O.npy   (internal)
"""

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
import attnd  # noqa: E402  (the client's safetensors codec and bf16 rounding)
from attnd import safetensors  # noqa: E402

SEED = 20261130


def row(name, h, hkv, nq, nkv, d, dtype, causal=False, reps=3, sinks=False, dv=None):
    """One row; dv is the values' head dim (None: d)."""
    return dict(name=name, h=h, hkv=hkv, nq=nq, nkv=nkv, d=d, dtype=dtype,
                causal=causal, reps=reps, sinks=sinks, dv=dv or d)


# The rows (B = 1), then D=128 F32 causal, GQA decode and MQA. Decode
# rows take milliseconds, and N=1024 about 11 ms, so they get more repetitions
# for a stable median.
ROWS = [
    row("H8 N4096 D64", 8, 8, 4096, 4096, 64, "F32"),
    row("H8 N4096 D64", 8, 8, 4096, 4096, 64, "F32", causal=True),
    row("H8 N4096 D128", 8, 8, 4096, 4096, 128, "F32"),
    row("H8 N4096 D128", 8, 8, 4096, 4096, 128, "F32", causal=True),
    row("H8 N1024 D64", 8, 8, 1024, 1024, 64, "F32", reps=15),
    row("H8 N4096 D64", 8, 8, 4096, 4096, 64, "BF16"),
    row("H8 N4096 D128", 8, 8, 4096, 4096, 128, "BF16", causal=True),
    row("H8 N4096 D128", 8, 8, 4096, 4096, 128, "F16"),
    row("decode H32 Nkv8192 D128", 32, 32, 1, 8192, 128, "BF16", reps=21),
    row("GQA 32/8 Nkv8192 D128", 32, 8, 1, 8192, 128, "BF16", reps=21),
    row("GQA 32/8 Nkv32768 D128", 32, 8, 1, 32768, 128, "BF16", reps=21),
    row("MQA 32/1 Nkv8192 D128", 32, 1, 1, 8192, 128, "BF16", reps=21),
    # gpt-oss: sinks, D 64; its decode step is GQA 64/8
    row("sinks H8 N4096 D64", 8, 8, 4096, 4096, 64, "BF16", sinks=True),
    row("sinks H8 N4096 D64", 8, 8, 4096, 4096, 64, "BF16", causal=True, sinks=True),
    row("sinks 64/8 Nkv8192 D64", 64, 8, 1, 8192, 64, "BF16", reps=21, sinks=True),
    # DeepSeek-V3's MLA prefill: q·k over D 192 (128 + 64 rope), values of Dv 128
    row("MLA H8 N4096 D192 Dv128", 8, 8, 4096, 4096, 192, "BF16", causal=True, dv=128),
    row("MLA H8 N4096 D192 Dv128", 8, 8, 4096, 4096, 192, "F32", causal=True, dv=128),
    # and its absorbed decode: 128 heads over one latent KV head of 4096 keys, q·k over 576
    # columns (512 latent + 64 rope), values the 512 latent ones (sent apart here)
    row("MLA dec 128/1 D576 Dv512", 128, 1, 1, 4096, 576, "BF16", reps=21, dv=512),
    # what attnd computes for the MLA rows (V zero-padded to D), and SDPA's fused kernel,
    # which takes no v of its own width (it runs such a v on its math path)
    row("H8 N4096 D192", 8, 8, 4096, 4096, 192, "BF16", causal=True),
]


# The backward's rows: the forward's reference point and N=1024, causal and not,
# D=128, a BF16 row, a GQA row and DeepSeek's MLA prefill (D 192, Dv 128), then
# D 192 with V as wide: what a torch user who pads MLA's V gets (autograd takes
# Dv < D on its math path only).
BWD_ROWS = [
    row("H8 N1024 D64", 8, 8, 1024, 1024, 64, "F32", reps=5),
    row("H8 N1024 D64", 8, 8, 1024, 1024, 64, "F32", causal=True, reps=5),
    row("H8 N4096 D64", 8, 8, 4096, 4096, 64, "F32"),
    row("H8 N4096 D64", 8, 8, 4096, 4096, 64, "F32", causal=True),
    row("H8 N4096 D128", 8, 8, 4096, 4096, 128, "F32"),
    row("H8 N4096 D64", 8, 8, 4096, 4096, 64, "BF16"),
    row("GQA 8/2 N4096 D64", 8, 2, 4096, 4096, 64, "F32", causal=True),
    row("MLA H8 N2048 D192 Dv128", 8, 8, 2048, 2048, 192, "BF16", causal=True, dv=128),
    row("MLA H8 N2048 D192 Dv128", 8, 8, 2048, 2048, 192, "F32", causal=True, dv=128),
    row("H8 N2048 D192", 8, 8, 2048, 2048, 192, "BF16", causal=True),
]


def visible_pairs(r):
    """(query, key) pairs attnd computes: causal is aligned bottom-right, as in attnd."""
    if not r["causal"]:
        return r["nq"] * r["nkv"]
    off = r["nkv"] - r["nq"]
    return sum(min(r["nkv"], i + off + 1) for i in range(r["nq"]))


def flops(r):
    """2·D for Q·Kᵀ and 2·Dv for P·V per visible pair (4·D when Dv = D)."""
    return 2.0 * (r["d"] + r["dv"]) * r["h"] * visible_pairs(r)


# ---- inputs --------------------------------------------------------------------

def make_file(r, path):
    """Q [1,H,Nq,D], K and V [1,Hkv,Nkv,D], N(0,1) rounded to the row's dtype; for a
    sinks row, sinks [H] F32 uniform in [5, 10]: against thousands of N(0,1) scores the
    sink then takes from a few percent to most of a row's weight, so that `diff` would
    show a sink dropped or counted twice."""
    rng = np.random.default_rng(SEED)
    shapes = {"q": (1, r["h"], r["nq"], r["d"]), "k": (1, r["hkv"], r["nkv"], r["d"]),
              "v": (1, r["hkv"], r["nkv"], r["dv"])}
    tensors = []
    for name in ("q", "k", "v"):
        x = rng.standard_normal(shapes[name], dtype=np.float32)
        if r["dtype"] == "BF16":
            x = attnd.float32_to_bf16(x)
        elif r["dtype"] == "F16":
            x = x.astype(np.float16)
        tensors.append((name, r["dtype"], x))
    if r["sinks"]:
        tensors.append(("sinks", "F32", rng.uniform(5.0, 10.0, r["h"]).astype(np.float32)))
    meta = {"causal": "true"} if r["causal"] else None
    with open(path, "wb") as f:
        f.write(safetensors.encode(tensors, meta))


def make_dout(r, path):
    """dO in O's shape, N(0,1) rounded to the row's dtype, raw (numpy's tofile)."""
    rng = np.random.default_rng(SEED + 1)
    x = rng.standard_normal((1, r["h"], r["nq"], r["dv"]), dtype=np.float32)
    if r["dtype"] == "BF16":
        x = attnd.float32_to_bf16(x)
    elif r["dtype"] == "F16":
        x = x.astype(np.float16)
    x.tofile(path)


def read_file(path):
    """(q, k, v, causal, dtype) with BF16 still as uint16 bits."""
    return read_file_sinks(path)[:5]


def read_file_sinks(path):
    """read_file's tuple and the sinks (F32, None when the file has none)."""
    with open(path, "rb") as f:
        tensors, meta = safetensors.decode(bytearray(f.read()))
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return (tensors["q"], tensors["k"], tensors["v"], meta.get("causal") == "true",
            header["q"]["dtype"], tensors.get("sinks"))


def median_time(fn, reps):
    fn()  # warm-up: first-touch pages, thread pools, kernel selection
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return float(np.median(t))


# ---- workers (each its own process) ---------------------------------------------

def torch_worker(a):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(a.threads)
    q, k, v, causal, dt, sinks = read_file_sinks(a.file)

    def to_torch(x):
        if dt == "BF16":  # numpy has no bfloat16: reinterpret the raw bits
            return torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)
        return torch.from_numpy(np.ascontiguousarray(x))

    q, k, v = to_torch(q), to_torch(k), to_torch(v)
    if sinks is not None:
        return torch_sinks_worker(a, torch, q, k, v, causal, torch.from_numpy(sinks))
    gqa = q.shape[1] != k.shape[1]
    native_gqa = "enable_gqa" in F.scaled_dot_product_attention.__doc__
    if gqa and native_gqa:
        def fn():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    elif gqa:  # older torch: K/V expanded per query head, and that is timed too
        g = q.shape[1] // k.shape[1]

        def fn():
            return F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1),
                                                  v.repeat_interleave(g, 1), is_causal=causal)
    else:
        def fn():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    with torch.inference_mode():
        sec = median_time(fn, a.reps)
        o = fn()
    np.save(a.out, o.float().numpy())
    print(json.dumps({"seconds": sec, "version": torch.__version__,
                      "threads": torch.get_num_threads(),
                      "sdpa": sdpa_backend(torch, q, k, v, causal, gqa and native_gqa),
                      "gqa": ("enable_gqa" if native_gqa else "repeat_interleave")
                      if gqa else None}))


def eager_sinks(torch, q, k, v, causal, sinks):
    """transformers' gpt-oss eager attention on [1, H, N, D] tensors: the sink column
    concatenated to the scores, softmax in q's dtype, the column dropped; the causal
    mask aligned bottom-right, as attnd's."""
    g = q.shape[1] // k.shape[1]
    if g > 1:
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = torch.matmul(q, k.transpose(2, 3)) * (q.shape[-1] ** -0.5)
    if causal:
        nq, nkv = q.shape[2], k.shape[2]
        hidden = torch.ones(nq, nkv, dtype=torch.bool).triu(nkv - nq + 1)
        s = s.masked_fill(hidden, float("-inf"))
    col = sinks.to(s.dtype).reshape(1, -1, 1, 1).expand(1, -1, q.shape[2], 1)
    s = torch.cat([s, col], dim=-1)
    s = s - s.max(dim=-1, keepdim=True).values
    p = torch.softmax(s, dim=-1, dtype=s.dtype)[..., :-1]
    return torch.matmul(p, v)


def torch_sinks_worker(a, torch, q, k, v, causal, sinks):
    def fn():
        return eager_sinks(torch, q, k, v, causal, sinks)

    with torch.inference_mode():
        sec = median_time(fn, a.reps)
        o = fn()
    np.save(a.out, o.float().numpy())
    print(json.dumps({"seconds": sec, "version": torch.__version__,
                      "threads": torch.get_num_threads(), "sdpa": "eager with sinks",
                      "gqa": "repeat_interleave" if q.shape[1] != k.shape[1] else None}))


def torch_bwd_worker(a):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(a.threads)
    q, k, v, causal, dt = read_file(a.file)
    raw = np.fromfile(a.dout, dtype=np.uint16 if dt in ("BF16", "F16") else np.float32)

    def to_torch(x):
        if dt == "BF16":  # numpy has no bfloat16: reinterpret the raw bits
            t = torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)
        elif dt == "F16":
            t = torch.from_numpy(x.view(np.float16).copy())
        else:
            t = torch.from_numpy(np.ascontiguousarray(x))
        return t

    q, k, v = (to_torch(x).requires_grad_(True) for x in (q, k, v))
    g = to_torch(raw).reshape(q.shape[:-1] + v.shape[-1:])
    kw = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, **kw)

    def fn():
        return torch.autograd.grad(o, (q, k, v), g, retain_graph=True)

    sec = median_time(fn, a.reps)
    grads = fn()
    np.save(a.out, np.concatenate([x.float().numpy().ravel() for x in grads]))
    print(json.dumps({"seconds": sec, "version": torch.__version__,
                      "threads": torch.get_num_threads(), "sdpa": "autograd", "gqa": None}))


def sdpa_backend(torch, q, k, v, causal, gqa):
    """The kernel SDPA dispatches to (flash / math / ...), where torch says."""
    try:
        kw = {"enable_gqa": True} if gqa else {}
        i = torch._fused_sdp_choice(q, k, v, None, 0.0, causal, **kw)
        return torch.nn.attention.SDPBackend(i).name.lower()
    except Exception:  # a private API: its absence is not an error
        return "?"


def numpy_worker(a):
    q, k, v, causal, dt = read_file(a.file)
    assert dt == "F32", "the numpy baseline runs F32 rows only"
    q, k, v = (np.ascontiguousarray(x[0]) for x in (q, k, v))  # [H, N, D]
    scale = np.float32(1.0 / math.sqrt(q.shape[-1]))
    g = q.shape[0] // k.shape[0]
    if g > 1:
        k, v = np.repeat(k, g, axis=0), np.repeat(v, g, axis=0)
    nq, nkv = q.shape[1], k.shape[1]
    hidden = ~np.tril(np.ones((nq, nkv), dtype=bool), nkv - nq) if causal else None
    kt = k.transpose(0, 2, 1)

    def fn():
        s = np.matmul(q, kt)
        s *= scale
        if hidden is not None:
            np.copyto(s, -np.inf, where=hidden)
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        return np.matmul(s, v)

    from threadpoolctl import threadpool_info, threadpool_limits
    with threadpool_limits(limits=a.threads, user_api="blas"):
        sec = median_time(fn, a.reps)
        blas = [p for p in threadpool_info() if p.get("user_api") == "blas"]
    b = blas[0] if blas else {}
    print(json.dumps({"seconds": sec, "version": np.__version__,
                      "blas": "%s %s, kernel %s, %s threads" % (
                          b.get("internal_api", "?"), b.get("version", "?"),
                          b.get("architecture", "?"), b.get("num_threads", "?"))}))


def run_worker(kind, path, r, threads, out, dout=None):
    env = dict(os.environ)
    if kind == "numpy":
        env.pop("OPENBLAS_CORETYPE", None)
        env.pop("OPENBLAS_L2_SIZE", None)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, path,
           "--threads", str(threads), "--reps", str(r["reps"]), "--out", out]
    if dout:
        cmd += ["--dout", dout]
    return run_json(cmd, env)


def run_json(cmd, env=None):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd[:3]), p.returncode,
                                                  p.stderr.strip()[-2000:]))
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---- one pass over the rows -------------------------------------------------------

def o_from_attnd(path):
    with open(path, "rb") as f:
        t, _ = safetensors.decode(bytearray(f.read()))
    o = t["o"]
    return attnd.bf16_to_float32(o) if o.dtype == np.uint16 else o.astype(np.float32)


def rel_diff(a, b):
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def measure_row(r, a, tmp):
    path = os.path.join(tmp, "qkv.safetensors")
    o_attnd, o_torch = os.path.join(tmp, "o.safetensors"), os.path.join(tmp, "o_torch.npy")
    make_file(r, path)
    res = {}
    res["attnd"] = run_json([os.path.join(a.build, "bench-peers-attn"), path,
                             "--threads", str(a.threads), "--isa", a.isa,
                             "--reps", str(r["reps"]), "--out", o_attnd])
    res["torch"] = run_worker("torch", path, r, a.threads, o_torch)
    if r["dtype"] == "F32" and not r["sinks"]:   # numpy's standard attention has none
        res["numpy"] = run_worker("numpy", path, r, a.threads, os.devnull)
    res["diff"] = rel_diff(o_from_attnd(o_attnd), np.load(o_torch))
    os.remove(path)
    return res


def grads_from_attnd(path, dtype):
    raw = np.fromfile(path, dtype=np.float32 if dtype == "F32" else np.uint16)
    if dtype == "BF16":
        return attnd.bf16_to_float32(raw)
    return raw.view(np.float16).astype(np.float32) if dtype == "F16" else raw


def measure_bwd_row(r, a, tmp):
    path, dout = os.path.join(tmp, "qkv.safetensors"), os.path.join(tmp, "do.bin")
    g_attnd, g_torch = os.path.join(tmp, "grads.bin"), os.path.join(tmp, "grads_torch.npy")
    make_file(r, path)
    make_dout(r, dout)
    res = {}
    res["attnd"] = run_json([os.path.join(a.build, "bench-peers-attn"), path,
                             "--threads", str(a.threads), "--isa", a.isa,
                             "--reps", str(r["reps"]), "--backward", dout, "--out", g_attnd])
    res["torch"] = run_worker("torch-bwd", path, r, a.threads, g_torch, dout)
    res["diff"] = rel_diff(grads_from_attnd(g_attnd, r["dtype"]), np.load(g_torch))
    return res


def one_pass(rows, a, k):
    out = []
    with tempfile.TemporaryDirectory(dir=a.build, prefix="peers-") as tmp:
        for i, r in enumerate(rows):
            print("  run %d/%d, row %d/%d: %s %s%s" % (k + 1, a.runs, i + 1, len(rows),
                  r["name"], r["dtype"], " causal" if r["causal"] else ""),
                  file=sys.stderr, flush=True)
            out.append(measure_bwd_row(r, a, tmp) if a.backward else measure_row(r, a, tmp))
    return out


def best_of(passes):
    """Per row and implementation, the fastest pass (load only ever slows a run)."""
    best = []
    for results in zip(*passes):
        b = dict(results[0])
        for res in results[1:]:
            for kind in ("attnd", "torch", "numpy"):
                if kind in res and res[kind]["seconds"] < b[kind]["seconds"]:
                    b[kind] = res[kind]
        best.append(b)
    return best


# ---- peak and the table ------------------------------------------------------------

def peak_path(detail, dtype):
    """The instruction the kernel named in detail ("avx512 kernel, 2 threads") runs
    its matmuls on: the 16-bit kernels for BF16, and AMX for F16 too (split in two
    BF16 parts: its %peak counts attention FLOPs, not the three or four tile
    products each pair takes), F32 FMA otherwise (the F32 kernels widen F16 and
    BF16 inputs to F32)."""
    kernel = detail.split()[0] if detail else "?"
    if dtype in ("BF16", "F16") and kernel == "amx":
        return "amx_bf16"
    if dtype == "BF16" and kernel == "avx512bf16":
        return "vdpbf16ps"
    if kernel.startswith("avx512") or kernel == "amx":
        return "fma512"
    if kernel == "avx2":
        return "fma256"
    return None  # generic C: no single instruction to compare with


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def print_table(rows, best, peak):
    hdr = ("%-24s %-4s %-6s | %8s %8s %8s | %7s %7s | %-9s %5s | %8s"
           % ("shape (B=1)", "type", "causal", "attnd", "torch", "numpy",
              "a/torch", "a/numpy", "peak path", "%peak", "diff"))
    print(hdr)
    print("-" * len(hdr))
    worst = None
    for r, b in zip(rows, best):
        f = flops(r)
        g = {k: f / b[k]["seconds"] * 1e-9 for k in ("attnd", "torch", "numpy") if k in b}
        vs_torch = g["attnd"] / g["torch"]
        vs_numpy = g["attnd"] / g["numpy"] if "numpy" in g else None
        path = peak_path(b["attnd"].get("detail"), r["dtype"])
        pk = peak.get(path, {}).get("gflops") if path else None
        pct = 100.0 * g["attnd"] / pk if pk else None
        print("%-24s %-4s %-6s | %8.1f %8.1f %8s | %7.2f %7s | %-9s %5s | %8.1e"
              % (r["name"], r["dtype"], "yes" if r["causal"] else "no", g["attnd"],
                 g["torch"], fmt(g.get("numpy"), ".1f"), vs_torch, fmt(vs_numpy, ".2f"),
                 path or "-", fmt(pct, ".0f"), b["diff"]))
        label = "%s %s%s" % (r["name"], r["dtype"], " causal" if r["causal"] else "")
        if worst is None or vs_torch < worst[0]:
            worst = (vs_torch, label)
    return worst


def print_bwd_table(rows, best):
    hdr = ("%-24s %-4s %-6s | %8s %8s | %7s | %8s"
           % ("backward (B=1)", "type", "causal", "attnd", "torch", "a/torch", "diff"))
    print(hdr)
    print("-" * len(hdr))
    worst = None
    for r, b in zip(rows, best):
        f = 2.5 * flops(r)
        g = {k: f / b[k]["seconds"] * 1e-9 for k in ("attnd", "torch")}
        ratio = g["attnd"] / g["torch"]
        print("%-24s %-4s %-6s | %8.1f %8.1f | %7.2f | %8.1e"
              % (r["name"], r["dtype"], "yes" if r["causal"] else "no", g["attnd"], g["torch"],
                 ratio, b["diff"]))
        label = "%s %s%s" % (r["name"], r["dtype"], " causal" if r["causal"] else "")
        if worst is None or ratio < worst[0]:
            worst = (ratio, label)
    return worst


def cpu_model():
    """The model name, with family and model: a hypervisor often shortens the name
    ("AMD EPYC"), and the numbers still tell the generation (25/17: Zen 4)."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                info.setdefault(key.strip(), val.strip())
    except OSError:
        return platform.processor() or "?"
    return "%s (family %s, model %s)" % (info.get("model name", "?"), info.get("cpu family", "?"),
                                         info.get("model", "?"))


def cpu_isa():
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(line for line in f if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return "?"
    want = ["avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16"]
    return " ".join(x for x in want if x in flags)


def print_notes(best, peak, a):
    b0 = best[0]
    t = b0["torch"]
    n = next((b["numpy"] for b in best if "numpy" in b), None)
    sdpa = sorted({b["torch"]["sdpa"] for b in best})
    gqa = sorted({b["torch"]["gqa"] for b in best if b["torch"]["gqa"]})
    print("attnd: %s (--isa %s)" % (b0["attnd"]["detail"], a.isa))
    print("torch %s: SDPA kernel(s) %s, %d threads%s" % (
        t["version"], ", ".join(sdpa), t["threads"],
        "; GQA/MQA via %s" % ", ".join(gqa) if gqa else ""))
    if n:
        print("numpy %s: %s (OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset)"
              % (n["version"], n["blas"]))
    paths = ", ".join("%s %s" % (k, ("%.1f GFLOP/s" % v["gflops"]) if "gflops" in v
                                 else "skipped: " + v["skipped"])
                      for k, v in peak.items() if k != "threads")
    print("peak on %d threads (bench-peak, per thread CPU time): %s" % (peak["threads"], paths))


def loadavg():
    """The 1-minute load average: on a shared machine it says how far to trust a run."""
    try:
        return "%.1f" % os.getloadavg()[0]
    except OSError:
        return "?"


def check_fresh(build):
    """The timed binaries must be built from the library they would measure:
    plain `make` does not rebuild them, and a stale one times old kernels."""
    lib = os.path.join(build, "libattn.a")
    for name in ("bench-peers-attn", "bench-peak"):
        exe = os.path.join(build, name)
        if not os.path.exists(exe):
            sys.exit("peers.py: %s is missing: run `make %s` (or `make bench-peers`)" % (exe, exe))
        if os.path.exists(lib) and os.path.getmtime(exe) < os.path.getmtime(lib):
            sys.exit("peers.py: %s is older than %s, so it would time old kernels: run "
                     "`make %s` (or `make bench-peers`)" % (exe, lib, exe))


def main_driver(a):
    check_fresh(a.build)
    rows = [r for r in (BWD_ROWS if a.backward else ROWS)
            if not a.only or a.only in "%s %s" % (r["name"], r["dtype"])]
    if not rows:
        sys.exit("peers.py: no row matches --only %r" % a.only)
    print("attnd vs torch SDPA%s, %s, %d threads, %s"
          % (" autograd, backward pass" if a.backward else " vs numpy", cpu_model(), a.threads,
             datetime.date.today().isoformat()))
    print("ISA: %s; GFLOP/s = %s per visible (query, key) pair; best of %d run(s) per cell"
          % (cpu_isa(), "2.5 × 2·(D + Dv)" if a.backward else "2·(D + Dv), 4·D where Dv = D", a.runs))
    sys.stdout.flush()
    load0 = loadavg()
    peak = run_json([os.path.join(a.build, "bench-peak"), "--threads", str(a.threads)])
    passes = [one_pass(rows, a, k) for k in range(a.runs)]
    best = best_of(passes)
    print()
    worst = print_bwd_table(rows, best) if a.backward else print_table(rows, best, peak)
    print()
    if a.backward:
        print("attnd: %s (--isa %s); torch %s autograd, %d threads"
              % (best[0]["attnd"]["detail"], a.isa, best[0]["torch"]["version"],
                 best[0]["torch"]["threads"]))
    else:
        print_notes(best, peak, a)
    print("load average (1 min) at start %s, at end %s, on %d online CPUs"
          % (load0, loadavg(), os.cpu_count()))
    print("worst attnd/torch: %.2f (%s)" % worst)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--isa", default="auto", help="attnd's CPU kernel (attn_config.cpu_isa)")
    p.add_argument("--runs", type=int, default=2,
                   help="passes over the rows; each cell keeps its best (default 2)")
    p.add_argument("--only", help="rows whose name and dtype contain this text")
    p.add_argument("--backward", action="store_true",
                   help="time the backward pass (BWD_ROWS) against torch autograd")
    p.add_argument("--worker", choices=("torch", "numpy", "torch-bwd"), help=argparse.SUPPRESS)
    p.add_argument("--dout", help=argparse.SUPPRESS)
    p.add_argument("file", nargs="?", help=argparse.SUPPRESS)
    p.add_argument("--reps", type=int, default=3, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker == "torch":
        torch_worker(a)
    elif a.worker == "torch-bwd":
        torch_bwd_worker(a)
    elif a.worker == "numpy":
        numpy_worker(a)
    else:
        main_driver(a)


if __name__ == "__main__":
    main()
