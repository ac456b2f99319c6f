"""The ``POST /encode`` exchange between a prefill and an encoder, both ends.

Request: ``{"key", "reply_to", "images": [base64, ...], "inline_max_bytes"?}``. The embeddings go
to ``reply_to``'s transport under ``key`` and the answer is a JSON summary, unless the prefill set
``inline_max_bytes`` and the packed embeddings fit in it: then they ARE the answer (``INLINE_TYPE``:
8-byte header length, the wire header, the tensors' bytes in header order, each still checked
against its checksum on arrival). A small answer on the HTTP connection the prefill already waits
on skips a transport hop (three threads to wake, not one);
large ones keep the transport's zero-copy and shared-memory paths. An encoder that predates the
field ignores it and sends as before.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Sequence

from epdctl.runtime.errors import TransferError
from epdctl.runtime.limits import Limits, check_image_sizes, image_size
from epdctl.runtime.openai_api import ApiError

INLINE_TYPE = "application/x-epdctl-wire"
INLINE_MAX_BYTES = 1 << 20  # the prefill's default: larger embeddings take the transport


def parse_encode(body: dict[str, Any], limits: Limits) -> tuple[str, str, list[bytes], int]:
    """(key, reply_to, decoded images, inline_max_bytes: 0 when the prefill wants the transport)."""
    key, reply_to, images = body.get("key"), body.get("reply_to"), body.get("images")
    if not isinstance(key, str) or not isinstance(reply_to, str) or not isinstance(images, list) or not images:
        raise ApiError(400, 'body must be {"key": str, "reply_to": str, "images": [base64, ...]}', "missing_field")
    if len(images) > limits.max_images_per_request:
        raise ApiError(400, f"too many images: {len(images)} in the request, the limit is "
                            f"{limits.max_images_per_request} (limits.max_images_per_request)", "too_many_images")
    out = []
    for i, data in enumerate(images):
        try:
            out.append(base64.b64decode(data, validate=True))
        except (binascii.Error, ValueError, TypeError):
            raise ApiError(400, f"image {i + 1}: not valid base64", "invalid_image") from None
    inline = body.get("inline_max_bytes", 0)
    if not isinstance(inline, int) or isinstance(inline, bool) or inline < 0:
        raise ApiError(400, "inline_max_bytes must be a non-negative integer", "invalid_field")
    return key, reply_to, out, inline


def check_pixels(images: list[bytes], limits: Limits) -> int:
    """Pixel limits from the image headers, before anything is decoded; the request's total pixels."""
    sizes = [image_size(n, data) for n, data in enumerate(images, start=1)]
    check_image_sizes(sizes, limits)
    return sum(w * h for w, h in sizes)


def inline_body(frames: Sequence[Any]) -> bytes:
    """``wire.pack`` frames as one answer body."""
    header = bytes(frames[0])
    return b"".join([len(header).to_bytes(8, "big"), header, *(bytes(f) for f in frames[1:])])


def inline_frames(body: bytes | bytearray, parse_header: Any) -> list[memoryview]:
    """The frames of an inline answer, cut by its header (``wire.unpack`` checks every tensor);
    TransferError when the body is shorter or longer than its header says."""
    mv = memoryview(body)
    n = int.from_bytes(mv[:8], "big") if len(mv) >= 8 else -1
    if n < 0 or 8 + n > len(mv):
        raise TransferError(f"inline embeddings truncated: {len(mv)} bytes")
    header = mv[8:8 + n]
    frames: list[memoryview] = [header]
    at = 8 + n
    for entry in parse_header(header)["tensors"]:
        size = int(entry["nbytes"])
        if at + size > len(mv):
            raise TransferError(f"inline embeddings truncated: {len(mv)} bytes, the header needs more")
        frames.append(mv[at:at + size])
        at += size
    if at != len(mv):
        raise TransferError(f"inline embeddings: {len(mv) - at} bytes beyond what the header describes")
    return frames
