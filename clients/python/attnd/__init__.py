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

import http.client
import json as _json
import math
import os
import socket
import urllib.parse

import numpy as np

from . import safetensors
from ._tensors import bf16_to_float32, float32_to_bf16, from_wire, result_device, to_wire, \
    f32_to_wire, is_torch_tensor

__version__ = "0.1.0"
__all__ = ["Client", "AttndError", "Session", "sharded_attention", "bf16_to_float32",
           "float32_to_bf16", "__version__"]

_BACKENDS = ("auto", "cpu", "cuda", "reference")


class AttndError(Exception):
    """An error from attnd, or no answer from it.

    Attributes:
        status: the HTTP status (e.g. 422, 413, 503), or 0 when no HTTP reply came back.
        code: the error code of the reply body ``{"error": {"code", "message"}}`` (e.g.
            ``"shape_mismatch"``, ``"queue_full"``); ``"http_error"`` when the body is not
            such JSON; with status 0, ``"unreachable"`` (connecting or sending failed, the
            connection broke) or ``"timeout"`` (no reply within the client's timeout).
        message: the server's message, or a description of the failure.
        retry_after: the ``Retry-After`` header in seconds (503 replies), else None.
    """

    def __init__(self, status, code, message, retry_after=None):
        super().__init__("%s %s: %s" % (status, code, message) if status
                         else "%s: %s" % (code, message))
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after


def _fmt_bool(b):
    return "true" if b else "false"


def _window(window, window_left, window_right):
    """``(left, right)`` from either ``window`` or ``window_left``/``window_right``."""
    if window is None:
        window = (-1, -1)
    try:
        wl, wr = window
    except (TypeError, ValueError):
        raise TypeError("window must be a pair (left, right), got %r" % (window,)) from None
    if window_left is not None or window_right is not None:
        if (wl, wr) not in ((-1, -1), (None, None)):
            raise TypeError("give window=(left, right) or window_left/window_right, not both")
        wl, wr = window_left, window_right
    return (-1 if wl is None else int(wl)), (-1 if wr is None else int(wr))


def _wants_json(json, binary):
    """The wire format: ``json=True`` or ``binary=False`` mean JSON."""
    if binary is None:
        return bool(json)
    if json and binary:
        raise TypeError("json=True and binary=True contradict each other")
    return not binary


def _options(causal, scale, window, stats, backend, softcap=None, diag_offset=None):
    """The request's options as an ordered dict of Python values (only non-defaults)."""
    opts = {}
    if diag_offset is not None:
        opts["diag_offset"] = int(diag_offset)
    if causal:
        opts["causal"] = True
    if scale is not None:
        opts["scale"] = float(scale)
    if softcap:   # None and 0 both mean off
        opts["softcap"] = float(softcap)
    wl, wr = window
    if wl != -1:
        opts["window_left"] = wl
    if wr != -1:
        opts["window_right"] = wr
    if stats:
        opts["stats"] = True
    if backend is not None:
        opts["backend"] = str(backend)
    return opts


def _query_string(opts):
    parts = {}
    for k, v in opts.items():
        if isinstance(v, bool):
            parts[k] = _fmt_bool(v)
        elif isinstance(v, float):
            parts[k] = repr(v)
        else:
            parts[k] = str(v)
    return urllib.parse.urlencode(parts)


def _cu_seqlens(wire, cu_seqlens_q, cu_seqlens_kv):
    """Appends the offsets of a variable-length batch to ``wire`` (I32 stays I32, any
    other integer type goes as I64)."""
    if (cu_seqlens_q is None) != (cu_seqlens_kv is None):
        raise TypeError("give both cu_seqlens_q and cu_seqlens_kv, or neither")
    for name, x in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_kv", cu_seqlens_kv)):
        if x is None:
            continue
        if is_torch_tensor(x):
            x = x.detach().to("cpu").numpy()
        a = np.asarray(x)
        if a.dtype.kind not in "iu":
            raise TypeError("%s: offsets must be integers, not %s" % (name, a.dtype))
        wire.append((name, "I32", a.astype(np.int32)) if a.dtype == np.int32
                    else (name, "I64", a.astype(np.int64)))


def _json_tensor(dtype_name, a, null_is_neg_inf):
    """``{"shape", "dtype", "data"}``; data as Python floats (exact for F32, F16, BF16)."""
    if dtype_name in ("I32", "I64"):
        return {"shape": [int(d) for d in a.shape], "dtype": dtype_name,
                "data": [int(x) for x in a.reshape(-1)]}
    vals = bf16_to_float32(a) if dtype_name == "BF16" else a
    data = vals.astype(np.float64).reshape(-1).tolist()
    if null_is_neg_inf:   # a statistic: JSON has no -inf, the wire's null stands for it
        data = [None if x == -math.inf else x for x in data]
    return {"shape": [int(d) for d in a.shape], "dtype": dtype_name, "data": data}


def _json_body(wire, opts):
    doc = {name: _json_tensor(dtype_name, a, name == "lse") for name, dtype_name, a in wire}
    doc.update(opts)
    try:
        return _json.dumps(doc, allow_nan=False, separators=(",", ":")).encode()
    except ValueError:
        raise ValueError("attnd: JSON cannot carry NaN or infinity; "
                         "send json=False to have the server check the values") from None


# ---------------------------------------------------------------------------------------
# outputs

def _from_json_tensor(t, name):
    try:
        shape = tuple(int(d) for d in t["shape"])
        dtype_name = t.get("dtype", "F32")
        data = t["data"]
    except (KeyError, TypeError, ValueError, AttributeError):
        raise AttndError(200, "bad_reply", "tensor %r in the JSON reply is malformed" % name)
    # null is -inf (a statistic of a row with no visible key).
    vals = np.array([-math.inf if x is None else x for x in data], dtype=np.float64)
    if dtype_name == "F32":
        a = vals.astype(np.float32)
    elif dtype_name == "F16":
        a = vals.astype(np.float16)
    elif dtype_name == "BF16":
        a = float32_to_bf16(vals.astype(np.float32))   # exact: the values are BF16 values
    else:
        raise AttndError(200, "bad_reply", "tensor %r has unknown dtype %r" % (name, dtype_name))
    return a.reshape(shape)


class Client:
    """A client of one attnd server.

    Args:
        url: the server's base URL, ``http://host:port`` (``https://`` works too, as does a
            path prefix behind a proxy).
        timeout: seconds to wait for connecting and for each read; ``None`` waits forever.
        api_key: the key of a server started with ``--api-key``, sent as ``Authorization:
            Bearer KEY``; ``None`` takes ``ATTND_API_KEY`` from the environment (the variable
            the server reads too), and no key is sent when that is unset or empty.

    Each call opens its own connection, so one client may be shared by many threads.
    """

    def __init__(self, url="http://127.0.0.1:8080", timeout=60.0, api_key=None):
        u = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
        if u.scheme not in ("http", "https"):
            raise ValueError("attnd.Client: unsupported URL scheme %r" % u.scheme)
        if not u.hostname:
            raise ValueError("attnd.Client: no host in %r" % url)
        self.url = url
        self.timeout = timeout
        self._https = u.scheme == "https"
        self._host = u.hostname
        self._port = u.port or (443 if self._https else 80)
        self._prefix = u.path.rstrip("/")
        key = os.environ.get("ATTND_API_KEY") if api_key is None else api_key
        if key and any(not ("!" <= c <= "~") for c in key):
            raise ValueError("attnd.Client: an API key is printable ASCII without spaces")
        self._auth = {"Authorization": "Bearer " + key} if key else {}

    def __repr__(self):
        return "attnd.Client(%r, timeout=%r)" % (self.url, self.timeout)

    # -- transport ----------------------------------------------------------------------

    def _request(self, method, path, body=None, headers=None):
        """One HTTP exchange; returns ``(status, headers, body bytes)`` or raises AttndError."""
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=self.timeout)
        target = self._prefix + path
        try:
            try:
                conn.request(method, target, body=body, headers={**(headers or {}), **self._auth})
            except (BrokenPipeError, ConnectionResetError) as send_err:
                # The server may answer before reading the whole body (413 from
                # Content-Length, 503 queue_full) and close: its reply is still readable.
                try:
                    resp = conn.getresponse()
                except (OSError, http.client.HTTPException):
                    raise AttndError(0, "unreachable", "%s %s: %s" % (method, self.url, send_err))
            else:
                resp = conn.getresponse()
            n = resp.getheader("Content-Length")
            if n is not None and n.isdigit():
                # Read into a bytearray so that arrays viewing it are writable.
                data = bytearray(int(n))
                got = resp.readinto(data) if data else 0
                if got != len(data):
                    raise AttndError(0, "unreachable", "%s %s: reply cut after %d of %d bytes"
                                     % (method, self.url, got, len(data)))
            else:
                data = bytearray(resp.read())
            return resp.status, resp, data
        except AttndError:
            raise
        except socket.timeout as e:
            raise AttndError(0, "timeout", "%s %s: no reply within %ss (%s)"
                             % (method, self.url, self.timeout, e)) from e
        except (OSError, http.client.HTTPException) as e:
            raise AttndError(0, "unreachable", "%s %s: %s" % (method, self.url, e)) from e
        finally:
            conn.close()

    @staticmethod
    def _error(status, resp, data):
        retry = resp.getheader("Retry-After")
        retry = int(retry) if retry is not None and retry.strip().isdigit() else None
        try:
            err = _json.loads(bytes(data).decode("utf-8"))["error"]
            code, message = str(err["code"]), str(err["message"])
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            code = "http_error"
            message = "HTTP %d %s: %s" % (status, resp.reason,
                                          bytes(data[:200]).decode("utf-8", "replace"))
        return AttndError(status, code, message, retry)

    def _get_json(self, path):
        status, resp, data = self._request("GET", path, headers={"Accept": "application/json"})
        if status != 200:
            raise self._error(status, resp, data)
        try:
            return _json.loads(bytes(data).decode("utf-8"))
        except ValueError as e:
            raise AttndError(status, "bad_reply", "%s: reply is not JSON: %s" % (path, e))

    # -- endpoints ----------------------------------------------------------------------

    def _compute(self, path, wire, opts, as_json, names):
        """POST ``wire`` tensors with ``opts``; returns the reply's tensors ``names`` (all
        of them, else AttndError bad_reply) as wire arrays (``uint16`` bits for BF16)."""
        return self._exchange(path, wire, opts, as_json, names)[0]

    def _exchange(self, path, wire, opts, as_json, names):
        """:meth:`_compute` that also returns what came beside the tensors: ``(tensors,
        fields, resp)`` with ``fields`` the JSON reply's other top-level members or the
        safetensors reply's ``__metadata__``, and ``resp`` the reply (its headers)."""
        if as_json:
            body = _json_body(wire, opts)
            headers = {"Content-Type": "application/json", "Accept": "application/json"}
        else:
            body = safetensors.encode(wire)
            qs = _query_string(opts)
            path += "?" + qs if qs else ""
            headers = {"Content-Type": "application/octet-stream",
                       "Accept": "application/octet-stream"}
        status, resp, data = self._request("POST", path, body=body, headers=headers)
        if status != 200:
            raise self._error(status, resp, data)
        ctype = (resp.getheader("Content-Type") or "").split(";")[0].strip()
        if ctype == "application/json":
            try:
                reply = _json.loads(bytes(data).decode("utf-8"))
            except ValueError as e:
                raise AttndError(status, "bad_reply", "reply is not JSON: %s" % e)
            if not isinstance(reply, dict):
                raise AttndError(status, "bad_reply", "the JSON reply is not an object")
            out = {n: _from_json_tensor(reply[n], n) for n in names if n in reply}
            fields = {n: x for n, x in reply.items() if not isinstance(x, dict)}
        else:
            try:
                out, fields = safetensors.decode(data)
            except safetensors.SafetensorsError as e:
                raise AttndError(status, "bad_reply", str(e))
        missing = [n for n in names if n not in out]
        if missing:
            raise AttndError(status, "bad_reply", "the reply holds no tensor %s" % missing[0])
        return out, fields, resp

    def attention(self, q, k, v, *, causal=False, scale=None, window=(-1, -1),
                  window_left=None, window_right=None, stats=False, backend=None, json=False,
                  binary=None, bf16=False, softcap=None, alibi_slopes=None, diag_offset=None,
                  cu_seqlens_q=None, cu_seqlens_kv=None):
        """Compute ``O = softmax(scale·Q·Kᵀ + mask)·V`` on the server (POST /attention).

        Args:
            q: queries, ``[N, D]``, ``[H, N, D]`` or ``[B, H, N, D]``.
            k, v: keys and values, ``[Nkv, D]``, ``[Hkv, Nkv, D]`` or ``[B, Hkv, Nkv, D]``
                (the same rank as q; Hq a multiple of Hkv for GQA/MQA).
                Each may be a numpy array, a nested list (sent as float32) or a torch
                tensor (any device, any strides; detached and copied to the CPU).
                ``float32`` and ``float16`` are sent as they are, a torch ``bfloat16``
                tensor or an ``ml_dtypes.bfloat16`` array as BF16, other numeric dtypes
                (float64, ints) as float32. Shapes are sent as given; the server checks
                them.
            causal: bottom-right aligned causal mask (``window_right = 0``).
            scale: score scale; the server's default is ``1/sqrt(D)``.
            window: ``(left, right)`` keys visible either side of the aligned diagonal;
                -1 (or None) is unbounded.
            window_left, window_right: the same two numbers given one by one (then leave
                ``window`` out).
            stats: also return the softmax statistics m, l and lse.
            backend: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"reference"`` (float64, small
                problems only); None leaves the choice to the server.
            json: send and receive the JSON format instead of safetensors (slower, larger;
                NaN and infinity cannot be sent this way and raise ValueError).
            binary: the other way to say it: ``binary=False`` is ``json=True``.
            bf16: send BF16 whatever the inputs' dtype: ``uint16``/``int16`` inputs are
                taken as raw bfloat16 bits, other numeric inputs are rounded to bfloat16
                (nearest even) first.
            softcap: FlashAttention's ``softcap`` (Gemma-2): each scaled score s becomes
                ``softcap * tanh(s / softcap)``; None or 0 is off.
            alibi_slopes: FlashAttention's ``alibi_slopes``, float32 ``[Hq]`` or
                ``[B, Hq]``: the bias ``-slope * |i + Nkv - Nq - j|`` is added to the
                scaled (and capped) scores before the mask; sent as F32 whatever its dtype.
            diag_offset: the mask's diagonal ``off`` (key j visible to query i when
                ``i + off - left <= j <= i + off + right``); None keeps ``Nkv - Nq``
                (bottom-right), 0 is torch's top-left ``is_causal``.
            cu_seqlens_q, cu_seqlens_kv: a variable-length batch (FlashAttention's
                ``cu_seqlens``): ``[B+1]`` integer offsets into the sequence axis of q
                ``[Hq, total_q, D]`` and k, v ``[Hkv, total_kv, D]``; each sequence is its
                own problem and O and the statistics come back packed the same way.

        Returns:
            O of q's shape, or, with ``stats=True``, a tuple ``(o, m, l, lse)`` whose
            statistics are float32 of q's shape minus the last dimension. A row with no
            visible key has o = 0, m = lse = -inf and l = 0. When an input is a torch
            tensor, every result is a torch tensor on that input's device, O in the dtype
            sent (float32, float16 or bfloat16); otherwise numpy arrays, BF16 as
            ``ml_dtypes.bfloat16`` when ml_dtypes can be imported and as ``uint16`` raw
            bits (widen with :func:`bf16_to_float32`) when it cannot.

        Raises:
            AttndError: the server refused the request (``.status``, ``.code``,
                ``.message``), or could not be reached (status 0).
        """
        wire = [(n,) + to_wire(x, n, bf16) for n, x in (("q", q), ("k", k), ("v", v))]
        if alibi_slopes is not None:
            wire.append(("alibi_slopes",) + f32_to_wire(alibi_slopes, "alibi_slopes"))
        _cu_seqlens(wire, cu_seqlens_q, cu_seqlens_kv)
        opts = _options(causal, scale, _window(window, window_left, window_right), stats,
                        backend, softcap, diag_offset)
        names = ("o", "m", "l", "lse") if stats else ("o",)
        out = self._compute("/attention", wire, opts, _wants_json(json, binary), names)
        device = result_device(q, k, v)
        got = tuple(from_wire(out[n], device) for n in names)
        return got if stats else got[0]

    def attention_backward(self, q, k, v, o, do, lse=None, *, causal=False, scale=None,
                           window=(-1, -1), window_left=None, window_right=None, backend=None,
                           json=False, binary=None, bf16=False, softcap=None,
                           alibi_slopes=None, diag_offset=None, cu_seqlens_q=None,
                           cu_seqlens_kv=None):
        """The gradients of attention (POST /attention/backward).

        Args:
            q, k, v: the forward pass's inputs, as for :meth:`attention`.
            o: the forward pass's output (q's shape and dtype).
            do: dL/dO, the gradient of the loss with respect to o (q's shape and dtype).
            lse: optionally the forward pass's log-sum-exp statistic (``stats=True``), float32
                of q's shape minus the last dimension, -inf for a row with no visible key;
                without it the server recomputes it.
            causal, scale, window, window_left, window_right, backend, json, binary, bf16,
                softcap, alibi_slopes, diag_offset, cu_seqlens_q, cu_seqlens_kv:
                as for :meth:`attention`, and the same as in the forward pass. The
                ``"auto"`` backend needs a backend with a backward kernel; ``"reference"``
                (float64, small problems) always has one.

        Returns:
            ``(dq, dk, dv)``: dq of q's shape, dk and dv of k's shape (with GQA, summed over
            the query heads that read each kv head), in the kind and dtype rules of
            :meth:`attention`'s O. A row with no visible key contributes nothing.

        Raises:
            AttndError: as for :meth:`attention` (e.g. ``422 shape_mismatch`` when o or do
                does not have q's shape).
        """
        inputs = (("q", q), ("k", k), ("v", v), ("o", o), ("do", do))
        wire = [(n,) + to_wire(x, n, bf16) for n, x in inputs]
        if lse is not None:
            wire.append(("lse",) + f32_to_wire(lse, "lse"))
        if alibi_slopes is not None:
            wire.append(("alibi_slopes",) + f32_to_wire(alibi_slopes, "alibi_slopes"))
        _cu_seqlens(wire, cu_seqlens_q, cu_seqlens_kv)
        opts = _options(causal, scale, _window(window, window_left, window_right), False,
                        backend, softcap, diag_offset)
        names = ("dq", "dk", "dv")
        out = self._compute("/attention/backward", wire, opts, _wants_json(json, binary),
                            names)
        device = result_device(q, k, v, o, do)
        return tuple(from_wire(out[n], device) for n in names)

    # -- sessions -----------------------------------------------------------------------

    def session(self, id, *, heads_kv, head_dim, dtype="F32", layers=1, max_tokens, ttl_s=600,
                history=None):
        """Creates (or finds, made with the same parameters) the server-side KV cache
        ``id`` and returns its :class:`attnd.Session`; see there (``history`` rebuilds it
        when it is gone). ``with client.session(...) as s:`` deletes it when the block
        ends."""
        return Session(self, id, heads_kv=heads_kv, head_dim=head_dim, dtype=dtype,
                       layers=layers, max_tokens=max_tokens, ttl_s=ttl_s, history=history)

    def sessions(self):
        """The caller's sessions (``GET /v1/sessions``): a dict with ``sessions`` (each as
        :meth:`attnd.Session.info` gives it), ``count`` and ``memory`` (``pool_bytes``,
        ``reserved_bytes``, ``used_bytes``, and the caller's share: ``key_reserved_bytes``,
        ``per_key_bytes``)."""
        return self._get_json("/v1/sessions")

    def session_batch(self, sessions, q, k, v, cu_seqlens_q, cu_seqlens_kv, *, pos=None,
                      layer=0, causal=True, scale=None, window=(-1, -1), window_left=None,
                      window_right=None, softcap=None, alibi_slopes=None, stats=False,
                      backend=None, binary=True, json=None):
        """One layer of many sessions in one call (``POST /v1/sessions/_batch``): a model
        runner's batch, all or nothing.

        Args:
            sessions: :class:`attnd.Session` objects or session ids, one per sequence.
            q: ``[Hq, total_q, D]``, the sequences' queries packed along N;
                ``cu_seqlens_q`` ``[len(sessions)+1]`` their offsets.
            k, v: ``[Hkv, total_new, D]``, the new tokens packed the same way, with
                ``cu_seqlens_kv``. Entry e appends its tokens to its session's layer at
                ``pos[e]``, then attends its queries over that layer's keys.
            pos: one position per session; None takes each Session's tracked length
                (ids then need it).
            layer, causal (True by default), scale, window, window_left, window_right,
            softcap, alibi_slopes, stats, backend, binary, json: as for
                :meth:`attnd.Session.attend`.

        Returns:
            O ``[Hq, total_q, D]`` packed (or ``(o, m, l, lse)``), in the caller's kind; the
            Session objects' lengths of that layer follow the call. One refused entry (its
            error names it) refuses the whole call, and nothing is appended anywhere.
        """
        return session_batch(self, sessions, q, k, v, cu_seqlens_q, cu_seqlens_kv, pos=pos,
                             layer=layer, causal=causal, scale=scale, window=window,
                             window_left=window_left, window_right=window_right,
                             softcap=softcap, alibi_slopes=alibi_slopes, stats=stats,
                             backend=backend, binary=binary, json=json)

    def plan(self, seq_q, head_dim, *, batch=1, heads=1, heads_kv=None, seq_kv=None,
             dtype="F32"):
        """The memory plan of standard versus flash attention (GET /attention/plan).

        Returns the server's JSON as a dict: the shape fields, ``"bytes"`` (``q``, ``k``,
        ``v``, ``o``, ``s``, ``p``, ``s_plus_p``, ``m``, ``l``, ``workspace``, totals) and
        ``"ratios"`` (``s_over_q``, ``standard_over_flash``). ``heads_kv`` and ``seq_kv``
        default (on the server) to ``heads`` and ``seq_q``.
        """
        params = {"batch": int(batch), "heads": int(heads), "seq_q": int(seq_q),
                  "head_dim": int(head_dim), "dtype": str(dtype)}
        if heads_kv is not None:
            params["heads_kv"] = int(heads_kv)
        if seq_kv is not None:
            params["seq_kv"] = int(seq_kv)
        return self._get_json("/attention/plan?" + urllib.parse.urlencode(params))

    def info(self):
        """Server information (GET /v1/info): ``version``, ``backends``, ``limits``, ``build``."""
        return self._get_json("/v1/info")

    def metrics(self):
        """The Prometheus text of GET /metrics, as a str."""
        status, resp, data = self._request("GET", "/metrics")
        if status != 200:
            raise self._error(status, resp, data)
        return bytes(data).decode("utf-8")

    def health(self):
        """True when GET /healthz answers 200; False otherwise, including no answer."""
        return self._probe("/healthz")

    def ready(self):
        """True when GET /readyz answers 200 (engine up, not draining); False otherwise,
        including no answer."""
        return self._probe("/readyz")

    def _probe(self, path):
        try:
            status, _, _ = self._request("GET", path)
        except AttndError:
            return False
        return status == 200


from .sessions import Session, session_batch   # noqa: E402  (it uses the helpers above)


# ---------------------------------------------------------------------------------------
# sharded attention

def _f64(x):
    """A result (numpy, BF16 bits or ml_dtypes, torch) as a float64 numpy array."""
    if is_torch_tensor(x):
        return x.detach().to("cpu").double().numpy()
    a = np.asarray(x)
    if a.dtype == np.uint16:   # BF16 bits, ml_dtypes absent
        a = bf16_to_float32(a)
    return a.astype(np.float64)


def _like(merged, example):
    """merged (float64) in the kind, dtype and device of a shard's O."""
    if is_torch_tensor(example):
        torch = __import__("torch")
        return torch.from_numpy(merged).to(device=example.device, dtype=example.dtype)
    a = np.asarray(example)
    if a.dtype == np.uint16:
        return float32_to_bf16(merged.astype(np.float32))
    return merged.astype(a.dtype)


def merge_shards(outs, lses):
    """Exact attention over the union of key shards from each shard's O and lse (float64
    numpy arrays): ``lse = log Σ exp(lseᵢ)``, ``O = Σ exp(lseᵢ − lse)·Oᵢ``. Rows no shard
    sees keep O = 0 and lse = -inf."""
    lse_all = np.stack(lses)
    top = np.max(lse_all, axis=0)
    safe = np.where(np.isfinite(top), top, 0.0)
    w = np.exp(lse_all - safe)                        # -inf shards weigh 0
    total = np.sum(w, axis=0)
    lse = np.where(total > 0, safe + np.log(np.where(total > 0, total, 1.0)), -np.inf)
    norm = np.where(total > 0, total, 1.0)
    o = sum(wi[..., None] * oi for wi, oi in zip(w, outs)) / norm[..., None]
    return o, lse


def sharded_attention(clients, q, k, v, *, causal=False, scale=None, window=(-1, -1),
                      window_left=None, window_right=None, softcap=None, alibi_slopes=None,
                      diag_offset=None, backend=None, json=False, binary=None, bf16=False,
                      return_lse=False):
    """Exact attention with K/V split along the sequence across servers.

    The keys and values are cut into ``len(clients)`` contiguous shards along Nkv (the
    axis before D); shard ``[a, b)`` goes to one server with ``diag_offset = off − a``
    (``off`` the whole problem's, ``Nkv − Nq`` unless ``diag_offset`` is given) and the
    same window, scale, ``softcap`` and ``alibi_slopes``, so that its mask and bias are
    the unsharded ones restricted to its keys. The shards are sent in parallel (one thread
    each) with ``stats=True`` and merged in float64 by :func:`merge_shards`.

    Args:
        clients: :class:`Client` objects or URLs, one per shard (fewer shards when Nkv is
            smaller than their number).
        q, k, v, causal, scale, window, window_left, window_right, backend, json, binary,
        bf16, diag_offset: as for :meth:`Client.attention`.
        softcap, alibi_slopes: passed to every shard when given (servers that lack them
            refuse with 422).
        return_lse: also return the merged lse (float32 numpy, q's shape minus D).

    Returns:
        O in the dtype (and kind) a single server would return, or ``(o, lse)``.
    """
    import concurrent.futures
    cs = [c if isinstance(c, Client) else Client(c) for c in clients]
    if not cs:
        raise ValueError("sharded_attention: no clients")
    nq, nkv = int(q.shape[-2]), int(k.shape[-2])
    off = nkv - nq if diag_offset is None else int(diag_offset)
    n = min(len(cs), nkv)
    bounds = [(i * nkv // n, (i + 1) * nkv // n) for i in range(n)]
    extra = {}
    if softcap is not None:
        extra["softcap"] = softcap
    if alibi_slopes is not None:
        extra["alibi_slopes"] = alibi_slopes

    def one(i):
        a, b = bounds[i]
        return cs[i].attention(q, k[..., a:b, :], v[..., a:b, :], causal=causal, scale=scale,
                               window=window, window_left=window_left,
                               window_right=window_right, stats=True, backend=backend,
                               json=json, binary=binary, bf16=bf16, diag_offset=off - a,
                               **extra)

    with concurrent.futures.ThreadPoolExecutor(max_workers=n) as pool:
        results = list(pool.map(one, range(n)))
    o, lse = merge_shards([_f64(r[0]) for r in results], [_f64(r[3]) for r in results])
    o = _like(o, results[0][0])
    return (o, lse.astype(np.float32)) if return_lse else o
