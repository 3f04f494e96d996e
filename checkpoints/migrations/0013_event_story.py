"""The thread page's story: every event but checkpoints', by thread and time (a partial index),
built without locking the event table against the writers (CREATE INDEX CONCURRENTLY, which
cannot run inside a transaction)."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("checkpoints", "0012_thread_started_by"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="event",
            index=models.Index(
                fields=["thread", "created_at", "seq"],
                name="event_story",
                condition=~models.Q(type="checkpoint.created"),
            ),
        ),
    ]
