#!/usr/bin/env python3
"""sdpa_bench.py — PyTorch's scaled_dot_product_attention on bench-gpu's shapes.

The yardstick for tests/gpu/bench_gpu.c: the same shapes (keep the two lists
in step), fresh random tensors uniform in [-1, 1) in the layout [B, H, N, D],
F16/BF16, is_causal, timed the same way: warm-up
until 30 ms of device time, then calls with a CUDA event between consecutive
ones, at least 20 and until 200 ms, the median; input sets rotated when one
set is under 3x the L2 cache. Calls whose eager median is under 0.3 ms
(decode) are also timed as CUDA-graph replays, which removes Python's launch
gaps; the lower of the two medians is reported and marked "+graph".

The kernel column names the backend SDPA ran (from one profiled call: flash,
cudnn, mem_efficient or math, with the kernel's name), or "?" if the
profiler is not available.

    python3 tests/gpu/sdpa_bench.py [--quick | --hopper | --hopper-full] [--csv FILE]

--hopper and --hopper-full time bench-gpu's Hopper table (its "prefill"
rows; bench-gpu also times them as "hopper").

Prints "sdpa: skipped: ..." and exits 0 when torch or a CUDA device is
missing. FLOPs are 4*B*H*Nq*Nkv*D, halved for causal, times 2.5 for backward
(FlashAttention's convention); decode also reports GB/s of K and V read. The
backward rows time torch.autograd.grad of SDPA's output for dq, dk, dv given
a random dO, with the forward (and its saved state) run once per input set
outside the timing: SDPA's own backward kernel, as bench-gpu times ours. Causal shapes are all square, so torch's top-left causal
mask and attnd's bottom-right one agree.
"""
import argparse
import sys


def hopper_shapes(full):
    out = []
    for d in (64, 96, 128, 192, 256):
        for n in (1024, 2048, 4096, 8192, 16384):
            for causal in (False, True):
                if full or (n >= 4096 if d == 128 else n == 8192):
                    out.append(("prefill", 4, 16, 16, n, n, d, "BF16", causal))
    return out


def shapes(quick):
    out = []
    for dt in ("F16", "BF16"):
        for d in (64, 128):
            for n in (1024, 4096, 8192):
                for causal in (False, True):
                    if quick and (d != 128 or n != 4096):
                        continue
                    out.append(("prefill", 4, 16, 16, n, n, d, dt, causal))
    if not quick:  # the instances between 64, 128 and 256 (FlashAttention-2 has 96, 160, 192)
        for d in (96, 160, 192):
            for causal in (False, True):
                out.append(("prefill", 4, 16, 16, 4096, 4096, d, "BF16", causal))
    out.append(("decode", 1, 32, 8, 1, 32768, 128, "BF16", False))
    if not quick:
        out.append(("decode", 4, 32, 8, 1, 32768, 128, "BF16", False))
        out.append(("decode", 1, 32, 8, 1, 32768, 128, "F16", False))
    for dt in ("F16", "BF16"):
        for d in (64, 128):
            for n in (1024, 4096):
                for causal in (False, True):
                    if quick and (d != 128 or n != 4096):
                        continue
                    out.append(("backward", 4, 16, 16, n, n, d, dt, causal))
    return out


MIN_MS, MIN_REPS, MAX_REPS, MAX_MS = 200.0, 20, 3000, 3000.0
MAX_SETS = 8


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def time_eager(torch, call, nsets):
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(65)]
    warm, it = 0.0, 0
    while it < 3 or (warm < 30.0 and it < 200):
        ev[0].record()
        call(it % nsets)
        ev[1].record()
        ev[1].synchronize()
        warm += ev[0].elapsed_time(ev[1])
        it += 1
    times, total = [], 0.0
    while len(times) < MAX_REPS and (len(times) < MIN_REPS or total < MIN_MS) and total < MAX_MS:
        k = min(64, MAX_REPS - len(times))
        ev[0].record()
        for i in range(k):
            call((len(times) + i) % nsets)
            ev[i + 1].record()
        ev[k].synchronize()
        for i in range(k):
            t = ev[i].elapsed_time(ev[i + 1])
            times.append(t)
            total += t
    return median(times), min(times), len(times)


def time_graph(torch, call, nsets, per=20):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(3):
            call(i % nsets)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(per):
            call(i % nsets)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    times, total = [], 0.0
    while len(times) < 10 or (total < MIN_MS and len(times) < 1000):
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        t = a.elapsed_time(b)
        times.append(t / per)
        total += t
    return median(times), min(times), len(times) * per


def backend_of(torch, call):
    """Short name of the SDPA backend and its main kernel, from one profiled call."""
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            call(0)
            torch.cuda.synchronize()
        best, best_t = None, -1.0
        for e in prof.key_averages():
            t = getattr(e, "device_time_total", None)
            if t is None:
                t = getattr(e, "cuda_time_total", 0.0)
            if t > best_t and not e.key.startswith(("cudaLaunch", "cuLaunch", "Memcpy", "Memset")):
                best, best_t = e.key, t
        if not best:
            return "?"
        low = best.lower()
        if "cudnn" in low:
            short = "cudnn"
        elif "flash" in low:
            short = "flash"
        elif "fmha" in low or "cutlass" in low or "efficient" in low or "attentionkernel" in low:
            short = "mem_efficient"
        else:
            short = "math"
        name = best.split("(")[0].split("<")[0].split("::")[-1].split(" ")[-1]
        return short + ":" + name[-32:]
    except Exception as ex:  # the profiler is optional
        return "?(%s)" % type(ex).__name__


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="bench-gpu --quick's shapes")
    ap.add_argument("--hopper", action="store_true", help="bench-gpu --hopper's shapes")
    ap.add_argument("--hopper-full", action="store_true", help="bench-gpu --hopper-full's shapes")
    ap.add_argument("--csv", help="also write the results to this CSV file")
    ap.add_argument("--no-profile", action="store_true", help="do not name the SDPA backend")
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except Exception as ex:
        print("sdpa: skipped: torch is not importable (%s)" % ex)
        return 0
    if not torch.cuda.is_available():
        print("sdpa: skipped: torch %s sees no CUDA device" % torch.__version__)
        return 0
    dev = torch.device("cuda", 0)
    prop = torch.cuda.get_device_properties(dev)
    l2 = getattr(prop, "L2_cache_size", 50 << 20) or (50 << 20)
    flags = []
    for name in ("flash_sdp_enabled", "mem_efficient_sdp_enabled", "cudnn_sdp_enabled", "math_sdp_enabled"):
        fn = getattr(torch.backends.cuda, name, None)
        if fn is not None:
            flags.append("%s=%s" % (name.replace("_sdp_enabled", ""), fn()))
    print("sdpa: torch %s (CUDA %s), %s, %d SMs, L2 %d MiB; %s%s" % (
        torch.__version__, torch.version.cuda, prop.name, prop.multi_processor_count, l2 >> 20,
        ", ".join(flags), ", --quick" if args.quick else ""))
    dtypes = {"F16": torch.float16, "BF16": torch.bfloat16}
    csv = None
    if args.csv:
        csv = open(args.csv, "w")
        csv.write("kind,b,hq,hkv,nq,nkv,d,dtype,causal,kernel,nsplit,sets,reps,median_ms,min_ms,"
                  "tflops,gbps,status\n")
    print("%-8s %2s %3s %3s %5s %6s %4s %-5s %6s %-44s %4s %5s %10s %9s %8s %6s" % (
        "kind", "B", "Hq", "Hkv", "Nq", "Nkv", "D", "dtype", "causal", "kernel", "sets", "reps",
        "median_ms", "TFLOP/s", "GB/s", "status"))
    fails = 0
    todo = hopper_shapes(args.hopper_full) if (args.hopper or args.hopper_full) else shapes(args.quick)
    for (kind, b, hq, hkv, nq, nkv, d, dt, causal) in todo:
        with torch.inference_mode(kind != "backward"):
            status, kernel, med, mn, reps, nsets = "ok", "-", 0.0, 0.0, 0, 1
            try:
                es = 2
                set_bytes = es * d * (2 * b * hq * nq + 2 * b * hkv * nkv) * (2 if kind == "backward" else 1)
                if set_bytes < 3 * l2:
                    nsets = max(2, min(MAX_SETS, -(-3 * l2 // set_bytes)))
                gen = torch.Generator(device=dev)
                gen.manual_seed(1234 + nkv + d)

                def rnd(*shape):
                    return torch.rand(*shape, dtype=dtypes[dt], device=dev, generator=gen) * 2 - 1

                sets = [(rnd(b, hq, nq, d), rnd(b, hkv, nkv, d), rnd(b, hkv, nkv, d)) for _ in range(nsets)]
                kw = {"is_causal": causal}
                if hq != hkv:
                    try:
                        q, k, v = sets[0]
                        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                        kw["enable_gqa"] = True
                    except (TypeError, RuntimeError):
                        rep = hq // hkv  # no enable_gqa here: expand K and V (outside the timing)
                        sets = [(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1))
                                for (q, k, v) in sets]
                        kernel = "kv-expanded "

                def call(i, sets=sets, kw=kw):
                    q, k, v = sets[i]
                    return F.scaled_dot_product_attention(q, k, v, **kw)

                if kind == "backward":
                    grads = []
                    for (q, k, v) in sets:
                        for x in (q, k, v):
                            x.requires_grad_(True)
                        o = F.scaled_dot_product_attention(q, k, v, **kw)
                        grads.append((o, rnd(b, hq, nq, d), (q, k, v)))

                    def call(i, grads=grads):  # noqa: F811 (the backward's timed call)
                        o, do, inputs = grads[i]
                        return torch.autograd.grad(o, inputs, do, retain_graph=True)[0]

                out = call(0)
                if not bool(torch.isfinite(out).all()):
                    status = "BAD"
                del out
                med, mn, reps = time_eager(torch, call, nsets)
                how = ""
                if med < 0.3 and kind != "backward":
                    try:
                        gmed, gmn, greps = time_graph(torch, call, nsets)
                        if gmed < med:
                            med, mn, reps, how = gmed, gmn, greps, "+graph"
                    except Exception as ex:
                        how = "(graph failed: %s)" % type(ex).__name__
                name = "?" if args.no_profile else backend_of(torch, call)
                kernel = (kernel if kernel != "-" else "") + name + how
                del sets
                grads = None
            except Exception as ex:
                status, kernel = "ERROR", "%s: %s" % (type(ex).__name__, str(ex).split("\n")[0][:60])
                fails += 1
            flops = 4.0 * b * hq * nq * nkv * d * (0.5 if causal else 1.0) * (2.5 if kind == "backward" else 1.0)
            kvbytes = 2.0 * b * hkv * nkv * d * 2
            tflops = flops / (med * 1e-3) / 1e12 if med > 0 else 0.0
            gbps = kvbytes / (med * 1e-3) / 1e9 if med > 0 and kind == "decode" else 0.0
            extra = "  (%.1f us)" % (med * 1e3) if kind == "decode" and med > 0 else ""
            print("%-8s %2d %3d %3d %5d %6d %4d %-5s %6d %-44s %4d %5d %10.4f %9.1f %8.0f %6s%s" % (
                kind, b, hq, hkv, nq, nkv, d, dt, int(causal), kernel[:44], nsets, reps, med, tflops,
                gbps, status, extra), flush=True)
            if csv:
                csv.write("%s,%d,%d,%d,%d,%d,%d,%s,%d,%s,-,%d,%d,%.6f,%.6f,%.3f,%.1f,%s\n" % (
                    kind, b, hq, hkv, nq, nkv, d, dt, int(causal), kernel.replace(",", ";"), nsets,
                    reps, med, mn, tflops, gbps, status))
                csv.flush()
            torch.cuda.empty_cache()
    if csv:
        csv.close()
    print("sdpa: done, %d error(s)" % fails)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
