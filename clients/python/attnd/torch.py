"""attnd as a differentiable torch attention.

>>> import torch, attnd, attnd.torch
>>> c = attnd.Client("http://127.0.0.1:8080")
>>> q = torch.randn(1, 8, 128, 64, requires_grad=True)    # [B, Hq, Nq, D]
>>> k = torch.randn(1, 2, 128, 64, requires_grad=True)    # [B, Hkv, Nkv, D]: GQA
>>> v = torch.randn(1, 2, 128, 64, requires_grad=True)
>>> o = attnd.torch.attention(q, k, v, causal=True, client=c)
>>> o.square().sum().backward()                            # q.grad, k.grad, v.grad
>>> s = torch.zeros(8, requires_grad=True)                 # gpt-oss's sinks, [Hq]
>>> attnd.torch.attention(q, k, v, causal=True, sinks=s, client=c).sum().backward()  # s.grad
>>> v2 = torch.randn(1, 2, 128, 32, requires_grad=True)   # values of their own width, Dv
>>> attnd.torch.attention(q, k, v2, causal=True, client=c).shape   # [1, 8, 128, 32]

The forward pass is POST /attention with ``stats=True``; it saves q, k, v, o and the
log-sum-exp, and the backward pass sends them with dL/dO to POST /attention/backward, so the
server recomputes the probabilities from lse instead of keeping them (FlashAttention's
backward). Importing this module imports torch; ``import attnd`` alone never does.
"""

import torch

from . import Client

__all__ = ["attention", "Attention"]


class Attention(torch.autograd.Function):
    """The autograd function behind :func:`attention`: ``apply(q, k, v, client, options[,
    sinks])`` with ``options`` the keyword arguments of :meth:`attnd.Client.attention` (no
    ``stats``, no ``sinks``)."""

    @staticmethod
    def forward(ctx, q, k, v, client, options, sinks=None):
        o, _, _, lse = client.attention(q, k, v, stats=True, sinks=sinks, **options)
        # The wire has F32, F16 and BF16; anything else (float64) went as F32 and comes back
        # in q's dtype, as torch's own attention would give it.
        o = o.to(q.device, q.dtype)
        ctx.client, ctx.options, ctx.has_sinks = client, options, sinks is not None
        ctx.save_for_backward(q, k, v, o, lse, sinks)
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do):
        q, k, v, o, lse, sinks = ctx.saved_tensors
        got = ctx.client.attention_backward(q, k, v, o, do, lse, sinks=sinks, **ctx.options)
        # On the inputs' device already; autograd casts a float32 gradient of a float64
        # input back to float64. dsinks is F32 on the wire: the sinks' own dtype here
        # (gpt-oss keeps them in the model's, often bfloat16).
        dsinks = got[3].to(sinks.device, sinks.dtype) if ctx.has_sinks else None
        return got[0], got[1], got[2], None, None, dsinks


def attention(q, k, v, causal=False, scale=None, window_left=-1, window_right=-1, client=None,
              backend=None, binary=True, sinks=None):
    """Exact attention computed by an attnd server, differentiable with respect to q, k, v.

    Args:
        q: ``[B, Hq, Nq, D]`` (or ``[Hq, Nq, D]``, ``[Nq, D]``), float32, float16 or
            bfloat16 (float64 is computed in float32), any device and strides.
        k, v: ``[B, Hkv, Nkv, D]`` in q's dtype; Hq a multiple of Hkv (GQA/MQA). v may
            have a last dimension of its own, Dv (DeepSeek's MLA prefill: D 192, Dv 128).
        causal, scale, window_left, window_right: the mask and scale as in
            :meth:`attnd.Client.attention` (the mask aligned bottom-right; -1 unbounded;
            scale None is ``1/sqrt(D)``, q's D whatever Dv).
        client: an :class:`attnd.Client`, or a URL; None is ``attnd.Client()``
            (``http://127.0.0.1:8080``).
        backend: the server backend for both passes (None: the server's choice).
        binary: safetensors on the wire (False: JSON, slower).
        sinks: gpt-oss's attention sinks, ``[Hq]``, any float dtype and device, may require
            grad (a model's parameter): see :meth:`attnd.Client.attention`. None is none.

    Returns:
        O, q's shape with v's last dimension (Dv), q's dtype and device. ``backward()``
        through it calls the server once for dq, dk and dv, each of its input's shape (dk,
        dv summed over each GQA group), and dsinks in the sinks' dtype when given; a row
        with no visible key gets O = 0 and gives no gradient (to the sinks neither: its
        dO·O is 0). Double backward is not supported.
    """
    if client is None or isinstance(client, str):
        client = Client() if client is None else Client(client)
    options = {"causal": causal, "scale": scale, "window_left": window_left,
               "window_right": window_right, "backend": backend, "binary": binary}
    if sinks is None:
        return Attention.apply(q, k, v, client, options)
    return Attention.apply(q, k, v, client, options, sinks)
