"""AuditEntry now belongs to the audit app (audit/migrations/0001_initial); its table stays."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0004_tool_calls'),
        ('audit', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[migrations.DeleteModel(name='AuditEntry')], database_operations=[]),
    ]
