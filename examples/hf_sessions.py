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

Needs torch and transformers (the peers venv has both: make bench-peers) and the client in
clients/python (found from this file's place). Exit status 0 when the two runs agree, 1 when
they do not, 2 when attnd cannot be reached.
"""

import argparse
import os
import sys
import threading
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.masking_utils import AttentionMaskInterface
from transformers.modeling_utils import AttentionInterface

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients",
                                "python"))
import attnd  # noqa: E402

# The layer whose update() ran last on this thread: LlamaAttention calls cache.update() and
# then the attention function, which learns its session and layer from here.
_CURRENT = threading.local()


class SessionLayer(CacheLayerMixin):
    """One layer of a KV cache held by an attnd session: it stores nothing here, update()
    hands back only the new k and v, and the length is the server's."""

    is_croppable = False
    is_sliding = False

    def __init__(self, session, layer):
        super().__init__()
        self.session, self.layer = session, layer
        self.sent = []   # (pos, new tokens) of each call, for the report

    def lazy_initialization(self, key_states, value_states):
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        _CURRENT.layer = self
        return key_states, value_states

    def get_mask_sizes(self, query_length):
        return self.get_seq_length() + query_length, 0

    def get_seq_length(self):
        return self.session.lengths[self.layer]

    def get_max_length(self):
        return self.session.max_tokens


class SessionCache(Cache):
    """transformers' Cache over one attnd session (batch 1: one sequence)."""

    def __init__(self, session):
        super().__init__(layers=[SessionLayer(session, i) for i in range(session.layers)])
        self.session = session


def attnd_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                    **kwargs):
    """transformers' attention-function signature: query [1, Hq, Nq, D], key and value
    [1, Hkv, Nnew, D] (the new tokens only, from SessionLayer.update); returns the output
    [1, Nq, Hq, D] and no weights. The mask is the session's bottom-right causal one, so
    attention_mask (None here, see attnd_mask) is not used."""
    layer = getattr(_CURRENT, "layer", None)
    if layer is None or layer.layer != module.layer_idx:
        raise RuntimeError("attn_implementation='attnd' needs cache=SessionCache(session)")
    if query.shape[0] != 1:
        raise ValueError("one session holds one sequence: batch 1")
    pos = layer.get_seq_length()
    o = layer.session.attend(query, key, value, layer=layer.layer, pos=pos, causal=True,
                             scale=scaling)
    layer.sent.append((pos, int(key.shape[-2])))
    _CURRENT.layer = None
    return o.transpose(1, 2).contiguous(), None


def attnd_mask(*args, **kwargs):
    """No mask tensor: the server masks (causal, aligned bottom-right)."""
    return None


AttentionInterface.register("attnd", attnd_attention)
AttentionMaskInterface.register("attnd", attnd_mask)


def make_model(seed):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                         max_position_embeddings=256, initializer_range=0.1,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    return model


def generate(model, prompt, new_tokens, cache=None):
    """Greedy tokens and each step's logits [new_tokens, vocab]."""
    kw = {} if cache is None else {"cache": cache}
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, output_logits=True, return_dict_in_generate=True,
                             pad_token_id=0, **kw)
    return out.sequences[0, prompt.shape[1]:].tolist(), torch.cat(out.logits).float()


def run(args):
    model = make_model(args.seed)
    cfg = model.config
    g = torch.Generator().manual_seed(args.seed + 1)
    prompt = torch.randint(1, cfg.vocab_size, (1, args.prompt), generator=g)

    t0 = time.monotonic()
    ref_tokens, ref_logits = generate(model, prompt, args.new)
    t_ref = time.monotonic() - t0

    client = attnd.Client(args.url, timeout=60)
    model.set_attn_implementation("attnd")
    sid = "hf-sessions-%d" % os.getpid()
    with client.session(sid, heads_kv=cfg.num_key_value_heads,
                        head_dim=cfg.hidden_size // cfg.num_attention_heads, dtype="F32",
                        layers=cfg.num_hidden_layers, max_tokens=args.prompt + args.new) as s:
        cache = SessionCache(s)
        t0 = time.monotonic()
        tokens, logits = generate(model, prompt, args.new, cache)
        t_attnd = time.monotonic() - t0
        lengths = list(s.info()["lengths"])
    model.set_attn_implementation("sdpa")
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
