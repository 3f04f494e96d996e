"""Time-ordered UUIDs (version 7), so new rows land at the right edge of the b-tree."""

from __future__ import annotations

import os
import time
import uuid


def new_id() -> uuid.UUID:
    millis = time.time_ns() // 1_000_000
    value = (millis & ((1 << 48) - 1)) << 80
    value |= int.from_bytes(os.urandom(10), "big") & ((1 << 80) - 1)
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # RFC 4122 variant
    return uuid.UUID(int=value)
