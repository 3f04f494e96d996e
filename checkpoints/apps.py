from typing import Any

from django.apps import AppConfig


class CheckpointsConfig(AppConfig):
    name = "checkpoints"
    verbose_name = "Checkpoints"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_out

        from checkpoints.fields import use_sealer
        from checkpoints.storage.crypto import JSONSealer

        use_sealer(JSONSealer())

        from checkpoints.live import close_session_sockets, listen

        listen(_to_genai_export)

        # Django tells of a sign-out only through this signal, and there are several ways out (the
        # dashboard's Sign out, the admin's, any logout() call): each closes the session's sockets.
        user_logged_out.connect(close_session_sockets, dispatch_uid="checkpoints.live.close_session_sockets")


def _to_genai_export(event: dict[str, Any]) -> None:
    """Hand a committed event to the live GenAI export when some agent is listed for it (loaded only then)."""
    from django.conf import settings

    if settings.QUICKSAVE_GENAI_LIVE_AGENTS:
        from checkpoints import genai_live

        genai_live.committed(event)
