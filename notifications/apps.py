from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "notifications"
    verbose_name = "Notifications"

    def ready(self) -> None:
        from notifications.dispatch import serve
        from quicksave import background

        # The agent worker (`run_agents`) and the embedded one-process server run the dispatcher too.
        background.register("notifications", serve)
