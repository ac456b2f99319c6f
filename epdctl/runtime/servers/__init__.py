"""aiohttp apps of the runtime's workers (encoder, prefill, decode, colocated) and their shared parts."""
