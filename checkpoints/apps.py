from django.apps import AppConfig


class CheckpointsConfig(AppConfig):
    name = "checkpoints"
    verbose_name = "Checkpoints"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_out

        from checkpoints.fields import use_sealer
        from checkpoints.storage.crypto import JSONSealer

        use_sealer(JSONSealer())

        from checkpoints.live import close_session_sockets

        # Django tells of a sign-out only through this signal, and there are several ways out (the
        # dashboard's Sign out, the admin's, any logout() call): each closes the session's sockets.
        user_logged_out.connect(close_session_sockets, dispatch_uid="checkpoints.live.close_session_sockets")
