"""attnd.Client: one server's HTTP transport and its endpoints.

Stateless attention and its backward, the memory plan, sessions (:mod:`attnd.sessions`),
info, metrics and the health probes. Re-exported as :class:`attnd.Client`.
"""

import http.client
import json as _json
import os
import socket
import threading
import urllib.parse

from . import safetensors
from ._http import Connection, PeerClosed as _PeerClosed
from .sessions import Session, import_session, session_batch
from ._tensors import from_wire, result_device, to_wire
from ._wire import AttndError, _cu_seqlens, _f32_inputs, _from_json_tensor, _json_body, \
    _options, _query_string, _wants_json, _window



class Client:
    """A client of one attnd server.

    Args:
        url: the server's base URL, ``http://host:port`` (``https://`` works too, as does a
            path prefix behind a proxy).
        timeout: seconds to wait for connecting and for each read; ``None`` waits forever.
        api_key: the key of a server started with ``--api-key``, sent as ``Authorization:
            Bearer KEY``; ``None`` takes ``ATTND_API_KEY`` from the environment (the variable
            the server reads too), and no key is sent when that is unset or empty.

        spin_us: microseconds to poll for each reply's first bytes before sleeping until it
            comes (plain HTTP only; default 0, never). A thread asleep is woken some tens of
            microseconds after its reply arrives, which is most of a small call's time (a
            session's decode step costs the server about 20): a model runner making one
            such call per layer gains that back for CPU time spent polling.

    Each thread keeps its own connection to the server (HTTP keep-alive), so one client
    may be shared by many threads; one that the server closed while idle is opened again
    (see :meth:`_request`). :meth:`close` closes the calling thread's.
    """

    def __init__(self, url="http://127.0.0.1:8080", timeout=60.0, api_key=None, spin_us=0):
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
        if not 0 <= spin_us <= 1e6:
            raise ValueError("attnd.Client: spin_us is 0 to 1000000 microseconds")
        self.spin_us = spin_us
        self._local = threading.local()

    def __repr__(self):
        return "attnd.Client(%r, timeout=%r)" % (self.url, self.timeout)

    # -- transport ----------------------------------------------------------------------

    def _request(self, method, path, body=None, headers=None):
        """One HTTP exchange on this thread's kept-alive connection; returns ``(status,
        headers, body bytes)`` or raises AttndError.

        A connection that served an earlier call may have been closed by the server since
        (its ``--idle-timeout``): when sending on it fails, or it ends before the first
        byte of a reply, the request goes once more on a new connection. That is safe for
        every endpoint: a session call repeated is answered as a replay. A failure on a new
        connection, or after reply bytes came, is an error."""
        reused = self._conn().sock is not None
        for again in (False, True):
            try:
                return self._exchange_once(method, path, body, headers)
            except _PeerClosed as e:
                if again or not reused:
                    raise AttndError(0, "unreachable", "%s %s: %s"
                                     % (method, self.url, e.err)) from e.err

    def _conn(self):
        """This thread's connection (opened when it first sends): attnd's own plain HTTP
        one (_http.py), or http.client's for HTTPS."""
        conn = getattr(self._local, "conn", None)
        if conn is None and self._https:
            conn = http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout)
        elif conn is None:
            conn = Connection(self._host, self._port, self.timeout, self.spin_us)
        self._local.conn = conn
        return conn

    def close(self):
        """Closes the calling thread's kept-alive connection (the next call opens another)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()

    def _exchange_once(self, method, path, body, headers):
        conn = self._conn()
        try:
            resp = self._send(conn, method, self._prefix + path, body,
                              {**(headers or {}), **self._auth})
            return resp.status, resp, self._read_body(resp, method)
        except (AttndError, _PeerClosed):
            self.close()
            raise
        except socket.timeout as e:
            self.close()
            raise AttndError(0, "timeout", "%s %s: no reply within %ss (%s)"
                             % (method, self.url, self.timeout, e)) from e
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise AttndError(0, "unreachable", "%s %s: %s" % (method, self.url, e)) from e

    @staticmethod
    def _send(conn, method, target, body, headers):
        """Sends the request and reads the reply's head; raises _PeerClosed when the peer
        closed the connection before any byte of a reply."""
        if isinstance(conn, Connection):
            return conn.request(method, target, body, headers)
        try:
            try:
                conn.request(method, target, body=body, headers=headers)
            except (BrokenPipeError, ConnectionResetError):
                # The server may answer before reading the whole body (413 from
                # Content-Length, 503 queue_full) and close: its reply is still readable.
                pass
            # RemoteDisconnected is a ConnectionResetError: the connection ended where the
            # status line was due. A BadStatusLine that is not one got bytes: not caught.
            return conn.getresponse()
        except (BrokenPipeError, ConnectionResetError) as e:
            raise _PeerClosed(e)

    def _read_body(self, resp, method):
        if not isinstance(resp, http.client.HTTPResponse):
            return resp.body  # read whole with its head (_http.py)
        n = resp.getheader("Content-Length")
        if n is not None and n.isdigit():
            # Read into a bytearray so that arrays viewing it are writable.
            data = bytearray(int(n))
            # read() of an empty body still ends the reply, so the connection can carry the next
            got = resp.readinto(data) if data else len(resp.read())
            if got != len(data):
                raise AttndError(0, "unreachable", "%s %s: reply cut after %d of %d bytes"
                                 % (method, self.url, got, len(data)))
            return data
        return bytearray(resp.read())

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
                  cu_seqlens_q=None, cu_seqlens_kv=None, sinks=None):
        """Compute ``O = softmax(scale·Q·Kᵀ + mask)·V`` on the server (POST /attention).

        Args:
            q: queries, ``[N, D]``, ``[H, N, D]`` or ``[B, H, N, D]``.
            k, v: keys ``[Nkv, D]``, ``[Hkv, Nkv, D]`` or ``[B, Hkv, Nkv, D]`` (the same
                rank as q; Hq a multiple of Hkv for GQA/MQA) and values of k's shape but
                for the last dimension, Dv, which may differ from D (DeepSeek's MLA
                prefill: D 192, Dv 128); O then has Dv columns.
                Each may be a numpy array, a nested list (sent as float32) or a torch
                tensor (any device, any strides; detached and copied to the CPU).
                ``float32`` and ``float16`` are sent as they are, a torch ``bfloat16``
                tensor or an ``ml_dtypes.bfloat16`` array as BF16, other numeric dtypes
                (float64, ints) as float32. Shapes are sent as given; the server checks
                them.
            causal: bottom-right aligned causal mask (``window_right = 0``).
            scale: score scale; the server's default is ``1/sqrt(D)`` (q's and k's D,
                whatever Dv).
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
            sinks: gpt-oss's attention sinks, ``[Hq]``, sent as F32 whatever its dtype (a
                torch tensor that requires grad is detached): each query head's softmax
                gets one more key, of logit ``sinks[h]`` (not scaled, masked, capped or
                biased) and value zero, so a row's weights may sum to less than one. m and
                l then count it (``m = max(max_j s_ij, sinks[h])``); None is none.

        Returns:
            O of q's shape with v's last dimension (Dv; the shape the server replies
            with), or, with ``stats=True``, a tuple ``(o, m, l, lse)`` whose
            statistics are float32 of q's shape minus the last dimension. A row with no
            visible key has o = 0, m = lse = -inf and l = 0 (with sinks: m = lse =
            ``sinks[h]``, l = 1). When an input is a torch tensor, every result is a torch
            tensor on that input's device, O in the dtype sent (float32, float16 or
            bfloat16); otherwise numpy arrays, BF16 as ``ml_dtypes.bfloat16`` when
            ml_dtypes can be imported and as ``uint16`` raw bits (widen with
            :func:`bf16_to_float32`) when it cannot.

        Raises:
            AttndError: the server refused the request (``.status``, ``.code``,
                ``.message``), or could not be reached (status 0).
        """
        wire = [(n,) + to_wire(x, n, bf16) for n, x in (("q", q), ("k", k), ("v", v))]
        _f32_inputs(wire, alibi_slopes=alibi_slopes, sinks=sinks)
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
                           cu_seqlens_kv=None, sinks=None):
        """The gradients of attention (POST /attention/backward).

        Args:
            q, k, v: the forward pass's inputs, as for :meth:`attention`.
            o: the forward pass's output (q's shape with v's last dimension Dv, q's dtype).
            do: dL/dO, the gradient of the loss with respect to o (o's shape, q's dtype).
            lse: optionally the forward pass's log-sum-exp statistic (``stats=True``), float32
                of q's shape minus the last dimension, -inf for a row with no visible key;
                without it the server recomputes it.
            causal, scale, window, window_left, window_right, backend, json, binary, bf16,
                softcap, alibi_slopes, diag_offset, cu_seqlens_q, cu_seqlens_kv, sinks:
                as for :meth:`attention`, and the same as in the forward pass. The
                ``"auto"`` backend needs a backend with a backward kernel; ``"reference"``
                (float64, small problems) always has one.

        Returns:
            ``(dq, dk, dv)``: dq of q's shape, dk of k's, dv of v's (Dv columns), as the
            server replies (with GQA, summed over the query heads that read each kv head),
            in the kind and dtype rules of
            :meth:`attention`'s O. A row with no visible key contributes nothing. With
            ``sinks``, ``(dq, dk, dv, dsinks)``: dsinks float32 ``[Hq]``, summed over the
            batch and the rows, ``-Σ exp(sinks[h] - lse)·(dO·O)`` (numpy, or a torch tensor
            as dq is).

        Raises:
            AttndError: as for :meth:`attention` (e.g. ``422 shape_mismatch`` when o or do
                does not have O's shape).
        """
        inputs = (("q", q), ("k", k), ("v", v), ("o", o), ("do", do))
        wire = [(n,) + to_wire(x, n, bf16) for n, x in inputs]
        _f32_inputs(wire, lse=lse, alibi_slopes=alibi_slopes, sinks=sinks)
        _cu_seqlens(wire, cu_seqlens_q, cu_seqlens_kv)
        opts = _options(causal, scale, _window(window, window_left, window_right), False,
                        backend, softcap, diag_offset)
        names = ("dq", "dk", "dv") + (("dsinks",) if sinks is not None else ())
        out = self._compute("/attention/backward", wire, opts, _wants_json(json, binary),
                            names)
        device = result_device(q, k, v, o, do)
        return tuple(from_wire(out[n], device) for n in names)

    # -- sessions -----------------------------------------------------------------------

    def session(self, id, *, heads_kv, head_dim, dtype="F32", layers=1, max_tokens, ttl_s=600,
                history=None, head_dim_v=None, v_from_k=None, reserve=None, kv_dtype=None):
        """Creates (or finds, made with the same parameters) the server-side KV cache
        ``id`` and returns its :class:`attnd.Session`; see there (``head_dim_v``: values of
        a head dim of their own; ``v_from_k``: a latent session, MLA's cache of k alone;
        ``reserve="grow"``: memory taken as tokens arrive; ``kv_dtype="F8_E4M3"`` or
        ``"I8"``: rows stored quantized; ``history`` rebuilds it when it is gone). ``with client.session(...) as s:``
        deletes it when the block ends."""
        return Session(self, id, heads_kv=heads_kv, head_dim=head_dim, dtype=dtype,
                       layers=layers, max_tokens=max_tokens, ttl_s=ttl_s, history=history,
                       head_dim_v=head_dim_v, v_from_k=v_from_k, reserve=reserve,
                       kv_dtype=kv_dtype)

    def import_session(self, id, data):
        """Makes session ``id`` from the bytes :meth:`attnd.Session.export` gave (``PUT
        /v1/sessions/{id}/import``), here under this client's key: moving a session from
        another server. Returns its :class:`attnd.Session`; 409 ``session_exists`` when the
        id is taken (an import never replaces a session)."""
        return import_session(self, id, data)

    def sessions(self):
        """The caller's sessions (``GET /v1/sessions``): a dict with ``sessions`` (each as
        :meth:`attnd.Session.info` gives it), ``count`` and ``memory`` (``pool_bytes``,
        ``reserved_bytes``, ``used_bytes``, and the caller's share: ``key_reserved_bytes``,
        ``per_key_bytes``)."""
        return self._get_json("/v1/sessions")

    def session_batch(self, sessions, q, k, v, cu_seqlens_q, cu_seqlens_kv, *, pos=None,
                      layer=0, causal=True, scale=None, window=(-1, -1), window_left=None,
                      window_right=None, softcap=None, alibi_slopes=None, sinks=None,
                      stats=False, backend=None, binary=True, json=None):
        """One layer of many sessions in one call (``POST /v1/sessions/_batch``): a model
        runner's batch, all or nothing.

        Args:
            sessions: :class:`attnd.Session` objects or session ids, one per sequence.
            q: ``[Hq, total_q, D]``, the sequences' queries packed along N;
                ``cu_seqlens_q`` ``[len(sessions)+1]`` their offsets.
            k, v: ``[Hkv, total_new, D]`` and ``[Hkv, total_new, Dv]``, the new tokens
                packed the same way, with ``cu_seqlens_kv``. Entry e appends its tokens to
                its session's layer at ``pos[e]``, then attends its queries over that
                layer's keys. The sessions share one Dv (their ``head_dim_v``); latent
                sessions (``v_from_k``) take k alone: v is then None.
            pos: one position per session; None takes each Session's tracked length
                (ids then need it).
            layer, causal (True by default), scale, window, window_left, window_right,
            softcap, alibi_slopes, sinks, stats, backend, binary, json: as for
                :meth:`attnd.Session.attend`.

        Returns:
            O ``[Hq, total_q, Dv]`` packed (or ``(o, m, l, lse)``), in the caller's kind; the
            Session objects' lengths of that layer follow the call. One refused entry (its
            error names it) refuses the whole call, and nothing is appended anywhere.
        """
        return session_batch(self, sessions, q, k, v, cu_seqlens_q, cu_seqlens_kv, pos=pos,
                             layer=layer, causal=causal, scale=scale, window=window,
                             window_left=window_left, window_right=window_right,
                             softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                             stats=stats, backend=backend, binary=binary, json=json)

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
