"""A checkpoint's `checkpoint.created` event is its own row (`event_seq`), no longer an `Event` row
of its own: the column, and the index a socket's replay reads it by, built without locking the
checkpoint table against the writers (CREATE INDEX CONCURRENTLY, which cannot run inside a
transaction). Rows written before keep their `Event` rows and a null `event_seq`."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("checkpoints", "0014_changed_paths"),
    ]

    operations = [
        migrations.AddField(
            model_name="checkpoint",
            name="event_seq",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        AddIndexConcurrently(
            model_name="checkpoint",
            index=models.Index(
                fields=["thread", "event_seq"],
                name="checkpoint_event_seq",
                condition=models.Q(event_seq__isnull=False),
            ),
        ),
    ]
