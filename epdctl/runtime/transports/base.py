"""Shared machinery: a ZMQ ROUTER endpoint that receives messages, acknowledges them and hands
verified payloads to whoever ``recv()``s their key, plus the sender's request/ack round trip.

Senders keep their DEALER sockets: one idle pool per peer, so a hand-off reuses a connected
socket instead of paying a TCP connect per message. A socket is used by one request at a time
and closed (not pooled) after a timeout, so a late answer can never be read as another's.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import AsyncIterator, Callable, Sequence, TypeVar

import torch
import zmq
import zmq.asyncio

from ..errors import TransferError
from ..wire import Frame

log = logging.getLogger(__name__)

Message = tuple[dict, dict[str, torch.Tensor]]  # what recv() returns: (meta, tensors)
Delivery = Message | TransferError              # what arrived under a key: the message, or what broke

DEFAULT_TIMEOUT = 30.0
UNCLAIMED_TTL = 300.0      # arrived data nobody asked for is dropped after this long
_OFFLOAD_BYTES = 32 << 20  # verify larger payloads in a thread so the event loop keeps serving
_DRAIN = 8                 # queued messages taken in a row before the loop gets a turn
_IDLE_PER_PEER = 8         # pooled sockets kept per peer (more concurrent sends open more, then close them)


def advertised_host(host: str) -> str:
    """The address peers should dial: a wildcard bind (0.0.0.0, ::, *) advertises this host's IP."""
    if host not in ("0.0.0.0", "::", "*", ""):
        return host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class Endpoint:
    """Receiving side: ``_handle(frames)`` (subclass) turns a message into (reply, key, result)."""

    def __init__(self, bind: str, timeout: float):
        self.bind = bind
        self.timeout = timeout
        self.ctx = zmq.asyncio.Context()
        self.router: zmq.asyncio.Socket | None = None
        self.endpoint = ""
        self._task: asyncio.Task | None = None
        self._arrived: dict[str, tuple[float, Delivery]] = {}
        self._waiters: dict[str, asyncio.Future[Delivery]] = {}
        self._idle: dict[str, list[zmq.asyncio.Socket]] = {}
        self.stats = {"bytes_sent": 0, "bytes_received": 0, "transfers_sent": 0, "transfers_received": 0,
                      "failures": 0, "connects": 0}

    async def _bind(self) -> None:
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        if self.bind.startswith("tcp://") and self.bind.count(":") == 1:
            self.endpoint = f"{self.bind}:{self.router.bind_to_random_port(self.bind)}"
        else:
            self.router.bind(self.bind)
            self.endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        if self.endpoint.startswith("tcp://"):
            host, _, port = self.endpoint[6:].rpartition(":")
            self.endpoint = f"tcp://{advertised_host(host.strip('[]'))}:{port}"
        self._task = asyncio.create_task(self._serve())

    async def _serve(self) -> None:
        assert self.router is not None
        drained = 0
        while True:
            try:
                msg = None
                if drained < _DRAIN:  # a message already queued (the next part): take it without a loop round
                    try:
                        msg = await self.router.recv_multipart(flags=zmq.DONTWAIT, copy=False)
                        drained += 1
                    except zmq.Again:
                        pass
                if msg is None:
                    drained = 0
                    msg = await self.router.recv_multipart(copy=False)
            except (asyncio.CancelledError, zmq.ContextTerminated):
                return
            ident, frames = msg[0], [f.buffer for f in msg[1:]]
            try:
                reply = await self._handle(frames)
            except Exception as exc:  # never let one bad message stop the endpoint
                log.exception("transport endpoint: message failed")
                reply = [b"ERR", f"receiver failed: {exc}".encode()]
            if reply is not None:  # None: a message that is answered later (a part of a larger one)
                await self.router.send_multipart([ident, *reply])

    async def _handle(self, frames: list[memoryview]) -> list[bytes] | None:
        raise NotImplementedError

    def _deliver(self, key: str, result: Delivery) -> None:
        """Hand a verified payload (or the TransferError it raised) to the waiter for ``key``."""
        if isinstance(result, Exception):
            self.stats["failures"] += 1
        else:
            self.stats["transfers_received"] += 1
        waiter = self._waiters.pop(key, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(result)
            return
        now = time.monotonic()
        for k in [k for k, (t, _) in self._arrived.items() if now - t > UNCLAIMED_TTL]:
            del self._arrived[k]
        self._arrived[key] = (now, result)

    async def recv(self, key: str, timeout: float) -> Message:
        """Wait for the payload sent under ``key``; TransferError if it arrived damaged."""
        if key in self._arrived:
            result = self._arrived.pop(key)[1]
        else:
            fut = self._waiters.get(key) or asyncio.get_running_loop().create_future()
            self._waiters[key] = fut
            try:
                result = await asyncio.wait_for(asyncio.shield(fut), timeout)
            finally:
                if self._waiters.get(key) is fut and not fut.done():
                    self._waiters.pop(key, None)
        if isinstance(result, TransferError):
            raise result
        return result

    def discard(self, key: str) -> None:
        self._arrived.pop(key, None)
        fut = self._waiters.pop(key, None)
        if fut is not None and not fut.done():
            fut.cancel()

    async def request(self, peer_endpoint: str, frames: Sequence[Frame] | None, what: str, copy: bool = True,
                      stream: AsyncIterator[list[Frame]] | None = None) -> list[bytes]:
        """One round trip to a peer's endpoint: send ``frames``, wait (bounded) for its answer.
        ``stream`` instead: messages sent on one socket as soon as each is produced, only the last
        answered (the parts of one message).

        The bound is the socket's own SNDTIMEO/RCVTIMEO (pyzmq's asyncio sockets honour them),
        not asyncio.wait_for + poll, which cost a task and a poll per hand-off."""
        sock = self._checkout(peer_endpoint)
        answered = False
        try:
            try:
                if stream is not None:
                    async for msg in stream:
                        await sock.send_multipart(msg, copy=copy)
                if frames is not None:
                    await sock.send_multipart(list(frames), copy=copy)
            except zmq.Again as exc:
                raise TransferError(f"{what}: could not hand the message to {peer_endpoint} within "
                                    f"{self.timeout:g}s") from exc
            try:
                reply = [bytes(f) for f in await sock.recv_multipart()]
            except zmq.Again as exc:
                raise TransferError(f"{what}: no answer from {peer_endpoint} within {self.timeout:g}s; "
                                    "is the peer running and reachable?") from exc
            answered = bool(reply) and reply[0] == b"OK"  # after a refusal a late answer may follow: new socket
        except zmq.ZMQError as exc:
            raise TransferError(f"{what}: {peer_endpoint}: {exc}") from exc
        finally:
            self._checkin(peer_endpoint, sock, answered)
        if not reply or reply[0] != b"OK":
            detail = reply[1].decode(errors="replace") if len(reply) > 1 else "no detail"
            raise TransferError(f"{what}: peer {peer_endpoint} rejected the transfer: {detail}")
        return reply

    async def post(self, peer_endpoint: str, frames: Sequence[Frame], what: str) -> None:
        """Send one message that is not answered (an announcement); the socket stays pooled."""
        sock = self._checkout(peer_endpoint)
        ok = False
        try:
            await sock.send_multipart(list(frames))
            ok = True
        except zmq.Again as exc:
            raise TransferError(f"{what}: could not hand the message to {peer_endpoint} within "
                                f"{self.timeout:g}s") from exc
        except zmq.ZMQError as exc:
            raise TransferError(f"{what}: {peer_endpoint}: {exc}") from exc
        finally:
            self._checkin(peer_endpoint, sock, ok)

    def _checkout(self, peer_endpoint: str) -> zmq.asyncio.Socket:
        idle = self._idle.get(peer_endpoint)
        if idle:
            return idle.pop()
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, max(1, int(self.timeout * 1000)))
        sock.setsockopt(zmq.RCVTIMEO, max(1, int(self.timeout * 1000)))
        try:
            sock.connect(peer_endpoint)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise TransferError(f"cannot connect to {peer_endpoint}: {exc}") from exc
        self.stats["connects"] += 1
        return sock

    def _checkin(self, peer_endpoint: str, sock: zmq.asyncio.Socket, reusable: bool) -> None:
        idle = self._idle.setdefault(peer_endpoint, [])
        if reusable and len(idle) < _IDLE_PER_PEER and not sock.closed:
            idle.append(sock)
        else:
            sock.close(linger=0)

    async def close(self) -> None:
        for socks in self._idle.values():
            for sock in socks:
                sock.close(linger=0)
        self._idle.clear()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self.router is not None:
            self.router.close(linger=0)
        for fut in self._waiters.values():
            fut.cancel()
        self._waiters.clear()
        self._arrived.clear()
        self.ctx.term()


A = TypeVar("A")
R = TypeVar("R")


async def verify(fn: Callable[[A], R], frames: A, nbytes: int) -> R:
    """Run a (CPU-heavy) unpack in a thread when the payload is large."""
    if nbytes >= _OFFLOAD_BYTES:
        return await asyncio.to_thread(fn, frames)
    return fn(frames)
