"""Python client of attnd, the exact-attention (FlashAttention) HTTP server.

>>> import numpy as np, attnd
>>> c = attnd.Client("http://127.0.0.1:8080")
>>> q = np.random.randn(8, 128, 64).astype(np.float32)      # [H, N, D]
>>> o = c.attention(q, q, q, causal=True)                    # float32 [8, 128, 64]
>>> o, m, l, lse = c.attention(q, q, q, stats=True)          # statistics: float32 [8, 128]
>>> dq, dk, dv = c.attention_backward(q, q, q, o, np.ones_like(o), lse)

Only the standard library and numpy are needed. torch tensors are accepted, and returned,
when torch is installed (this module never imports it; :mod:`attnd.torch` is the autograd
function); ``ml_dtypes.bfloat16`` arrays likewise. Formats and semantics: the server's
``proto/README.md`` and ``docs/design.md``.
"""

from . import safetensors
from ._tensors import bf16_to_float32, float32_to_bf16, from_wire, result_device, to_wire, \
    f32_to_wire, is_torch_tensor
from ._wire import AttndError
from ._client import Client
from .sessions import Session, session_batch
from ._sharded import merge_shards, sharded_attention

__version__ = "0.1.0"
__all__ = ["Client", "AttndError", "Session", "sharded_attention", "bf16_to_float32",
           "float32_to_bf16", "__version__"]

# The classes read as attnd's own (reprs, tracebacks), wherever they are defined.
AttndError.__module__ = Client.__module__ = __name__
