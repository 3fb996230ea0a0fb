"""transformers' own gpt-oss attention (transformers.models.gpt_oss.modeling_gpt_oss) routed
through attnd against the same model's eager attention: a tiny random GptOssConfig built
here (nothing is downloaded), one sliding-window layer and one full layer, float32.

The model's attention interface hands each layer's q, k, v, its sinks parameter (``s_aux``)
and its ``sliding_window`` to the function registered below, which calls
attnd.torch.attention (causal, window_left = sliding_window - 1, sinks); the eager path is
transformers' eager_attention_forward (the sink column concatenated to the scores) with the
masks transformers builds. Both layers' outputs, the model's, and the gradients of every
layer's sinks and projections must agree. Then GptOssForCausalLM generates on an attnd
session through examples/hf_attnd.py (which passes each layer's sliding_window and sinks
to the session call) the same greedy tokens, with the same logits, as with eager attention.

It needs torch and transformers, which the test venv does not have: run it with
ATTND_BIN=build/attnd build/peers-venv/bin/python -m pytest -q tests/python/test_hf_gpt_oss.py
Elsewhere it prints "skipped: <reason>" and skips.
"""

import os
import sys

import numpy as np
import pytest

import attnd

from attn_ref import rel_err
from conftest import ROOT

NAME = "attnd_stateless"   # the attention implementation registered here
CALLS = []                 # (layer, window_left, Nq, Nkv) of each call it served


def _modules():
    try:
        import torch
        from transformers.masking_utils import AttentionMaskInterface
        from transformers.modeling_utils import AttentionInterface
        from transformers.models.gpt_oss import modeling_gpt_oss
    except ImportError as e:
        print("skipped: torch/transformers not installed (%s)" % e)
        pytest.skip("torch/transformers not installed (%s)" % e)
    import attnd.torch   # noqa: F401
    return torch, (AttentionInterface, AttentionMaskInterface), modeling_gpt_oss


@pytest.fixture(scope="module")
def hf(request):
    """torch, the modeling module, and the attention implementation NAME registered with
    transformers, calling the session's server (started only when they import)."""
    torch, (AttentionInterface, AttentionMaskInterface), gpt_oss = _modules()
    client = request.getfixturevalue("server").client()

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                  sliding_window=None, s_aux=None, **kwargs):
        # transformers' sliding window shows key j to query i when i - j < sliding_window
        left = sliding_window - 1 if sliding_window else -1
        CALLS.append((module.layer_idx, left, query.shape[-2], key.shape[-2]))
        o = attnd.torch.attention(query, key, value, causal=True, scale=scaling,
                                  window_left=left, sinks=s_aux, client=client)
        return o.transpose(1, 2).contiguous(), None

    AttentionInterface.register(NAME, attention)
    # No mask tensor: the server masks (causal, the window), as it does for examples/.
    AttentionMaskInterface.register(NAME, lambda *a, **kw: None)
    return torch, gpt_oss


def _config(gpt_oss):
    return gpt_oss.GptOssConfig(
        num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"],
        sliding_window=4, vocab_size=96, hidden_size=64, intermediate_size=32, head_dim=16,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=256, initializer_range=0.2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def _model(torch, gpt_oss, seed=0, lm=False):
    """Two layers, sliding (window 4) then full, GQA 4/2, D 16; sinks drawn far from their
    initial ~0 so that they weigh in the softmax. lm: GptOssForCausalLM."""
    cfg = _config(gpt_oss)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = (gpt_oss.GptOssForCausalLM if lm else gpt_oss.GptOssModel)(cfg).float().eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for layer in (model.model if lm else model).layers:
            layer.self_attn.sinks.copy_(torch.empty(4).uniform_(-1.0, 2.0, generator=g))
    return model


def _run(model, impl, ids, grad=False):
    """The model's last hidden state and each layer's attention output (after o_proj)
    with attention implementation impl."""
    model.set_attn_implementation(impl)
    outs = {}
    hooks = [layer.self_attn.register_forward_hook(
        lambda mod, args, out, i=i: outs.__setitem__(i, out[0]))
        for i, layer in enumerate(model.layers)]
    try:
        hidden = model(ids).last_hidden_state
    finally:
        for h in hooks:
            h.remove()
    return hidden, outs


def _np(t):
    return t.detach().double().numpy()


def test_attention_matches_eager(hf):
    torch, gpt_oss = hf
    model = _model(torch, gpt_oss)
    ids = torch.randint(0, 96, (2, 13), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want, want_layers = _run(model, "eager", ids)
        del CALLS[:]
        got, got_layers = _run(model, NAME, ids)
    # both layers went through attnd, the sliding one with its window
    assert sorted(CALLS) == [(0, 3, 13, 13), (1, -1, 13, 13)], CALLS
    for i in (0, 1):
        err = rel_err(_np(got_layers[i]), _np(want_layers[i]))
        assert err <= 1e-5, ("layer %d" % i, err)
    assert rel_err(_np(got), _np(want)) <= 1e-5
    # the sinks weigh: with each at -30 (no weight left) the answer moves
    with torch.no_grad():
        for layer in model.layers:
            layer.self_attn.sinks.fill_(-30.0)
        plain, _ = _run(model, NAME, ids)
    assert rel_err(_np(plain), _np(want)) > 1e-3


def test_gradients_match_eager(hf):
    """The backward through attnd (dq, dk, dv, dsinks from the server) against eager's
    autograd: every layer's sinks and q, k, v projections."""
    torch, gpt_oss = hf
    model = _model(torch, gpt_oss, seed=3)
    ids = torch.randint(0, 96, (1, 11), generator=torch.Generator().manual_seed(4))
    w = torch.randn(1, 11, 64, generator=torch.Generator().manual_seed(5))
    grads = {}
    for impl in ("eager", NAME):
        model.zero_grad()
        hidden, _ = _run(model, impl, ids)
        (hidden * w).sum().backward()
        grads[impl] = {name: p.grad.detach().clone() for name, p in model.named_parameters()
                       if "self_attn" in name and p.grad is not None}
    names = sorted(grads["eager"])
    assert sorted(grads[NAME]) == names
    assert any(n.endswith("sinks") for n in names) and any("k_proj" in n for n in names)
    for n in names:
        err = rel_err(_np(grads[NAME][n]), _np(grads["eager"][n]))
        assert err <= 1e-4, (n, err)
    sinks_grad = _np(grads[NAME]["layers.0.self_attn.sinks"])
    assert np.all(np.abs(sinks_grad) > 0)


def test_generation_on_sessions(hf, server):
    """9 prompt tokens and 12 greedy steps: past the sliding window of 4 on the session,
    which keeps every token and masks at each call."""
    torch, gpt_oss = hf
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import hf_attnd
    model = _model(torch, gpt_oss, seed=6, lm=True)
    prompt = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(7))
    want, want_logits = hf_attnd.generate(model, prompt, 12)
    got, logits, _, lengths = hf_attnd.on_session(model, server.client(), "gpt-oss-tiny",
                                                  prompt, 12)
    assert got == want
    assert rel_err(_np(logits), _np(want_logits)) <= 1e-5
    assert lengths == [9 + 11, 9 + 11]
