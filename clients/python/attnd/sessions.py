"""Sessions: a KV cache held by the server, so that a decoding step sends only its new tokens.

>>> import numpy as np, attnd
>>> c = attnd.Client("http://127.0.0.1:8080")
>>> with c.session("chat-1", heads_kv=2, head_dim=64, max_tokens=4096) as s:
...     q, k, v = (np.random.randn(h, 12, 64).astype(np.float32) for h in (8, 2, 2))
...     o = s.attend(q, k, v)                        # prefill at pos 0: 12 tokens, causal
...     for _ in range(4):                           # decode: one query and one new k, v
...         q1, k1, v1 = (np.random.randn(h, 1, 64).astype(np.float32) for h in (8, 2, 2))
...         o1 = s.attend(q1, k1, v1)                # pos 12, 13, ... tracked by the session
...     s.lengths                                    # [16]
... # deleted on leaving the block

Values may have a head dim of their own (``head_dim_v``, DeepSeek's MLA prefill: D 192, Dv
128), and a latent session (``v_from_k=Dv``) keeps k alone, its v being the first Dv columns
of each k row: MLA's absorbed decode, whose calls send q and k only:

>>> with c.session("mla-1", heads_kv=1, head_dim=576, v_from_k=512, dtype="BF16",
...                max_tokens=4096) as s:             # 512 latent + 64 rope columns
...     o = s.attend(q_absorbed, c_kv_pe)            # q [H, 1, 576], k [1, 1, 576]: o [H, 1, 512]

A session forks into others that share its tokens' memory (beam search, parallel sampling):

>>> beams = [s.fork("chat-1-beam%d" % i) for i in range(4)]   # each then appends its own

The routes are ``/v1/sessions/{id}`` (PUT create, GET, DELETE), ``.../attention``,
``.../truncate``, ``.../fork`` and ``/v1/sessions/_batch``. This module is imported by
``import attnd``; :meth:`attnd.Client.session` and :meth:`attnd.Client.session_batch` are its
entry points.
"""

import json as _json
import re
import urllib.parse

import numpy as np

from ._wire import AttndError, _cu_seqlens, _f32_inputs, _options, _window
from ._tensors import bf16_to_float32, from_wire, result_device, to_wire

__all__ = ["Session", "session_batch"]

_DTYPES = ("F32", "F16", "BF16")
_ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2}
# The k and v of one re-prefill call: a body far below the server's default --max-body (1G)
# that still takes a long history in few calls.
_PREFILL_BYTES = 64 << 20
_ID = re.compile(r"[A-Za-z0-9-][A-Za-z0-9._-]{0,127}\Z")


def _check_id(sid):
    if not isinstance(sid, str) or not _ID.match(sid):
        raise ValueError("attnd: a session id is 1-128 of [A-Za-z0-9._-], not starting with "
                         "'_' or '.' (got %r)" % (sid,))
    return sid


def _path(sid, tail=""):
    return "/v1/sessions/" + urllib.parse.quote(sid, safe="") + tail


def _json_call(client, method, path, doc=None, ok=(200,)):
    """A JSON request (or none) and its JSON reply; ``(status, dict or None)``."""
    body = None if doc is None else _json.dumps(doc, separators=(",", ":")).encode()
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    status, resp, data = client._request(method, path, body=body, headers=headers)
    if status not in ok:
        raise client._error(status, resp, data)
    if not data:
        return status, None
    try:
        return status, _json.loads(bytes(data).decode("utf-8"))
    except ValueError as e:
        raise AttndError(status, "bad_reply", "%s %s: reply is not JSON: %s" % (method, path, e))


def _as_dtype(x, name, dtype):
    """An input as ``(dtype_name, array)`` in the session's dtype (converted when it is not:
    the server wants q, k, v in the dtype the session was made with)."""
    dt, a = to_wire(x, name, bf16=dtype == "BF16")
    if dt == dtype:
        return dt, a
    wide = bf16_to_float32(a) if dt == "BF16" else a
    return dtype, wide.astype(np.float32 if dtype == "F32" else np.float16)


def _array(x):
    """x itself when it has a shape (numpy, torch, ml_dtypes), else a float32 array."""
    return x if hasattr(x, "shape") else np.asarray(x, np.float32)


def _three_d(x, name):
    """The shape a session takes, ``[H, N, D]``, from ``[N, D]``, ``[H, N, D]`` or
    ``[1, H, N, D]`` (the batch of one a model's attention layer holds)."""
    shape = tuple(int(d) for d in x.shape)
    if len(shape) == 2:
        return x.reshape((1,) + shape)
    if len(shape) == 3:
        return x
    if len(shape) == 4 and shape[0] == 1:
        return x.reshape(shape[1:])
    raise ValueError("attnd: %s of shape %s: a session takes [H, N, D] (or [N, D], "
                     "[1, H, N, D])" % (name, list(shape)))


def _reply_length(fields, resp, name="length"):
    """The layer's length after a call: the X-Session-Length header, else the reply's
    ``length`` (a JSON field, or a safetensors ``__metadata__`` string)."""
    h = resp.getheader("X-Session-Length")
    val = h if h is not None else fields.get(name)
    try:
        return int(val)
    except (TypeError, ValueError):
        raise AttndError(200, "bad_reply", "the reply gives no session length") from None


def _results(out, names, device, q_shape):
    """The reply's tensors in the caller's kind, o in q's shape with the reply's last
    dimension (the values' Dv) and the statistics in q's shape minus D."""
    got = []
    for n in names:
        a = out[n]
        a = a.reshape(q_shape[:-1] + a.shape[-1:] if n == "o" else q_shape[:-1])
        got.append(from_wire(np.ascontiguousarray(a), device))
    return tuple(got) if len(got) > 1 else got[0]


def _wants_json(json, binary):
    """``json`` when given (it wins over the default ``binary=True``), else not ``binary``."""
    return (not binary) if json is None else bool(json)


def _call_options(causal, scale, window, window_left, window_right, softcap, stats, backend):
    opts = _options(False, scale, _window(window, window_left, window_right), stats, backend,
                    softcap)
    opts["causal"] = bool(causal)   # sessions default to causal: say false explicitly
    return opts


class Session:
    """One session of a server: a KV cache of ``layers`` layers of ``[heads_kv, max_tokens,
    head_dim]`` keys and values in ``dtype``, held by the server.

    ``Session(client, id, heads_kv=, head_dim=, ...)`` (or :meth:`attnd.Client.session`)
    creates it with ``PUT /v1/sessions/{id}``: 201 made it, 200 found it made with the same
    parameters (a retried create; its lengths are then read back with :meth:`info`), and
    other parameters raise :class:`attnd.AttndError` 409 ``session_exists``. The server
    reserves the memory of all ``max_tokens`` at once (507 ``session_memory_full`` when it
    cannot) and drops the session ``ttl_s`` seconds after its last use.

    ``history``, when given, rebuilds a session that is gone. A session the server no longer
    has (a replica lost behind a proxy routing by session id, a restart without
    ``--session-dir``, the TTL, a ``DELETE`` from elsewhere) answers 404
    ``session_not_found``; with ``history``, :meth:`attend` and :meth:`truncate` then
    re-create it with the same parameters, re-prefill every layer to the length this object
    had seen and make their call once more. ``history(layer, length)`` must return
    ``(k, v)``, the keys and values of that layer's tokens ``[0, length)``, each
    ``[heads_kv, length, head_dim]`` (numpy arrays, torch tensors or nested lists, in any
    dtype :meth:`attend` takes): what a model runner keeps of its own, or recomputes from
    the token ids. It is called once per layer that holds tokens; its arrays are sent in
    calls of at most 64 MiB. Another shape raises ValueError, and a rebuild that fails
    (that, an error of the server, a second 404) deletes what it had re-created, so that
    no call is answered over part of the history. A session that is back already (another
    client re-created it) is used when it holds the lengths this object had seen, and
    raises 409 ``session_conflict`` when it does not. An older copy (a replica back from a
    restart with the copy it saved while the calls had moved on and rebuilt the session
    elsewhere: fewer tokens than this object has seen on some layer, more on none) is
    deleted and rebuilt the same way, when it refuses an append at the tracked position
    (409 ``session_conflict``) or answers a call without k, v over another length. Without
    ``history`` the 404 is raised.

    ``head_dim_v``, when given, asks for values of a head dim of their own (Dv, from 1 to
    512, as :meth:`attnd.Client.attention` takes them): calls then send v ``[heads_kv,
    Nnew, head_dim_v]`` and get O ``[.., head_dim_v]`` back (DeepSeek's MLA prefill: D 192,
    Dv 128). ``v_from_k=Dv`` makes a latent session instead (MLA's absorbed decode,
    FlashMLA's cache): the server keeps k alone, in half the memory, and reads v as the
    first Dv columns of each k row (Dv at most ``head_dim``; DeepSeek: D 576 = 512 latent
    + 64 rope, Dv 512). Its calls send q and k only, and
    ``history`` returns k alone. A v of another width, or a v sent to a latent session, is
    refused with 422.

    ``reserve="grow"`` asks the server to take the session's memory as its tokens arrive
    rather than all of ``max_tokens`` at create (``"whole"``, the server's default): an
    append the server's session memory cannot hold then raises 507
    ``session_memory_full`` with nothing appended (a whole session's appends never do).

    ``kv_dtype="F8_E4M3"`` or ``"I8"`` asks the server to store each appended token's row
    per KV head quantized, a byte an element and one F32 scale (the row's largest |x| over
    448 or 127), in about half the memory of BF16 rows; calls still send k and v in
    ``dtype`` and attend over the stored rows (code x scale). The dtype's own name, or None
    (not sent), stores them as sent.

    Attributes:
        client, id, heads_kv, head_dim, dtype, layers, max_tokens, ttl_s, history: as
            given.
        head_dim_v: the values' head dim (``v_from_k`` for a latent session, else
            ``head_dim`` when not given).
        v_from_k: True for a latent session.
        reserve: ``"whole"`` or ``"grow"`` as given (None: not sent, the server's whole).
        kv_dtype: ``"F8_E4M3"``, ``"I8"`` or the dtype as given (None: not sent, the
            dtype).
        lengths: the length of each layer as this object last saw it (its creation, an
            :meth:`attend`, :meth:`truncate`, :meth:`info` or batch call); :meth:`attend`
            appends at it when no ``pos`` is given.
        created: True when the create made the session, False when it existed.
        recreated: how many times this object found the session gone (or an older copy
            of it) and rebuilt it.

    A ``with`` block deletes the session when it ends (an already gone session is not an
    error then). One object is not meant for several threads at once: its lengths are
    tracked without a lock.
    """

    def __init__(self, client, id, *, heads_kv, head_dim, dtype="F32", layers=1, max_tokens,
                 ttl_s=600, create=True, history=None, head_dim_v=None, v_from_k=None,
                 reserve=None, kv_dtype=None):
        self.client = client
        self.id = _check_id(id)
        self.heads_kv, self.head_dim = int(heads_kv), int(head_dim)
        # None: not sent on create (servers that predate head_dim_v take the session)
        self._dv = None if head_dim_v is None else int(head_dim_v)
        self._latent = None if v_from_k is None else int(v_from_k)
        if None not in (self._dv, self._latent) and self._dv != self._latent:
            raise ValueError("attnd: head_dim_v %d and v_from_k %d differ: a latent session's "
                             "values are v_from_k wide" % (self._dv, self._latent))
        self.v_from_k = self._latent is not None
        if reserve not in (None, "whole", "grow"):
            raise ValueError("attnd: a session's reserve is \"whole\" or \"grow\" (got %r)"
                             % (reserve,))
        self.reserve = reserve
        self.head_dim_v = next(d for d in (self._latent, self._dv, self.head_dim)
                               if d is not None)
        self.dtype = str(dtype).upper()
        if self.dtype not in _DTYPES:
            raise ValueError("attnd: a session's dtype is F32, F16 or BF16 (got %r)" % (dtype,))
        if kv_dtype not in (None, "F8_E4M3", "I8", self.dtype):
            raise ValueError("attnd: a session's kv_dtype is \"F8_E4M3\", \"I8\" or its dtype "
                             "%r (got %r)" % (self.dtype, kv_dtype))
        self.kv_dtype = kv_dtype
        self.layers, self.max_tokens, self.ttl_s = int(layers), int(max_tokens), ttl_s
        self.lengths = [0] * self.layers
        self.created = None
        self.history = history
        self.recreated = 0
        if create:
            self.create()

    @classmethod
    def attach(cls, client, id, history=None):
        """The session ``id`` as the server has it (``GET``), without creating anything;
        404 ``session_not_found`` when there is none. ``history`` is as for the
        constructor."""
        _, info = _json_call(client, "GET", _path(_check_id(id)))
        return cls._of_info(client, info, history)

    @classmethod
    def _of_info(cls, client, info, history):
        """The session a GET's (or a fork's) description describes, not created again."""
        s = cls(client, info["id"], heads_kv=info["heads_kv"], head_dim=info["head_dim"],
                dtype=info["dtype"], layers=info["layers"], max_tokens=info["max_tokens"],
                ttl_s=info.get("ttl_s", 600), create=False, history=history,
                head_dim_v=info.get("head_dim_v"), v_from_k=info.get("v_from_k"),
                reserve=info.get("reserve"), kv_dtype=info.get("kv_dtype"))
        s.lengths = [int(n) for n in info["lengths"]]
        return s

    def __repr__(self):
        values = ("v_from_k=%d" if self.v_from_k else "head_dim_v=%d") % self.head_dim_v
        return ("attnd.Session(%r, heads_kv=%d, head_dim=%d, %s, dtype=%r, layers=%d, "
                "max_tokens=%d, lengths=%r)" % (self.id, self.heads_kv, self.head_dim, values,
                                                self.dtype, self.layers, self.max_tokens,
                                                self.lengths))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.delete(missing_ok=True)
        return False

    def create(self):
        """``PUT /v1/sessions/{id}``; True when it made the session, False when it existed
        with the same parameters (then :attr:`lengths` is read back from the server)."""
        self.created = self._put() == 201
        if not self.created:
            self.info()
        return self.created

    def _put(self):
        """``PUT /v1/sessions/{id}`` with this object's parameters; its status, 201 (made)
        or 200 (it existed with them)."""
        doc = {"heads_kv": self.heads_kv, "head_dim": self.head_dim, "dtype": self.dtype,
               "layers": self.layers, "max_tokens": self.max_tokens}
        if self.ttl_s is not None:
            doc["ttl_s"] = self.ttl_s
        if self._dv is not None:
            doc["head_dim_v"] = self._dv
        if self._latent is not None:
            doc["v_from_k"] = self._latent
        if self.reserve is not None:
            doc["reserve"] = self.reserve
        if self.kv_dtype is not None:
            doc["kv_dtype"] = self.kv_dtype
        status, _ = _json_call(self.client, "PUT", _path(self.id), doc, ok=(200, 201))
        return status

    def info(self):
        """``GET /v1/sessions/{id}``: a dict of its parameters, ``lengths`` (one per layer),
        ``reserve``, ``reserved_bytes`` (a grow session's: what it holds now),
        ``shared_bytes`` (of the pages its forks hold too: :meth:`fork`) and ``expires_in_s``; :attr:`lengths` is updated from it.

        It never re-creates a session that is gone (it raises 404 ``session_not_found``,
        history or not): it is how a caller learns what the server holds."""
        info = self._get()
        self.lengths = [int(n) for n in info["lengths"]]
        return info

    def _get(self):
        return _json_call(self.client, "GET", _path(self.id))[1]

    def delete(self, missing_ok=False):
        """``DELETE /v1/sessions/{id}``: its memory is free at once. A session already gone
        raises 404 ``session_not_found`` unless ``missing_ok``."""
        self._delete(missing_ok)
        self.lengths = [0] * self.layers

    def _delete(self, missing_ok):
        try:
            _json_call(self.client, "DELETE", _path(self.id), ok=(200, 204))
        except AttndError as e:
            if not (missing_ok and e.code == "session_not_found"):
                raise

    def export(self):
        """``GET /v1/sessions/{id}/export``: the session as one safetensors file (bytes):
        its parameters and lengths in ``__metadata__``, ``k.L`` and ``v.L`` per layer.
        :meth:`attnd.Client.import_session` makes it again on another server. Not a use:
        the TTL runs on."""
        status, resp, data = self.client._request(
            "GET", _path(self.id, "/export"), headers={"Accept": "application/octet-stream"})
        if status != 200:
            raise self.client._error(status, resp, data)
        return bytes(data)

    def fork(self, new_id, length=None, *, ttl_s=None, history=None):
        """A new session ``new_id`` holding this one's first ``length`` tokens of every
        layer (``POST /v1/sessions/{id}/fork``; None: each layer's own length), with its
        parameters, reserve and ``ttl_s`` (unless given). The two then change on their own;
        the server stores the pages of the tokens they share once, copying a page only when
        one of them first appends into it, so N forks of a prompt cost about one prompt's
        memory (beam search, parallel sampling). Returns the new :class:`Session`, whose
        :attr:`lengths` are the server's; ``history`` is its own (this one's is not: its
        tokens past the branch differ). Raises 409 ``session_exists`` when ``new_id`` is
        taken, 404 when this session is gone (it is not rebuilt here), 422 for a layer
        shorter than ``length``, 507 when the new session's reservation does not fit."""
        doc = {"id": _check_id(new_id)}
        if length is not None:
            doc["length"] = int(length)
        if ttl_s is not None:
            doc["ttl_s"] = ttl_s
        _, info = _json_call(self.client, "POST", _path(self.id, "/fork"), doc, ok=(201,))
        return Session._of_info(self.client, info, history)

    def truncate(self, length):
        """Cuts every layer longer than ``length`` to ``length`` (``POST .../truncate``):
        a rejected speculative draft. :attr:`lengths` follows. A session found gone is
        rebuilt from ``history`` to the kept lengths only (the rejected tokens need not be
        in the history any more), as :meth:`attend` does."""
        n = int(length)
        kept = [min(x, n) for x in self.lengths]
        self._recovering(lambda: _json_call(self.client, "POST", _path(self.id, "/truncate"),
                                            {"length": n}), kept)
        self.lengths = kept

    def attend(self, q, k=None, v=None, *, layer=0, pos=None, causal=True, scale=None,
               window=(-1, -1), window_left=None, window_right=None, softcap=None,
               alibi_slopes=None, sinks=None, stats=False, backend=None, binary=True,
               json=None):
        """Append k, v to one layer at ``pos``, then attend q over its keys ``[0, pos +
        Nnew)`` (``POST /v1/sessions/{id}/attention``); without k and v, attend over the
        layer's whole length. A latent session's call appends k alone.

        Args:
            q: ``[Hq, Nq, D]`` (also ``[Nq, D]`` or ``[1, Hq, Nq, D]``), Hq a multiple of
                the session's heads_kv.
            k, v: the new tokens, ``[Hkv, Nnew, D]`` and ``[Hkv, Nnew, head_dim_v]``
                (same ranks), or both None; for a latent session k alone (v None: the
                server reads it from k).
                Inputs are numpy arrays, nested lists or torch tensors (as for
                :meth:`attnd.Client.attention`), sent in the session's dtype (converted
                when they are in another).
            layer: which layer (0 to layers - 1).
            pos: where k, v go; None is the layer's length as this object knows it. A
                ``pos`` before the end whose k, v are bit for bit the tokens stored there is
                a replay (nothing appended, the first call's reply); any other pos that is
                not the length raises 409 ``session_conflict``.
            causal: the bottom-right causal mask (``off = pos + Nnew - Nq``); True by
                default here, unlike :meth:`attnd.Client.attention`.
            scale, window, window_left, window_right, softcap, alibi_slopes, sinks,
            stats, backend: as for :meth:`attnd.Client.attention` (sinks ``[Hq]``: the
            call's query heads).
            binary: safetensors on the wire (default); ``binary=False`` or ``json=True``
                is JSON.

        Returns:
            O in q's shape with last dimension ``head_dim_v``, or ``(o, m, l, lse)`` with
            ``stats=True``; torch tensors on q's
            device when an input is a torch tensor, else numpy arrays (O in the session's
            dtype, BF16 as for :meth:`attnd.Client.attention`). :attr:`lengths` ``[layer]``
            becomes the layer's length the server replied with.

        Raises:
            AttndError: 404 ``session_not_found`` (without ``history``, or when the
                session is gone again during or after its rebuild), 409
                ``session_conflict``, 422 ``session_full`` (past max_tokens), 422 for a
                shape or dtype that is not the session's, or any error of ``/attention``.
            ValueError, TypeError: ``history`` gave something other than the k and v the
                rebuild asked for.
        """
        layer = self._layer(layer)
        self._check_kv(k, v)
        if k is None and pos is not None:
            raise TypeError("attnd: pos says where k and v go; there are none")
        q, k, v = (None if x is None else _array(x) for x in (q, k, v))
        q_shape = tuple(int(d) for d in q.shape)
        wire = [("q",) + _as_dtype(_three_d(q, "q"), "q", self.dtype)]
        opts = {"layer": layer}
        if k is not None:
            wire += [(n,) + _as_dtype(_three_d(x, n), n, self.dtype)
                     for n, x in (("k", k), ("v", v)) if x is not None]
            opts["pos"] = self.lengths[layer] if pos is None else int(pos)
        _f32_inputs(wire, alibi_slopes=alibi_slopes, sinks=sinks)
        opts.update(_call_options(causal, scale, window, window_left, window_right, softcap,
                                  stats, backend))
        names = ("o", "m", "l", "lse") if stats else ("o",)
        as_json = _wants_json(json, binary)
        before = list(self.lengths)

        def call():
            out, fields, resp = self.client._exchange(_path(self.id, "/attention"), wire,
                                                      opts, as_json, names)
            n = _reply_length(fields, resp)
            if k is None and self.history is not None and n != before[layer]:
                # attended over keys this object's history does not know: another copy
                raise AttndError(409, "session_conflict",
                                 "session %r attended over %d keys of layer %d, where this "
                                 "object has seen %d" % (self.id, n, layer, before[layer]))
            return out, n

        # pos was fixed above from the lengths before the call, so a retry after a rebuild
        # appends where the first try would have, whatever the server holds by then.
        tracked = k is None or opts["pos"] == before[layer]
        out, self.lengths[layer] = self._recovering(call, before, tracked)
        return _results(out, names, result_device(q, k, v), q_shape)

    def _check_kv(self, k, v):
        if self.v_from_k and v is not None:
            raise TypeError("attnd: session %r is latent (v_from_k %d): it takes q and k only, "
                            "its v being the first %d columns of each k row"
                            % (self.id, self.head_dim_v, self.head_dim_v))
        if not self.v_from_k and (k is None) != (v is None):
            raise TypeError("attnd: give both k and v, or neither")

    # -- rebuilding a session that is gone -----------------------------------------------

    def _recovering(self, call, lengths, tracked=True):
        """call(); when it finds the session gone (404 ``session_not_found``), or, at a
        position this object tracks, an older copy of it (409 ``session_conflict`` while
        the server holds fewer tokens than ``lengths``: a replica back from a restart with
        the copy it saved, after the calls had moved on elsewhere), and there is a history
        callback, the session is rebuilt to ``lengths`` and call() made once more."""
        try:
            return call()
        except AttndError as e:
            if self.history is None:
                raise
            if e.code == "session_conflict" and tracked and self._older(lengths):
                self._delete(missing_ok=True)
            elif e.code != "session_not_found":
                raise
        self._recover(lengths)
        return call()

    def _older(self, lengths):
        """Whether the server's copy is behind this object's on some layer and ahead on
        none: a stale copy, never another writer's newer tokens."""
        have = [int(n) for n in self._get()["lengths"]]
        return have != list(lengths) and all(h <= n for h, n in zip(have, lengths))

    def _recover(self, lengths):
        """Re-create the session and re-prefill each layer to ``lengths`` from history. A
        session that is back already (200: another client re-created it) is taken as it
        is when it holds those lengths, and refused with 409 ``session_conflict`` when not:
        its tokens are not the ones this object's positions count."""
        if self._put() == 201:
            self._refill(lengths)
        else:
            have = [int(n) for n in self._get()["lengths"]]
            if have != list(lengths):
                raise AttndError(409, "session_conflict",
                                 "session %r was gone and is back, re-created by another "
                                 "client with lengths %s, not the %s this object had seen; "
                                 "nothing was appended" % (self.id, have, list(lengths)))
        self.lengths = list(lengths)
        self.recreated += 1

    def _refill(self, lengths):
        try:
            for layer, n in enumerate(lengths):
                if n:
                    self._prefill(layer, n)
        except BaseException:
            # A session holding part of its history would answer over the wrong keys (a
            # call without k, v attends over whatever is there): gone, the next call finds
            # it missing and rebuilds it again.
            self._delete(missing_ok=True)
            raise

    def _prefill(self, layer, n):
        """Tokens [0, n) of one layer from history, in calls of at most _PREFILL_BYTES of k
        and v. Each call needs a q (no dimension may be 0): one query of zeros a KV head,
        the cheapest there is; its output is not read."""
        kv = self._history(layer, n)
        q = ("q",) + _as_dtype(np.zeros((self.heads_kv, 1, self.head_dim), np.float32), "q",
                               self.dtype)
        token_bytes = self.heads_kv * sum(int(x.shape[-1]) for x in kv) * _ITEMSIZE[self.dtype]
        step = max(1, _PREFILL_BYTES // token_bytes)
        for a in range(0, n, step):
            wire = [q] + [(name,) + _as_dtype(x[:, a:a + step], name, self.dtype)
                          for name, x in zip(("k", "v"), kv)]
            self.client._exchange(_path(self.id, "/attention"), wire,
                                  {"layer": layer, "pos": a}, False, ("o",))

    def _history(self, layer, n):
        """history(layer, n), checked: k of exactly [heads_kv, n, head_dim], v of
        [heads_kv, n, head_dim_v] (a latent session's: k alone); as a list."""
        got = self.history(layer, n)
        if self.v_from_k:
            got = (got,) if hasattr(got, "shape") or not isinstance(got, tuple) else got
            if len(got) != 1:
                raise TypeError("attnd: history(%d, %d) of latent session %r must return k "
                                "alone" % (layer, n, self.id))
        elif not (isinstance(got, (tuple, list)) and len(got) == 2):
            raise TypeError("attnd: history(%d, %d) must return (k, v), got %s"
                            % (layer, n, type(got).__name__))
        out = []
        for name, x, d in zip(("k", "v"), got, (self.head_dim, self.head_dim_v)):
            x = _array(x)
            shape, want = [int(d) for d in x.shape], [self.heads_kv, n, d]
            if shape != want:
                raise ValueError("attnd: history(%d, %d) gave %s of shape %s; session %r "
                                 "needs [heads_kv, length, head_dim%s] = %s"
                                 % (layer, n, name, shape, self.id,
                                    "_v" if name == "v" else "", want))
            out.append(x)
        return out

    def _layer(self, layer):
        layer = int(layer)
        if not 0 <= layer < self.layers:
            raise ValueError("attnd: layer %d of a session of %d layers" % (layer, self.layers))
        return layer


def _batch_lengths(fields, resp, pos, n_new):
    """Each entry's length after a batch call: the reply's ``lengths`` (a JSON array, or a
    comma list in the X-Session-Lengths header or the safetensors ``__metadata__``) when it
    gives them, else ``pos + Nnew`` (what an accepted call appends)."""
    val = resp.getheader("X-Session-Lengths")
    if val is None:
        val = fields.get("lengths")
    if isinstance(val, str):
        val = [x for x in val.split(",") if x.strip()]
    try:
        got = [int(x) for x in val]
        if len(got) == len(pos):
            return got
    except (TypeError, ValueError):
        pass
    return [p + n for p, n in zip(pos, n_new)]


def _offsets(x):
    if hasattr(x, "detach"):
        x = x.detach().to("cpu").numpy()
    return [int(i) for i in np.asarray(x).reshape(-1)]


def session_batch(client, sessions, q, k, v, cu_seqlens_q, cu_seqlens_kv, *, pos=None,
                  layer=0, causal=True, scale=None, window=(-1, -1), window_left=None,
                  window_right=None, softcap=None, alibi_slopes=None, sinks=None, stats=False,
                  backend=None, binary=True, json=None):
    """One layer of many sessions in one call (``POST /v1/sessions/_batch``); see
    :meth:`attnd.Client.session_batch`."""
    sessions = list(sessions)
    ids = [s.id if isinstance(s, Session) else _check_id(s) for s in sessions]
    layer = int(layer)
    if pos is None:
        if not all(isinstance(s, Session) for s in sessions):
            raise TypeError("attnd: session_batch needs pos when sessions are given by id")
        pos = [s.lengths[s._layer(layer)] for s in sessions]
    pos = [int(p) for p in pos]
    if len(pos) != len(ids):
        raise ValueError("attnd: %d sessions but %d positions" % (len(ids), len(pos)))
    dtype = next((s.dtype for s in sessions if isinstance(s, Session)), None)
    conv = (lambda x, n: to_wire(x, n)) if dtype is None else (lambda x, n: _as_dtype(x, n, dtype))
    # v None: latent sessions, whose v the server reads from k
    wire = [(n,) + conv(x, n) for n, x in (("q", q), ("k", k), ("v", v)) if x is not None]
    _f32_inputs(wire, alibi_slopes=alibi_slopes, sinks=sinks)
    _cu_seqlens(wire, cu_seqlens_q, cu_seqlens_kv)
    as_json = _wants_json(json, binary)
    opts = {"layer": layer}
    opts["sessions"] = ids if as_json else ",".join(ids)
    opts["pos"] = pos if as_json else ",".join(str(p) for p in pos)
    opts.update(_call_options(causal, scale, window, window_left, window_right, softcap, stats,
                              backend))
    names = ("o", "m", "l", "lse") if stats else ("o",)
    out, fields, resp = client._exchange("/v1/sessions/_batch", wire, opts, as_json, names)
    cu = _offsets(cu_seqlens_kv)
    lengths = _batch_lengths(fields, resp, pos, [b - a for a, b in zip(cu, cu[1:])])
    for s, n in zip(sessions, lengths):
        if isinstance(s, Session):
            s.lengths[layer] = n
    device = result_device(q, k, v)
    got = tuple(from_wire(out[n], device) for n in names)
    return got if stats else got[0]


def import_session(client, id, data):
    """``PUT /v1/sessions/{id}/import`` of a file :meth:`Session.export` gave; the
    :class:`Session` made (its lengths the file's). 409 ``session_exists`` when the id is
    taken, 507 when its reservation does not fit, 422 for a file that is not a valid
    session."""
    status, resp, body = client._request(
        "PUT", _path(_check_id(id), "/import"), body=bytes(data),
        headers={"Content-Type": "application/octet-stream", "Accept": "application/json"})
    if status != 201:
        raise client._error(status, resp, body)
    return Session.attach(client, id)
