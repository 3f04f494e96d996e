"""How a webhook delivery is signed, and how a receiver checks it.

`X-Quicksave-Timestamp` is the Unix time of the attempt; `X-Quicksave-Signature` is
`sha256=` and the hex HMAC-SHA256, under the endpoint's secret, of `<timestamp>.<body>`. A receiver
recomputes it over the raw body, compares in constant time, and refuses a timestamp too far from
its clock (a replayed request). Each attempt is signed anew; the body stays the same.
"""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "X-Quicksave-Signature"
TIMESTAMP_HEADER = "X-Quicksave-Timestamp"
# How far a receiver's clock may be from the timestamp (verify's default).
TOLERANCE_SECONDS = 300


def signature(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def headers(secret: str, body: bytes, *, timestamp: int | None = None) -> dict[str, str]:
    timestamp = int(time.time()) if timestamp is None else timestamp
    return {TIMESTAMP_HEADER: str(timestamp), SIGNATURE_HEADER: signature(secret, timestamp, body)}


def verify(
    secret: str, *, timestamp: str, signature_header: str, body: bytes, tolerance: int = TOLERANCE_SECONDS,
    now: float | None = None,
) -> bool:  # fmt: skip
    """Whether a request's signature is the endpoint's over this body, made within `tolerance` seconds."""
    try:
        sent = int(timestamp)
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - sent) > tolerance:
        return False
    return hmac.compare_digest(signature(secret, sent, body), signature_header)
