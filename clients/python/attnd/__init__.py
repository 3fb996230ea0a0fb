"""Python client of attnd, the exact-attention (FlashAttention) HTTP server.

>>> import numpy as np, attnd
>>> c = attnd.Client("http://127.0.0.1:8080")
>>> q = np.random.randn(8, 128, 64).astype(np.float32)      # [H, N, D]
>>> o = c.attention(q, q, q, causal=True)                    # float32 [8, 128, 64]
>>> o, m, l, lse = c.attention(q, q, q, stats=True)          # statistics: float32 [8, 128]

Only the standard library and numpy are used; torch tensors are accepted when torch is
installed (it is never imported by this package). Formats and semantics: the server's
``proto/README.md`` and ``DESIGN.md``.
"""

import http.client
import json as _json
import math
import socket
import sys
import urllib.parse

import numpy as np

from . import safetensors

__version__ = "0.1.0"
__all__ = ["Client", "AttndError", "bf16_to_float32", "float32_to_bf16", "__version__"]

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


# ---------------------------------------------------------------------------------------
# bfloat16 helpers (numpy has no bfloat16: BF16 tensors travel as uint16 raw bits)

def bf16_to_float32(bits):
    """Widen bfloat16 raw bits (a ``uint16``/``int16`` array) to ``float32``, exactly."""
    b = np.asarray(bits)
    return (b.astype(np.uint16).astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16(x):
    """Round ``float32`` values to bfloat16, to nearest even; returns ``uint16`` raw bits."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), r)


# ---------------------------------------------------------------------------------------
# inputs

def _is_torch_tensor(x):
    # Decide without importing torch: only a torch tensor can come from the torch module.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _as_wire(x, name, bf16):
    """Turn one input into ``(dtype_name, array)``, ``array`` in that dtype's storage type."""
    if _is_torch_tensor(x):
        torch = sys.modules["torch"]
        t = x.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            return "BF16", t.view(torch.int16).numpy().view(np.uint16)
        x = t.numpy()
    a = np.asarray(x)
    if bf16:
        if a.dtype in (np.uint16, np.int16):
            return "BF16", a.view(np.uint16)
        if a.dtype.kind in "fiub":
            return "BF16", float32_to_bf16(a.astype(np.float32))
        raise TypeError("%s: cannot send dtype %s as BF16" % (name, a.dtype))
    if a.dtype == np.float16:
        return "F16", a
    if a.dtype == np.float32:
        return "F32", a
    if a.dtype.kind in "fiub":   # float64, ints, bools, nested lists: F32
        return "F32", a.astype(np.float32)
    raise TypeError("%s: unsupported dtype %s (use float32, float16, or bf16=True)"
                    % (name, a.dtype))


def _fmt_bool(b):
    return "true" if b else "false"


def _options(causal, scale, window, stats, backend):
    """The request's options as an ordered dict of Python values (only non-defaults)."""
    opts = {}
    if causal:
        opts["causal"] = True
    if scale is not None:
        opts["scale"] = float(scale)
    if window is None:
        window = (-1, -1)
    try:
        wl, wr = window
    except (TypeError, ValueError):
        raise TypeError("window must be a pair (left, right), got %r" % (window,)) from None
    if wl is None:
        wl = -1
    if wr is None:
        wr = -1
    if int(wl) != -1:
        opts["window_left"] = int(wl)
    if int(wr) != -1:
        opts["window_right"] = int(wr)
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


def _json_number_list(a):
    """A flat list of Python floats (exact for F32, F16 and BF16 values)."""
    return a.astype(np.float64).reshape(-1).tolist()


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

    Each call opens its own connection, so one client may be shared by many threads.
    """

    def __init__(self, url="http://127.0.0.1:8080", timeout=60.0):
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
                conn.request(method, target, body=body, headers=headers or {})
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

    def attention(self, q, k, v, *, causal=False, scale=None, window=(-1, -1), stats=False,
                  backend=None, json=False, bf16=False):
        """Compute ``O = softmax(scale·Q·Kᵀ + mask)·V`` on the server (POST /attention).

        Args:
            q: queries, ``[N, D]``, ``[H, N, D]`` or ``[B, H, N, D]``.
            k, v: keys and values, ``[Nkv, D]``, ``[Hkv, Nkv, D]`` or ``[B, Hkv, Nkv, D]``
                (the same rank as q; Hq a multiple of Hkv for GQA/MQA).
                Each may be a numpy array, a nested list (sent as float32) or a torch
                tensor (any device; detached and copied to the CPU). ``float32`` and
                ``float16`` are sent as they are, other numeric numpy dtypes (float64,
                ints) as float32, a torch ``bfloat16`` tensor as BF16. Shapes are sent as
                given; the server checks them.
            causal: bottom-right aligned causal mask (``window_right = 0``).
            scale: score scale; the server's default is ``1/sqrt(D)``.
            window: ``(left, right)`` keys visible either side of the aligned diagonal;
                -1 (or None) is unbounded.
            stats: also return the softmax statistics m, l and lse.
            backend: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"reference"`` (float64, small
                problems only); None leaves the choice to the server.
            json: send and receive the JSON format instead of safetensors (slower, larger;
                NaN and infinity cannot be sent this way and raise ValueError).
            bf16: send BF16. numpy has no bfloat16: ``uint16``/``int16`` inputs are taken as
                raw bfloat16 bits, floating inputs are rounded to bfloat16 (nearest even)
                first. The returned O is then ``uint16`` raw bits; widen it with
                :func:`bf16_to_float32`.

        Returns:
            O as a numpy array of q's shape and dtype (``uint16`` bits for BF16), or, with
            ``stats=True``, a tuple ``(o, m, l, lse)`` whose statistics are ``float32`` of
            q's shape minus the last dimension. A row with no visible key has o = 0,
            m = lse = -inf and l = 0.

        Raises:
            AttndError: the server refused the request (``.status``, ``.code``,
                ``.message``), or could not be reached (status 0).
        """
        wire = [("q",) + _as_wire(q, "q", bf16), ("k",) + _as_wire(k, "k", bf16),
                ("v",) + _as_wire(v, "v", bf16)]
        opts = _options(causal, scale, window, stats, backend)
        if json:
            doc = {}
            for name, dtype_name, a in wire:
                vals = bf16_to_float32(a) if dtype_name == "BF16" else a
                doc[name] = {"shape": [int(d) for d in a.shape], "dtype": dtype_name,
                             "data": _json_number_list(vals)}
            doc.update(opts)
            try:
                body = _json.dumps(doc, allow_nan=False, separators=(",", ":")).encode()
            except ValueError:
                raise ValueError("attnd: JSON cannot carry NaN or infinity; "
                                 "send json=False to have the server check the values")
            path = "/attention"
            headers = {"Content-Type": "application/json", "Accept": "application/json"}
        else:
            body = safetensors.encode(wire)
            qs = _query_string(opts)
            path = "/attention" + ("?" + qs if qs else "")
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
            out = {n: _from_json_tensor(reply[n], n) for n in ("o", "m", "l", "lse")
                   if n in reply}
        else:
            try:
                out, _ = safetensors.decode(data)
            except safetensors.SafetensorsError as e:
                raise AttndError(status, "bad_reply", str(e))
        if "o" not in out:
            raise AttndError(status, "bad_reply", "the reply holds no tensor o")
        if not stats:
            return out["o"]
        try:
            return out["o"], out["m"], out["l"], out["lse"]
        except KeyError as e:
            raise AttndError(status, "bad_reply", "the reply holds no statistic %s" % e)

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
