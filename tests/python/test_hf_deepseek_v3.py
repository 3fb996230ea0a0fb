"""transformers' own DeepSeek-V3 attention (Multi-head Latent Attention,
transformers.models.deepseek_v3.modeling_deepseek_v3) routed through attnd against the same
model's eager attention: a tiny random DeepseekV3Config built here (nothing is downloaded),
two layers, float32.

MLA's prefill expands the latent into per-head keys of D = qk_nope_head_dim +
qk_rope_head_dim (16 + 8 here; DeepSeek-V3: 128 + 64) and values of Dv = v_head_dim (16
here; DeepSeek-V3: 128): the values have a head dim of their own. The model's attention
interface hands each layer's q, k, v and its scale (yarn's mscale² / sqrt(D), not 1/sqrt(D),
with the yarn rope configured here) to the function registered below, which calls
attnd.torch.attention (causal, that scale); the eager path is transformers'
eager_attention_forward with the mask transformers builds. Both layers' outputs, the
model's, and the gradients of every attention projection must agree.

It needs torch and transformers, which the test venv does not have: run it with
ATTND_BIN=build/attnd build/peers-venv/bin/python -m pytest -q tests/python/test_hf_deepseek_v3.py
Elsewhere it prints "skipped: <reason>" and skips.
"""

import math

import pytest

import attnd

from attn_ref import rel_err

NAME = "attnd_mla"   # the attention implementation registered here
CALLS = []           # (layer, D, Dv, Nq, Nkv, scale) of each call it served

NOPE, ROPE, DV = 16, 8, 16


def _modules():
    try:
        import torch
        from transformers.masking_utils import AttentionMaskInterface
        from transformers.modeling_utils import AttentionInterface
        from transformers.models.deepseek_v3 import modeling_deepseek_v3
    except ImportError as e:
        print("skipped: torch/transformers not installed (%s)" % e)
        pytest.skip("torch/transformers not installed (%s)" % e)
    import attnd.torch   # noqa: F401
    return torch, (AttentionInterface, AttentionMaskInterface), modeling_deepseek_v3


@pytest.fixture(scope="module")
def hf(request):
    """torch, the modeling module, and the attention implementation NAME registered with
    transformers, calling the session's server (started only when they import)."""
    torch, (AttentionInterface, AttentionMaskInterface), ds = _modules()
    client = request.getfixturevalue("server").client()

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                  **kwargs):
        CALLS.append((module.layer_idx, query.shape[-1], value.shape[-1], query.shape[-2],
                      key.shape[-2], scaling))
        o = attnd.torch.attention(query, key, value, causal=True, scale=scaling, client=client)
        return o.transpose(1, 2).contiguous(), None

    AttentionInterface.register(NAME, attention)
    # No mask tensor: the server masks (causal), as it does for examples/.
    AttentionMaskInterface.register(NAME, lambda *a, **kw: None)
    return torch, ds


def _model(torch, ds, seed=0):
    """Two dense layers (first_k_dense_replace = 2: no experts), 4 heads, q through its
    low-rank projection, kv_lora_rank 32; yarn rope, so that the scale is not 1/sqrt(D)."""
    cfg = ds.DeepseekV3Config(
        vocab_size=96, hidden_size=64, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=2, first_k_dense_replace=2, num_attention_heads=4,
        num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=32, qk_nope_head_dim=NOPE,
        qk_rope_head_dim=ROPE, v_head_dim=DV, n_routed_experts=4, n_group=1, topk_group=1,
        num_experts_per_tok=2, max_position_embeddings=256, initializer_range=0.2,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0})
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    return ds.DeepseekV3Model(cfg).float().eval()


def _run(model, impl, ids):
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
    torch, ds = hf
    model = _model(torch, ds)
    scale = model.layers[0].self_attn.scaling
    assert abs(scale - (NOPE + ROPE) ** -0.5) > 1e-3   # yarn's mscale moved it
    ids = torch.randint(0, 96, (2, 13), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want, want_layers = _run(model, "eager", ids)
        del CALLS[:]
        got, got_layers = _run(model, NAME, ids)
    # both layers went through attnd with D 24 and Dv 16, and the model's own scale
    assert [c[:5] for c in sorted(CALLS)] == [(0, 24, 16, 13, 13), (1, 24, 16, 13, 13)], CALLS
    assert all(math.isclose(c[5], scale) for c in CALLS)
    for i in (0, 1):
        err = rel_err(_np(got_layers[i]), _np(want_layers[i]))
        assert err <= 1e-5, ("layer %d" % i, err)
    assert rel_err(_np(got), _np(want)) <= 1e-5


def test_gradients_match_eager(hf):
    """The backward through attnd (dq, dk of D columns, dv of Dv from the server) against
    eager's autograd: every layer's attention projections, the latent ones included."""
    torch, ds = hf
    model = _model(torch, ds, seed=3)
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
    assert any("kv_b_proj" in n for n in names) and any("q_b_proj" in n for n in names)
    for n in names:
        err = rel_err(_np(grads[NAME][n]), _np(grads["eager"][n]))
        assert err <= 1e-4, (n, err)


def test_module_alone(hf, server):
    """One DeepseekV3Attention built on its own: its q, k, v taken from the module's own
    projections by a recording attention function, and attnd.Client.attention (numpy,
    no autograd) against the module's eager output for them."""
    torch, ds = hf
    model = _model(torch, ds, seed=6)
    attn = model.layers[0].self_attn
    x = torch.randn(1, 9, 64, generator=torch.Generator().manual_seed(7))
    pos = model.rotary_emb(x, torch.arange(9)[None])
    seen = {}

    def record(module, query, key, value, attention_mask, scaling=None, **kwargs):
        seen.update(q=query, k=key, v=value, scale=scaling)
        return ds.eager_attention_forward(module, query, key, value, attention_mask,
                                          scaling=scaling)

    from transformers.modeling_utils import AttentionInterface
    AttentionInterface.register("record", record)
    attn.config._attn_implementation = "record"
    mask = torch.full((9, 9), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        attn(x, pos, mask)
    q, k, v = (seen[n].numpy() for n in "qkv")
    assert q.shape == (1, 4, 9, 24) and k.shape == (1, 4, 9, 24) and v.shape == (1, 4, 9, 16)
    o = server.client().attention(q, k, v, causal=True, scale=seen["scale"])
    want = ds.eager_attention_forward(attn, *(seen[n] for n in "qkv"), mask,
                                      scaling=seen["scale"])[0].transpose(1, 2)
    assert o.shape == (1, 4, 9, 16)
    assert rel_err(o, _np(want)) <= 1e-5
