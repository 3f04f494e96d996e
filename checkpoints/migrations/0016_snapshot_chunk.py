"""Chunks of large snapshots, kept once per thread (checkpoints/storage/chunks.py): a new table, so
existing rows are untouched and their snapshots, framed whole, read as before."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("checkpoints", "0015_checkpoint_event_seq"),
    ]

    operations = [
        migrations.CreateModel(
            name="SnapshotChunk",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "thread", "digest", blank=True, editable=False, primary_key=True, serialize=False
                    ),
                ),
                ("digest", models.BinaryField(max_length=32)),
                ("data", models.BinaryField()),
                ("used_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "thread",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="checkpoints.thread",
                    ),
                ),
            ],
        ),
        # Its data is compressed and sealed already: PostgreSQL's own compression would only
        # spend time finding that out.
        migrations.RunSQL(
            "ALTER TABLE checkpoints_snapshotchunk ALTER COLUMN data SET STORAGE EXTERNAL",
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
