"""hf_attnd.py — transformers' attention on attnd sessions: what examples/hf_sessions.py and
examples/real_model.py share.

Importing it registers the attention function "attnd" in transformers' AttentionInterface
(and a mask function of the same name that makes no mask: the server masks). A model set to
it with model.set_attn_implementation("attnd") and given cache=SessionCache(session) keeps no
KV cache in the process: each layer's attention sends only the new tokens' q, k and v, and the
server appends k and v to that layer of the session at its length and attends over all of it.
One session holds one sequence (batch 1), with layers = num_hidden_layers.
"""

import os
import sys
import threading

import torch
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.masking_utils import AttentionMaskInterface
from transformers.modeling_utils import AttentionInterface

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients",
                                "python"))
import attnd  # noqa: E402,F401  (re-exported for the examples)

# The layer whose update() ran last on this thread: the attention modules call
# cache.update() and then the attention function, which learns its session and layer here.
_CURRENT = threading.local()

# torch dtype -> the session dtype that holds it as it is
SESSION_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


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
                    sliding_window=None, s_aux=None, **kwargs):
    """transformers' attention-function signature: query [1, Hq, Nq, D], key and value
    [1, Hkv, Nnew, D] (the new tokens only, from SessionLayer.update); returns the output
    [1, Nq, Hq, D] and no weights. The mask is the session's bottom-right causal one, so
    attention_mask (None here, see attnd_mask) is not used. A layer's sliding_window
    (Mistral, gpt-oss: key j visible to query i when i - j < sliding_window) goes as
    window_left, and gpt-oss's sinks (s_aux, [Hq]) as the call's sinks."""
    layer = getattr(_CURRENT, "layer", None)
    if layer is None or layer.layer != module.layer_idx:
        raise RuntimeError("attn_implementation='attnd' needs cache=SessionCache(session)")
    if query.shape[0] != 1:
        raise ValueError("one session holds one sequence: batch 1")
    pos = layer.get_seq_length()
    left = sliding_window - 1 if sliding_window else -1
    o = layer.session.attend(query, key, value, layer=layer.layer, pos=pos, causal=True,
                             scale=scaling, window_left=left, sinks=s_aux)
    layer.sent.append((pos, int(key.shape[-2])))
    _CURRENT.layer = None
    return o.transpose(1, 2).contiguous(), None


def attnd_mask(*args, **kwargs):
    """No mask tensor: the server masks (causal, aligned bottom-right)."""
    return None


AttentionInterface.register("attnd", attnd_attention)
AttentionMaskInterface.register("attnd", attnd_mask)


def session_shape(config):
    """(heads, kv heads, head dim) of a transformers config's attention."""
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return heads, kv, head_dim


def generate(model, prompt, new_tokens, cache=None, pad_token_id=0):
    """Exactly new_tokens greedy tokens after prompt [1, N] (no early stop at EOS), and each
    step's logits [new_tokens, vocab]; with cache, on it."""
    kw = {} if cache is None else {"cache": cache}
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, output_logits=True, return_dict_in_generate=True,
                             pad_token_id=pad_token_id, **kw)
    return out.sequences[0, prompt.shape[1]:].tolist(), torch.cat(out.logits).float()


def on_session(model, client, sid, prompt, new_tokens, pad_token_id=0):
    """generate() with model's attention on one new attnd session of the model's shape
    (deleted at the end); returns (tokens, logits, cache, the session's lengths at the
    end). The model is left on the attention implementation it had."""
    cfg = model.config
    _, kv, head_dim = session_shape(cfg)
    before = cfg._attn_implementation
    model.set_attn_implementation("attnd")
    try:
        with client.session(sid, heads_kv=kv, head_dim=head_dim,
                            dtype=SESSION_DTYPES[model.dtype], layers=cfg.num_hidden_layers,
                            max_tokens=prompt.shape[1] + new_tokens) as s:
            cache = SessionCache(s)
            tokens, logits = generate(model, prompt, new_tokens, cache, pad_token_id)
            lengths = list(s.info()["lengths"])
    finally:
        model.set_attn_implementation(before)
    return tokens, logits, cache, lengths
