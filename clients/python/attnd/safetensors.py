"""The safetensors file format, as attnd speaks it (``proto/README.md``).

A file is::

    bytes 0..7      N, the header length: unsigned 64-bit little-endian
    bytes 8..8+N    the header: JSON, UTF-8, padded with trailing spaces
    bytes 8+N..     the data buffer

The header maps each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}``
(offsets relative to the data buffer) plus an optional ``"__metadata__"`` object of strings.

Only the three dtypes attnd knows are handled: ``F32``, ``F16`` and ``BF16``. numpy has no
bfloat16, so a BF16 tensor is carried as ``uint16`` holding the raw bits.
"""

import json
import struct

import numpy as np

__all__ = ["DTYPES", "encode", "decode", "SafetensorsError"]

#: safetensors dtype name -> little-endian numpy dtype of its storage.
DTYPES = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # raw bfloat16 bits
    "I32": np.dtype("<i4"),   # the offsets of a variable-length batch (cu_seqlens_*)
    "I64": np.dtype("<i8"),
}

_ALIGN = 8


class SafetensorsError(ValueError):
    """A safetensors buffer that does not follow the format."""


def encode(tensors, metadata=None):
    """Serialize tensors to a safetensors file and return it as a ``bytearray``.

    ``tensors`` is a sequence of ``(name, dtype_name, array)`` triples, written in that
    order and tiling the data buffer with no gap; ``array`` must already have the storage
    type of ``dtype_name`` (``float32``, ``float16``, or ``uint16`` bits for ``BF16``).
    ``metadata``, if given, is a dict of strings written as ``__metadata__``. The header is
    padded with spaces so that the data buffer starts at a multiple of 8 bytes.
    """
    # The header written as text rather than through json.dumps of a dict: a decode step
    # encodes three small tensors per layer, and this is most of the client's cost there.
    entries = []
    if metadata:
        entries.append('"__metadata__":' + json.dumps(
            {str(k): str(v) for k, v in metadata.items()}, separators=(",", ":")))
    chunks = []
    offset = 0
    for name, dtype_name, array in tensors:
        storage = DTYPES[dtype_name]
        a = np.ascontiguousarray(array, dtype=storage)
        entries.append('%s:{"dtype":%s,"shape":[%s],"data_offsets":[%d,%d]}' % (
            json.dumps(name), json.dumps(dtype_name), ",".join(str(int(d)) for d in a.shape),
            offset, offset + a.nbytes))
        offset += a.nbytes
        chunks.append(a)
    text = ("{" + ",".join(entries) + "}").encode("utf-8")
    pad = (-(8 + len(text))) % _ALIGN
    text += b" " * pad
    out = bytearray(8 + len(text) + offset)
    struct.pack_into("<Q", out, 0, len(text))
    out[8:8 + len(text)] = text
    pos = 8 + len(text)
    for a in chunks:
        out[pos:pos + a.nbytes] = a.reshape(-1).view(np.uint8).data
        pos += a.nbytes
    return out


def decode(buf):
    """Parse a safetensors file.

    Returns ``(tensors, metadata)``: a dict name -> numpy array (native byte order,
    ``uint16`` bits for ``BF16``) and the ``__metadata__`` dict (empty when absent). The
    arrays are views of ``buf`` when it is writable (``bytearray``, ``memoryview`` of one)
    and the data is aligned; otherwise they are copies or read-only views. Raises
    :class:`SafetensorsError` on a malformed file.
    """
    mv = memoryview(buf).cast("B")
    if len(mv) < 8:
        raise SafetensorsError("safetensors: %d bytes, shorter than the 8-byte header length"
                               % len(mv))
    (n,) = struct.unpack_from("<Q", mv, 0)
    if n > len(mv) - 8:
        raise SafetensorsError("safetensors: header length %d past the %d bytes of the body"
                               % (n, len(mv)))
    try:
        header = json.loads(bytes(mv[8:8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise SafetensorsError("safetensors: header is not JSON: %s" % e) from None
    if not isinstance(header, dict):
        raise SafetensorsError("safetensors: header is not a JSON object")
    base = 8 + n
    data_len = len(mv) - base
    metadata = header.pop("__metadata__", None) or {}
    tensors = {}
    for name, entry in header.items():
        try:
            dtype_name = entry["dtype"]
            shape = tuple(int(d) for d in entry["shape"])
            begin, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise SafetensorsError("safetensors: tensor %r: bad entry %r" % (name, entry)) from None
        if dtype_name not in DTYPES:
            raise SafetensorsError("safetensors: tensor %r: unknown dtype %r" % (name, dtype_name))
        storage = DTYPES[dtype_name]
        count = 1
        for d in shape:
            if d < 0:
                raise SafetensorsError("safetensors: tensor %r: negative dimension" % name)
            count *= d
        if not (0 <= begin <= end <= data_len) or end - begin != count * storage.itemsize:
            raise SafetensorsError(
                "safetensors: tensor %r: data_offsets [%d, %d] do not hold %s %s in %d bytes"
                % (name, begin, end, dtype_name, list(shape), data_len))
        a = np.frombuffer(mv, dtype=storage, count=count, offset=base + begin).reshape(shape)
        if not a.dtype.isnative:
            a = a.astype(a.dtype.newbyteorder("="))
        tensors[name] = a
    return tensors, metadata
