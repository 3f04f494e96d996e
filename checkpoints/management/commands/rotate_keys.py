"""Re-wrap every thread's data key under the first master key of QUICKSAVE_ENCRYPTION_KEYS."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from checkpoints.storage import crypto, keys


class Command(BaseCommand):
    help = (
        "Re-wrap every thread's data key under the first key of QUICKSAVE_ENCRYPTION_KEYS. Safe while the "
        "service runs: data keys do not change, so no checkpoint is rewritten. Put the new key first, keep "
        "the old ones in the keyring until this reports 0 left, then remove them."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch", type=int, default=500, help="Data keys re-wrapped per transaction")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["batch"] < 1:
            raise CommandError("--batch must be at least 1.")
        primary = crypto.keyring()[0].id
        stale = keys.stale_key_count()
        self.stdout.write(f"{stale} data key(s) to re-wrap under master key {primary!r}.")

        def progress(step: keys.Rotation) -> None:
            percent = 100 * step.current // step.total if step.total else 100
            bar = "#" * (percent // 5)
            self.stdout.write(f"[{bar:<20}] {step.current}/{step.total} data keys under {primary!r} ({percent}%)")

        try:
            done = keys.rotate(batch=options["batch"], progress=progress)
        except crypto.DecryptionFailure as exc:
            raise CommandError(exc.message) from None
        left = done.total - done.current
        self.stdout.write(f"Re-wrapped {done.rewrapped} data key(s); {left} left under other master keys.")
        if left:
            raise CommandError(f"{left} data key(s) are still wrapped by other master keys; run again.")
