"""The prefill's side of E→P: split a request's images over the encoders and collect embeddings.

Identical images in one request are encoded once. Each group goes to the encoder chosen by
the registry (cache affinity, then load); a group whose encoder cannot be reached is retried
on another one and the failure counts towards that encoder's eviction. Small embeddings come
back as the encoder's answer itself (encode_api.py), large ones over the transport.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import time
import uuid
from typing import Any

import aiohttp

from epdctl.runtime.openai_api import ApiError
from epdctl.runtime.servers.encode_api import INLINE_MAX_BYTES, INLINE_TYPE, inline_frames
from epdctl.runtime.servers.registry import EncoderRegistry

log = logging.getLogger(__name__)


class _EncoderDown(Exception):
    pass


class EncoderClient:
    def __init__(self, registry: EncoderRegistry, session: aiohttp.ClientSession, transport: Any, wire: Any,
                 timeout: float = 60.0, inline_max_bytes: int = INLINE_MAX_BYTES,
                 inline: dict[str, int] | None = None):
        self.registry = registry
        self.inline_max_bytes = inline_max_bytes
        self.inline = inline if inline is not None else {}  # "bytes_received": embeddings that came inline
        self.session = session
        self.transport = transport
        self.wire = wire
        self.timeout = timeout
        self._background: set[asyncio.Task] = set()  # POSTs whose embeddings already arrived

    async def encode(self, images: list[bytes], trace: dict[str, float] | None = None,
                     allow_inline: bool = True) -> tuple[list[Any], int]:
        """Embeddings for ``images`` in request order, and the embedding bytes received.

        ``trace`` (optional) gets the wall-clock stamps of the slowest group: the encoder's arrival
        and send (``t_enc_in``, ``t_enc_send``) and ours on receipt (``t_emb_in``). ``allow_inline``
        False: every embedding comes over the transport, however small (the canary proves that path)."""
        unique: dict[str, bytes] = {}
        for data in images:
            unique.setdefault(hashlib.sha256(data).hexdigest(), data)
        groups: dict[str, list[str]] = {}
        placed: dict[str, int] = {}
        for digest in unique:
            url = (await self.registry.pick_checked(digest, extra=placed)).url
            groups.setdefault(url, []).append(digest)
            placed[url] = placed.get(url, 0) + 1
        parts = await asyncio.gather(*(self._group(url, [unique[d] for d in ds], trace, allow_inline)
                                       for url, ds in groups.items()))
        by_digest: dict[str, Any] = {}
        for encoded in parts:
            for e in encoded:
                by_digest[e.digest] = e
        nbytes = sum(e.embeds.numel() * e.embeds.element_size() for e in by_digest.values())
        return [by_digest[hashlib.sha256(d).hexdigest()] for d in images], nbytes

    async def _group(self, url: str, images: list[bytes], trace: dict[str, float] | None = None,
                     allow_inline: bool = True) -> list[Any]:
        tried: set[str] = set()
        digest = hashlib.sha256(images[0]).hexdigest()
        last = ""
        while True:
            state = self.registry.encoders.get(url)
            if state is None or not state.healthy or url in tried:
                try:
                    state = await self.registry.pick_checked(digest, exclude=tried)
                except ApiError:
                    raise ApiError(503, f"no encoder could encode the images (last error: {last or 'none'}); "
                                        "check the encoders' logs and /list_encoder_urls", "encoder_unavailable")
                url = state.url
            tried.add(url)
            state.inflight += len(images)
            try:
                result = await self._call(url, images, trace, allow_inline)
                state.served += len(images)
                self.registry.answered(url)
                return result
            except ApiError:
                self.registry.answered(url)  # it rejected the images: alive and answering
                raise
            except _EncoderDown as exc:
                last = str(exc)
                log.warning("encoder %s failed (%s); trying another encoder", url, exc)
                self.registry.mark_failed(url)
            finally:
                state.inflight -= len(images)

    async def _call(self, url: str, images: list[bytes], trace: dict[str, float] | None = None,
                    allow_inline: bool = True) -> list[Any]:
        """POST the images; small embeddings are the answer, others come back on the transport.
        The encoder answers the POST only after our transport acknowledged them, so we go on as
        soon as they arrive and let the answer finish in the background (one hop less on every
        request's critical path); an error answer that comes first still fails the call."""
        key = "enc-" + uuid.uuid4().hex
        recv = asyncio.create_task(self.transport.recv(key, self.timeout))
        body = {"key": key, "reply_to": self.transport.address, "inline_max_bytes": self.inline_max_bytes if allow_inline else 0,
                "images": [base64.b64encode(b).decode() for b in images]}
        post = asyncio.create_task(self._post(url, body))
        try:
            await asyncio.wait({recv, post}, return_when=asyncio.FIRST_COMPLETED)
            if recv.done() and recv.exception() is None:
                meta, tensors = recv.result()
            elif (inline := await post) is not None:  # an error answer explains best: it raises here
                meta, tensors = self.wire.unpack(inline_frames(inline, self.wire.parse_header))
                self.inline["bytes_received"] = self.inline.get("bytes_received", 0) + len(inline)
            else:
                try:
                    meta, tensors = await recv
                except asyncio.TimeoutError:
                    raise _EncoderDown(f"embeddings did not arrive within {self.timeout:g} s") from None
            if trace is not None:
                _merge_trace(trace, meta.get("trace"), time.time())
            return self.wire.tensors_to_embeds(meta, tensors)
        finally:
            if not recv.done():
                recv.cancel()
            if not post.done():
                self._background.add(post)
                post.add_done_callback(self._settled)
            self.transport.discard(key)

    async def _post(self, url: str, body: dict) -> bytearray | None:
        """The inline embeddings when the encoder answered with them, else None."""
        try:
            async with self.session.post(url + "/encode", json=body,
                                         timeout=aiohttp.ClientTimeout(total=self.timeout)) as resp:
                if resp.status != 200:
                    detail = await _error_message(resp)
                    if resp.status < 500:
                        raise ApiError(resp.status, detail, "encoder_rejected")
                    raise _EncoderDown(f"HTTP {resp.status}: {detail}")
                data = await resp.read()
                return bytearray(data) if resp.content_type == INLINE_TYPE else None
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise _EncoderDown(f"{type(exc).__name__}: {exc}") from None

    async def close(self) -> None:
        """Cancel the encoders' answers still in flight (their embeddings already arrived)."""
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    def _settled(self, task: asyncio.Task) -> None:
        """An encoder's answer that came after its embeddings: nothing waits for it any more."""
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("encoder answered after its embeddings arrived: %s", task.exception())


def _merge_trace(trace: dict[str, float], theirs: Any, received: float) -> None:
    """Keep the latest of each stamp over the groups: the slowest group sets the critical path."""
    stamps = dict(theirs) if isinstance(theirs, dict) else {}
    stamps["t_emb_in"] = received
    for k, v in stamps.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            trace[k] = max(trace.get(k, 0.0), float(v))


async def _error_message(resp: aiohttp.ClientResponse) -> str:
    try:
        body = await resp.json(content_type=None)
        return str(body["error"]["message"])
    except Exception:
        return (await resp.text())[:300]
