"""Snapshots that share what they hold in common: a large snapshot is stored as chunks kept once per
thread (`checkpoints_snapshotchunk`), which its payload names in order.

A state that grows by appending (a conversation, an event log) keeps the canonical JSON of its
older part byte for byte, and the cut points below depend only on the bytes before them: the
next snapshot finds those chunks already stored and writes only the newer ones, so a snapshot of
a log costs about what was added since the last one, not the whole state. A cut falls after a
`},` or `],` (where a list item or a member holding an object or list ends) at least MIN_CHUNK
bytes after the last cut, where a hash of the WINDOW bytes before it hits one in DIVISOR, or at
the first such place past MAX_CHUNK (a state without any: every MAX_CHUNK bytes). Because the
hash looks only at nearby bytes, an edit in the middle of a state changes the chunks around it,
not every chunk after it.

The frame (codec's number 5, inside the payload's seal like every frame):

    CHUNKED | count (4 bytes, big-endian) | count digests of 32 bytes | the last piece, framed by codec.encode

The last piece is where the state grows, never shared, so it stays in the payload. A digest is
an HMAC of the piece's bytes under a key derived from QUICKSAVE_INTEGRITY_KEY (a plain hash would
let whoever reads the table confirm a guess of the content). A chunk row holds its piece framed by
codec.encode and, in a thread with a data key, sealed under it and bound to the thread and the
digest, so a chunk altered or moved fails its tag; a plain one is checked against its digest. The
payload, digests included, is covered by its row's integrity MAC: the chain vouches for its chunks.
"""

from __future__ import annotations

import hmac
import struct
import zlib
from uuid import UUID

from checkpoints.fields import associated_data
from checkpoints.storage import codec, crypto, cursors
from checkpoints.storage.errors import IntegrityFailure

CHUNKED = b"\x05"
# Snapshots smaller than this are framed whole: a chunk row and its lookup would cost more than
# the bytes they share.
CHUNK_FROM = 64 * 1024
MIN_CHUNK = 32 * 1024
MAX_CHUNK = 256 * 1024
# One cut place in DIVISOR: chunks of 32 KiB + some 64 list items (some 70 KiB of a chat). On the
# conversation of bench/frameworks_openai.py, chunks half that size stored 6% more (they compress
# worse) and took twice as long to decompress (zstd's cost per frame); twice that size left a
# larger last piece in every snapshot.
DIVISOR = 64
WINDOW = 256
DIGEST_BYTES = 32
_COUNT = struct.Struct(">I")
_DOMAIN = b"quicksave-snapshot-chunk:"
# A snapshot refreshes the `used_at` of a chunk it names at most this often (each refresh leaves a
# dead row version behind); garbage collection spares chunks used within twice this.
TOUCH_SECONDS = 60


def cut(canonical: bytes) -> list[bytes]:
    """`canonical` in pieces whose concatenation it is (see the module's docstring for where)."""
    pieces: list[bytes] = []
    start = 0
    # The next `},` and `],` at or after `at` (-1: none left). bytes.find runs through a snapshot of a
    # few hundred kilobytes in microseconds, where a regular expression's character class tried at
    # every byte took 13 ms for 300 KB; and nothing closer than MIN_CHUNK to the last cut is looked at.
    at = MIN_CHUNK
    brace, bracket = canonical.find(b"},", at), canonical.find(b"],", at)
    while brace >= 0 or bracket >= 0:
        place = brace if bracket < 0 or 0 <= brace < bracket else bracket
        end = place + 2
        if end - start >= MAX_CHUNK or zlib.crc32(canonical[end - WINDOW : end]) % DIVISOR == 0:
            while end - start > MAX_CHUNK:  # a stretch without any cut place
                pieces.append(canonical[start : start + MAX_CHUNK])
                start += MAX_CHUNK
            pieces.append(canonical[start:end])
            start = end
            at = start + MIN_CHUNK - 2  # a place ends 2 bytes after it starts
        else:
            at = end
        if 0 <= brace < at:
            brace = canonical.find(b"},", at)
        if 0 <= bracket < at:
            bracket = canonical.find(b"],", at)
    while len(canonical) - start > MAX_CHUNK:
        pieces.append(canonical[start : start + MAX_CHUNK])
        start += MAX_CHUNK
    pieces.append(canonical[start:])
    return pieces


def digest(piece: bytes) -> bytes:
    return codec.keyed_digest(_DOMAIN, piece)


def chunk_ad(thread_id: UUID, piece_digest: bytes) -> bytes:
    """What a chunk's sealed data is bound to: its table, column, thread and digest."""
    return associated_data("checkpoints_snapshotchunk.data", thread_id, piece_digest.hex())


def frame(thread_id: UUID, canonical: bytes) -> bytes:
    """A snapshot's canonical JSON framed for its payload: chunked (its chunks stored first, so
    a row never names a missing one) when it is large enough to be cut, else by codec.encode."""
    if len(canonical) < CHUNK_FROM:
        return codec.encode(canonical)
    *shared, last = cut(canonical)
    if not shared:
        return codec.encode(canonical)
    digests = [digest(piece) for piece in shared]
    _store(thread_id, shared, digests)
    return b"".join((CHUNKED, _COUNT.pack(len(digests)), *digests, codec.encode(last)))


def is_chunked(framed: bytes | memoryview) -> bool:
    return framed[:1] == CHUNKED


def digests_in(framed: bytes | memoryview) -> list[bytes]:
    """The digests a chunked frame names, in order."""
    view = memoryview(framed)
    if len(view) < 1 + _COUNT.size:
        raise ValueError("chunked payload is truncated")
    (count,) = _COUNT.unpack_from(view, 1)
    start = 1 + _COUNT.size
    if len(view) < start + count * DIGEST_BYTES:
        raise ValueError("chunked payload is truncated")
    return [bytes(view[start + i * DIGEST_BYTES : start + (i + 1) * DIGEST_BYTES]) for i in range(count)]


def unframe(thread_id: UUID, framed: bytes | memoryview) -> bytes:
    """The canonical JSON bytes a chunked frame stands for: its chunks read back (one query) and
    checked, then its last piece."""
    view = memoryview(framed)
    digests = digests_in(view)
    stored = _fetch(thread_id, digests)
    pieces: list[bytes] = []
    for piece_digest in digests:
        sealed = stored.get(piece_digest)
        if sealed is None:
            raise IntegrityFailure(
                f"A snapshot chunk of thread {thread_id} is missing ({piece_digest.hex()[:12]}…).",
                detail={"chunk": piece_digest.hex()},
            )
        pieces.append(_open(thread_id, piece_digest, sealed))
    pieces.append(codec.unframe(view[1 + _COUNT.size + len(digests) * DIGEST_BYTES :]))
    return b"".join(pieces)


def _open(thread_id: UUID, piece_digest: bytes, sealed: bytes) -> bytes:
    """A stored chunk's piece, checked: by its seal's tag, which binds it to this digest (hashing a
    megabyte again would add some 3 ms to a cold read), or, stored plain, against the digest."""
    sealed_here = crypto.is_sealed(sealed)
    try:
        ad = chunk_ad(thread_id, piece_digest) if sealed_here else b""
        piece = codec.unframe(crypto.unseal(thread_id, ad, sealed))
    except ValueError:
        piece = None
    if piece is None or (not sealed_here and not hmac.compare_digest(digest(piece), piece_digest)):
        raise IntegrityFailure(
            f"A snapshot chunk of thread {thread_id} fails its integrity check ({piece_digest.hex()[:12]}…): "
            "it was altered outside Quicksave.",
            detail={"chunk": piece_digest.hex()},
        )
    return piece


# Which of the digests are stored (refreshing the use time of those not refreshed lately); the
# update's returned rows are not needed: the select sees every row as it was before the update.
# The lists of digests and chunks go in PostgreSQL's binary format (psycopg's `%b`): as text each
# value would be escaped to hex and each array through a regular expression, some 250,000
# instructions an array of a few 100 KB pieces.
_FIND_SQL = f"""
WITH touched AS (
    UPDATE checkpoints_snapshotchunk SET used_at = now()
    WHERE thread_id = %(thread)s AND digest = ANY(%(digests)b)
      AND used_at < now() - interval '{TOUCH_SECONDS} seconds'
    RETURNING 1
)
SELECT digest FROM checkpoints_snapshotchunk WHERE thread_id = %(thread)s AND digest = ANY(%(digests)b)
"""
_INSERT_SQL = """
INSERT INTO checkpoints_snapshotchunk (thread_id, digest, data, used_at)
SELECT %(thread)s, d, x, now() FROM unnest(%(digests)b::bytea[], %(data)b::bytea[]) AS new(d, x)
ON CONFLICT (thread_id, digest) DO UPDATE SET used_at = now()
"""
_FETCH_SQL = """
SELECT digest, data FROM checkpoints_snapshotchunk WHERE thread_id = %(thread)s AND digest = ANY(%(digests)b)
"""


def _store(thread_id: UUID, pieces: list[bytes], digests: list[bytes]) -> None:
    """Store the pieces not stored yet (compressed and sealed only those)."""
    with cursors.cursor() as cursor:
        cursor.execute(_FIND_SQL, {"thread": thread_id, "digests": digests})
        found = {bytes(row[0]) for row in cursor.fetchall()}
        # Once each: a state may hold the same piece twice, and one insert may not touch a row twice.
        new = {d: piece for d, piece in zip(digests, pieces, strict=True) if d not in found}
        if not new:
            return
        data = [crypto.seal(thread_id, chunk_ad(thread_id, d), codec.encode(piece)) for d, piece in new.items()]
        cursor.execute(_INSERT_SQL, {"thread": thread_id, "digests": list(new), "data": data})


def _fetch(thread_id: UUID, digests: list[bytes]) -> dict[bytes, bytes]:
    if not digests:
        return {}
    # The kept cursor: setting up a new one costs a cold read some 0.3 ms of CPU.
    cursor = cursors.kept_cursor()
    cursor.execute(_FETCH_SQL, {"thread": thread_id, "digests": digests})
    return {bytes(row[0]): bytes(row[1]) for row in cursor.fetchall()}
