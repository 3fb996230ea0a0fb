"""attnd's /v2 front end driven by real Open Inference Protocol clients, unmodified.

tritonclient.http.InferenceServerClient sends FP32, FP16 and BF16 inputs (ml_dtypes rounds
the BF16 values), as JSON and as binary tensors, with every option through `parameters`
and a subset of outputs; results are checked against attn_ref.py's float64 reference, and
errors must surface as InferenceServerException carrying attnd's message. perf_analyzer
(the binary tritonclient 2.51.0's wheel ships) runs a short measurement with zero errors;
nothing here asserts a duration or a rate.

Run by `make test` with build/venv (tests/python/requirements-test.txt pins tritonclient
and the CUDA runtime library perf_analyzer links against; Debian's libb64-0d is in the
Makefile's DEPS).
"""

import glob
import os
import subprocess
import sys
import urllib.request

import numpy as np
import pytest

import attn_ref

http = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

BF16 = attn_ref.BF16
TOL = {"FP32": 1e-5, "FP16": 1e-3, "BF16": 8e-3}
MODEL = {"FP32": "attention", "FP16": "attention_fp16", "BF16": "attention_bf16"}


@pytest.fixture(scope="module")
def triton(server):
    return http.InferenceServerClient(server.url[len("http://"):])


def rounded(x, dtype):
    """x rounded to dtype, as the numpy array tritonclient takes for it (BF16: float32)."""
    if dtype == "FP16":
        return x.astype(np.float16)
    if dtype == "BF16":
        return x.astype(BF16).astype(np.float32)
    return x.astype(np.float32)


def inputs(tensors, dtype, binary):
    out = []
    for name, x in zip("qkv", tensors):
        t = http.InferInput(name, list(x.shape), dtype)
        t.set_data_from_numpy(x, binary_data=binary)
        out.append(t)
    return out


def parameters(opts):
    p = {}
    if opts.get("causal"):
        p["causal"] = True
    if "scale" in opts:
        p["scale"] = opts["scale"]
    if "window" in opts:
        p["window_left"], p["window_right"] = opts["window"]
    return p


def check_stats(got, ref, what):
    """m and lse within 1e-5 of the reference relative to max(1, |ref|); -inf exactly."""
    got = np.asarray(got, np.float64)
    inf = np.isinf(ref)
    assert np.array_equal(np.isneginf(got) | np.isnan(got), inf), what + ": -inf rows differ"
    err = np.abs(got[~inf] - ref[~inf]) / np.maximum(1.0, np.abs(ref[~inf]))
    assert err.size == 0 or err.max() <= 1e-5, "%s: error %.3g" % (what, err.max())


def test_server_and_model_metadata(triton):
    assert triton.is_server_live() and triton.is_server_ready()
    meta = triton.get_server_metadata()
    assert {"binary_tensor_data", "parameters"} <= set(meta["extensions"])
    for dtype, model in MODEL.items():
        assert triton.is_model_ready(model) and triton.is_model_ready(model, "1")
        m = triton.get_model_metadata(model)
        assert [t["name"] for t in m["inputs"]] == ["q", "k", "v"]
        assert [t["name"] for t in m["outputs"]] == ["o", "m", "l", "lse"]
        assert {t["datatype"] for t in m["inputs"]} == {dtype}
        assert triton.get_model_config(model)["max_batch_size"] == 0
    assert not triton.is_model_ready("gpt")


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("dtype", ["FP32", "FP16", "BF16"])
@pytest.mark.parametrize("case", sorted(attn_ref.CASES))
def test_infer_against_float64(triton, case, dtype, binary):
    if dtype == "BF16" and not binary:
        pytest.skip("tritonclient sends BF16 only as binary data (the C tests cover BF16 JSON)")
    qs, ks, opts = attn_ref.CASES[case]
    rng = np.random.default_rng(14)
    q, k, v = (rounded(attn_ref.rand(rng, s), dtype) for s in (qs, ks, ks))
    outputs = [http.InferRequestedOutput(n, binary_data=binary) for n in ("o", "m", "l", "lse")]
    # every model takes every datatype: send FP32 to the FP16 alias and so on
    model = MODEL["FP16" if dtype == "FP32" else "FP32"]
    r = triton.infer(model, inputs((q, k, v), dtype, binary), outputs=outputs,
                     parameters=parameters(opts), request_id="case-" + case)
    assert r.get_response()["id"] == "case-" + case
    o_ref, m_ref, l_ref, lse_ref = attn_ref.reference(q, k, v, opts.get("causal", False),
                                                      opts.get("scale"), opts.get("window", (-1, -1)))
    o = r.as_numpy("o")
    assert o.shape == q.shape
    err = attn_ref.rel_err(o, o_ref)
    assert err <= TOL[dtype], "%s %s: O error %.3g" % (case, dtype, err)
    check_stats(r.as_numpy("m"), m_ref, "m")
    check_stats(r.as_numpy("lse"), lse_ref, "lse")
    assert np.allclose(r.as_numpy("l"), l_ref, rtol=1e-5, atol=0)


def test_subset_of_outputs_and_backend(triton):
    rng = np.random.default_rng(1)
    q, k, v = (rounded(attn_ref.rand(rng, (2, 9, 16)), "FP16") for _ in range(3))
    outputs = [http.InferRequestedOutput("lse", binary_data=True),
               http.InferRequestedOutput("o", binary_data=False)]
    r = triton.infer("attention", inputs((q, k, v), "FP16", False), outputs=outputs,
                     parameters={"backend": "reference", "causal": True})
    assert [o["name"] for o in r.get_response()["outputs"]] == ["o", "lse"]
    assert r.as_numpy("m") is None and r.as_numpy("l") is None
    o_ref, _, _, lse_ref = attn_ref.reference(q, k, v, True)
    assert attn_ref.rel_err(r.as_numpy("o"), o_ref) <= TOL["FP16"]
    check_stats(r.as_numpy("lse"), lse_ref, "lse")


@pytest.mark.parametrize("mutate, message", [
    (lambda a: a.update(parameters={"casual": True}), 'unknown parameter "casual"'),
    (lambda a: a.update(parameters={"window_left": -5}), 'option "window_left"'),
    (lambda a: a.update(parameters={"backend": "tpu"}), 'option "backend"'),
    (lambda a: a.update(timeout=1000), 'parameter "timeout" is reserved'),
    (lambda a: a.update(priority=2), 'parameter "priority" is reserved'),
    (lambda a: a.update(inputs=a["inputs"][:2]), 'input "v" is missing'),
    (lambda a: a.update(outputs=[http.InferRequestedOutput("p")]), 'the name must be "o"'),
    (lambda a: a.update(inputs=inputs([np.ones((2, 4), np.float64)] * 3, "FP64", True)),
     'datatype "FP64" is not supported'),
    (lambda a: a.update(inputs=inputs([np.ones((2, 4), np.int8)] * 3, "INT8", False)),
     'datatype "INT8" is not supported'),
    (lambda a: a.update(inputs=inputs([np.ones((4,), np.float32)] * 3, "FP32", True)),
     "has 1 dimensions"),
    (lambda a: a.update(inputs=inputs([np.ones((2, 4), np.float32), np.ones((2, 3), np.float32),
                                       np.ones((2, 3), np.float32)], "FP32", True)),
     "head dims differ"),
    (lambda a: a.update(inputs=inputs([np.full((2, 4), np.inf, np.float32)] * 3, "FP32", True)),
     "non-finite"),
])
def test_errors_surface_as_exceptions(triton, mutate, message):
    args = {"inputs": inputs([np.ones((2, 4), np.float32)] * 3, "FP32", True)}
    mutate(args)
    with pytest.raises(InferenceServerException) as e:
        triton.infer("attention", **args)
    assert message in e.value.message(), e.value.message()
    assert e.value.status() in ("400", "422"), e.value.status()


def perf_analyzer_env():
    """perf_analyzer links libcudart.so.12 (from nvidia-cuda-runtime-cu12) even to talk HTTP."""
    import nvidia.cuda_runtime
    lib = os.path.join(list(nvidia.cuda_runtime.__path__)[0], "lib")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = lib + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    return env


def infer_counts(url):
    """attnd_requests_total of the /v2 infer route: (200s, every other status)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    ok = other = 0
    for line in text.splitlines():
        if line.startswith('attnd_requests_total{path="/v2/models/*/infer"'):
            n = float(line.rsplit(" ", 1)[1])
            if 'code="200"' in line:
                ok += n
            else:
                other += n
    return ok, other


def test_perf_analyzer_zero_errors(server, tmp_path):
    binary = os.path.join(os.path.dirname(sys.executable), "perf_analyzer")
    if not os.access(binary, os.X_OK):
        pytest.fail("no perf_analyzer beside %s: tritonclient 2.51.0 ships it" % sys.executable)
    shape = "1,2,32,64"
    # A fixed count of requests, not perf_analyzer's default search for a stable window:
    # stability is a judgment of timing, which a loaded machine can fail (no test here
    # may depend on timing); the stability bound is lifted for the same reason.
    cmd = [binary, "-m", "attention_fp16", "-u", server.url[len("http://"):], "-i", "http",
           "--input-data", "zero", "--concurrency-range", "2",
           "--request-count", "100", "--stability-percentage", "100000",
           "-f", str(tmp_path / "perf.csv")]
    for name in "qkv":
        cmd += ["--shape", "%s:%s" % (name, shape)]
    ok0, other0 = infer_counts(server.url)
    p = subprocess.run(cmd, env=perf_analyzer_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, "perf_analyzer failed (%d):\n%s\n%s" % (p.returncode, p.stdout,
                                                                      p.stderr)
    assert "Throughput" in p.stdout and "error" not in p.stdout.lower(), p.stdout
    # every infer request it sent was answered 200 (a request is counted once its
    # connection is done with it, which perf_analyzer's exit has seen to)
    ok, other = infer_counts(server.url)
    assert ok > ok0 and other == other0, (ok0, other0, ok, other)
    assert glob.glob(str(tmp_path / "perf.csv"))


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("cu_dtype", ["INT32", "INT64"])
def test_varlen_against_float64_per_sequence(triton, cu_dtype, binary):
    """A variable-length batch (sequences packed along N, a sequence with no query and one
    with no key among them): each sequence's rows against float64 of that sequence alone."""
    lq, lk = [6, 0, 19, 4], [6, 11, 27, 0]
    cq = np.concatenate([[0], np.cumsum(lq)]).astype(cu_dtype.lower())
    ck = np.concatenate([[0], np.cumsum(lk)]).astype(cu_dtype.lower())
    rng = np.random.default_rng(17)
    q = attn_ref.rand(rng, (4, sum(lq), 16))
    k, v = (attn_ref.rand(rng, (2, sum(lk), 16)) for _ in range(2))
    ins = inputs((q, k, v), "FP32", binary)
    for name, cu in (("cu_seqlens_q", cq), ("cu_seqlens_kv", ck)):
        t = http.InferInput(name, [len(lq) + 1], cu_dtype)
        t.set_data_from_numpy(cu, binary_data=binary)
        ins.append(t)
    outputs = [http.InferRequestedOutput(n, binary_data=binary) for n in ("o", "lse")]
    r = triton.infer("attention", ins, outputs=outputs, parameters={"causal": True})
    o, lse = r.as_numpy("o"), r.as_numpy("lse")
    assert o.shape == q.shape and lse.shape == q.shape[:2]
    for b in range(len(lq)):
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        if lq[b] == 0:
            continue
        if lk[b] == 0:
            # -inf; JSON writes it null, which tritonclient reads as NaN
            assert np.all(o[:, qs] == 0) and np.all(~np.isfinite(lse[:, qs])), "sequence %d" % b
            continue
        o_ref, _, _, lse_ref = attn_ref.reference(q[:, qs], k[:, ks], v[:, ks], True)
        err = attn_ref.rel_err(o[:, qs], o_ref)
        assert err <= TOL["FP32"], "sequence %d: O error %.3g" % (b, err)
        check_stats(lse[:, qs], lse_ref, "lse of sequence %d" % b)
