"""HTTP content encodings of KServe REST bodies: gzip and deflate.

SPEC: PROTOCOL-FACTS §2.3 — tritonclient may compress a request
(``Content-Encoding: gzip|deflate``) and ask for a compressed response
(``Accept-Encoding``); its "deflate" is the zlib format (``zlib.compress``).
Pure: bytes in, bytes out.
"""

from __future__ import annotations

import gzip
import zlib

from appliance.errors import TooLarge
from appliance.protocols.kserve.errors import DecodeError

# PERF: level 1 compresses tensors several times faster than the default 9
# for a few percent more bytes.
COMPRESS_LEVEL = 1


def decode_content(body: bytes, encoding: str | None, limit: int) -> bytes:
    """Undo a request's Content-Encoding (gzip, deflate or none).

    Raises:
        DecodeError: an unknown encoding or a corrupt stream.
        TooLarge: the decompressed body exceeds ``limit`` bytes.
    """
    name = (encoding or "").strip().lower()
    if name in ("", "identity"):
        return body
    if name in ("gzip", "x-gzip"):
        candidates = [16 + zlib.MAX_WBITS]
    elif name == "deflate":
        # "deflate" is the zlib format (tritonclient sends zlib.compress);
        # some clients send a raw deflate stream.
        candidates = [zlib.MAX_WBITS, -zlib.MAX_WBITS]
    else:
        raise DecodeError(f"unsupported Content-Encoding {encoding!r}; use gzip or deflate")
    for wbits in candidates:
        try:
            return _inflate(body, wbits, limit)
        except zlib.error:
            continue
    raise DecodeError(f"the request body is not valid {name} data")


def _inflate(body: bytes, wbits: int, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits)
    out = inflater.decompress(body, limit + 1)
    if len(out) > limit:
        raise TooLarge(
            f"the decompressed request body exceeds the limit of {limit} bytes "
            "(http.max_body_bytes)"
        )
    if not inflater.eof:
        raise zlib.error("truncated stream")
    return out


def choose_encoding(accept: str | None) -> str | None:
    """Pick gzip or deflate from an Accept-Encoding header, or None."""
    if not accept:
        return None
    # PERF: a client sends the same header on every request; its answer is kept.
    known = _CHOSEN.get(accept, _UNKNOWN)
    if known is not _UNKNOWN:
        return known
    chosen = _choose(accept)
    if len(_CHOSEN) < _CHOSEN_MAX:
        _CHOSEN[accept] = chosen
    return chosen


def _choose(accept: str) -> str | None:
    wanted: dict[str, float] = {}
    for part in accept.split(","):
        token, _, rest = part.strip().partition(";")
        quality = 1.0
        if rest.strip().startswith("q="):
            try:
                quality = float(rest.strip()[2:])
            except ValueError:
                quality = 0.0
        wanted[token.strip().lower()] = quality
    for name in ("gzip", "deflate"):
        if wanted.get(name, 0.0) > 0:
            return name
    return None


# Answers of choose_encoding, by header; a few distinct headers are all a server sees,
# and a bound keeps clients that vary theirs from growing it.
_CHOSEN: dict[str, str | None] = {}
_CHOSEN_MAX = 256
_UNKNOWN = "?"


def encode_content(body: bytes, encoding: str) -> bytes:
    """Compress a response body as gzip or deflate (zlib format)."""
    if encoding == "gzip":
        return gzip.compress(body, compresslevel=COMPRESS_LEVEL)
    return zlib.compress(body, COMPRESS_LEVEL)
