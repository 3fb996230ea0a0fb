#!/usr/bin/env python3
"""hf_sessions.py — a Hugging Face transformers LM whose attention layers run on an attnd session.

A small Llama (2 layers, hidden 256, 8 query heads, 2 KV heads, vocab 1000) with seeded
random weights (nothing is downloaded; initializer_range 0.1, so that attention is far from
uniform and the tokens do not repeat) generates greedily twice from the same prompt: once
with transformers' own attention ("sdpa", its KV cache in this process), once with the
attention function "attnd" registered in transformers' AttentionInterface, where the KV cache
is one attnd session per sequence (layers = num_hidden_layers) and the process keeps none:
each step sends only the new tokens' q, k and v, the server appends k and v to the layer at
the session's length and attends over all of it. The run passes when both give the same
tokens and every step's logits agree within the tolerance (F32).

  build/attnd --listen 127.0.0.1:8080 &
  build/peers-venv/bin/python examples/hf_sessions.py --url http://127.0.0.1:8080

Needs torch and transformers (the peers venv has both: make bench-peers), the transformers
glue in examples/hf_attnd.py beside this file and the client in clients/python (found from
there). Exit status 0 when the two runs agree, 1 when they do not, 2 when attnd cannot be
reached.
"""

import argparse
import os
import sys
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

from hf_attnd import attnd, generate, on_session


def make_model(seed):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                         max_position_embeddings=256, initializer_range=0.1,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    return model


def run(args):
    model = make_model(args.seed)
    cfg = model.config
    g = torch.Generator().manual_seed(args.seed + 1)
    prompt = torch.randint(1, cfg.vocab_size, (1, args.prompt), generator=g)

    t0 = time.monotonic()
    ref_tokens, ref_logits = generate(model, prompt, args.new)
    t_ref = time.monotonic() - t0

    client = attnd.Client(args.url, timeout=60)
    t0 = time.monotonic()
    tokens, logits, cache, lengths = on_session(model, client, "hf-sessions-%d" % os.getpid(),
                                                prompt, args.new)
    t_attnd = time.monotonic() - t0
    return report(args, cfg, ref_tokens, ref_logits, tokens, logits, cache, lengths,
                  t_ref, t_attnd)


def report(args, cfg, ref_tokens, ref_logits, tokens, logits, cache, lengths, t_ref, t_attnd):
    scale = ref_logits.abs().max().item()
    diff = (logits - ref_logits).abs().max().item() if logits.shape == ref_logits.shape else \
        float("inf")
    sent = cache.layers[0].sent
    # prefill: the whole prompt at pos 0; then one token a step, each at the session's length
    expected = [(0, args.prompt)] + [(args.prompt + i, 1) for i in range(args.new - 1)]
    layers_ok = all(layer.sent == expected for layer in cache.layers)
    same = tokens == ref_tokens
    close = diff <= args.tol * max(1.0, scale)
    print("hf_sessions: transformers %s, torch %s, Llama %d layers, hidden %d, %d q heads, "
          "%d kv heads, vocab %d, seed %d" % (transformers.__version__, torch.__version__,
                                              cfg.num_hidden_layers, cfg.hidden_size,
                                              cfg.num_attention_heads, cfg.num_key_value_heads,
                                              cfg.vocab_size, args.seed))
    print("prompt    %d tokens, %d new tokens greedy; sdpa %.2f s, attnd %.2f s (%s)"
          % (args.prompt, args.new, t_ref, t_attnd, args.url))
    print("sdpa      %s" % ref_tokens)
    print("attnd     %s" % tokens)
    print("tokens    %s" % ("same" if same else "DIFFER"))
    print("logits    max |attnd - sdpa| %.3g (largest |logit| %.3g, tolerance %.1g x max(1, "
          "that)): %s" % (diff, scale, args.tol, "ok" if close else "FAIL"))
    print("wire      per layer: prefill %d tokens at pos 0, then %d steps of 1 token; "
          "session lengths at the end %s: %s"
          % (args.prompt, len(sent) - 1, lengths, "ok" if layers_ok else "FAIL %s" % sent))
    ok = same and close and layers_ok
    print("hf_sessions: %s" % ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=os.environ.get("ATTND_URL", "http://127.0.0.1:8080"),
                   help="the attnd server (default $ATTND_URL or http://127.0.0.1:8080)")
    p.add_argument("--prompt", type=int, default=12, help="prompt tokens (default 12)")
    p.add_argument("--new", type=int, default=16, help="tokens to generate (default 16)")
    p.add_argument("--seed", type=int, default=0, help="weights and prompt seed (default 0)")
    p.add_argument("--tol", type=float, default=1e-4,
                   help="logits tolerance relative to max(1, largest |logit|) (default 1e-4)")
    args = p.parse_args()
    torch.set_num_threads(1)
    try:
        return run(args)
    except attnd.AttndError as e:
        print("hf_sessions: %s" % e, file=sys.stderr)
        return 2 if e.status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
