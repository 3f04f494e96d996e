"""Leave room on thread pages so the per-checkpoint update of a thread is a HOT update
(no index entries rewritten): the store bumps `event_seq` and the head on every write
and touches the indexed `updated_at` at most once a second."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("checkpoints", "0001_initial")]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE checkpoints_thread SET (fillfactor = 50)",
            reverse_sql="ALTER TABLE checkpoints_thread RESET (fillfactor)",
        ),
    ]
