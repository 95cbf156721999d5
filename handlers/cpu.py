"""CPU-heavy example kinds: pure Python, so each one keeps exactly one core busy.

    pgpool run --handlers handlers.cpu
    pgpool enqueue hash.chain '{"seed": "abc", "rounds": 20000}'
"""

from __future__ import annotations

import hashlib

import pgpool


@pgpool.handler("hash.chain", timeout=60)
def hash_chain(payload: dict) -> None:
    """SHA-256 applied ``rounds`` times: the shape of key stretching or content hashing."""
    digest = str(payload["seed"]).encode()
    for _ in range(int(payload.get("rounds", 10_000))):
        digest = hashlib.sha256(digest).digest()
    if payload.get("expect") is not None and digest.hex() != payload["expect"]:
        raise ValueError("hash chain mismatch")


@pgpool.handler("primes.sieve", timeout=60)
def prime_sieve(payload: dict) -> None:
    """Count the primes below ``limit`` with a sieve of Eratosthenes."""
    limit = int(payload["limit"])
    sieve = bytearray([1]) * (limit + 1)
    sieve[0:2] = b"\x00\x00"
    for n in range(2, int(limit**0.5) + 1):
        if sieve[n]:
            sieve[n * n :: n] = bytes(len(range(n * n, limit + 1, n)))
    count = sum(sieve)
    if payload.get("expect") is not None and count != payload["expect"]:
        raise ValueError(f"expected {payload['expect']} primes below {limit}, got {count}")


@pgpool.handler("mandelbrot.tile", timeout=120)
def mandelbrot_tile(payload: dict) -> None:
    """Escape-time iterations over one tile of the Mandelbrot set (a render farm's unit)."""
    x0, y0 = float(payload["x"]), float(payload["y"])
    size, step = int(payload.get("size", 32)), float(payload.get("step", 0.01))
    max_iter = int(payload.get("max_iter", 100))
    inside = 0
    for j in range(size):
        ci = y0 + j * step
        for i in range(size):
            c = complex(x0 + i * step, ci)
            z = 0j
            for _ in range(max_iter):
                z = z * z + c
                if abs(z) > 2.0:
                    break
            else:
                inside += 1
    if not 0 <= inside <= size * size:
        raise AssertionError("impossible tile count")
