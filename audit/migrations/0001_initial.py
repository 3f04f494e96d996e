"""AuditEntry moves from the approvals app to its own: the model changes app, the table
(approvals_auditentry, with its append-only trigger) stays where it is, and the admin's
permissions on it follow through its content type."""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


def move_content_type(apps, schema_editor):
    content_types = apps.get_model("contenttypes", "ContentType")
    if not content_types.objects.filter(app_label="audit", model="auditentry").exists():
        content_types.objects.filter(app_label="approvals", model="auditentry").update(app_label="audit")


def restore_content_type(apps, schema_editor):
    content_types = apps.get_model("contenttypes", "ContentType")
    if not content_types.objects.filter(app_label="approvals", model="auditentry").exists():
        content_types.objects.filter(app_label="audit", model="auditentry").update(app_label="approvals")


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('approvals', '0004_tool_calls'),
        ('checkpoints', '0011_tool_result_by_tool'),
        ('contenttypes', '0002_remove_content_type_name'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='AuditEntry',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('actor_name', models.CharField(help_text='Kept as written, even if the user is renamed.', max_length=150)),
                        ('action', models.CharField(max_length=64)),
                        ('target_type', models.CharField(max_length=64)),
                        ('target_id', models.CharField(max_length=64)),
                        ('reason', models.TextField(blank=True)),
                        ('before', models.JSONField(blank=True, default=dict)),
                        ('after', models.JSONField(blank=True, default=dict)),
                        ('address', models.GenericIPAddressField(blank=True, null=True)),
                        ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                        ('actor', models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                        ('thread', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='audit_entries', to='checkpoints.thread')),
                    ],
                    options={
                        'verbose_name_plural': 'audit entries',
                        'db_table': 'approvals_auditentry',
                        'ordering': ['-created_at'],
                        'indexes': [models.Index(fields=['action', '-created_at'], name='audit_action'), models.Index(fields=['thread', '-created_at'], name='audit_thread')],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(move_content_type, restore_content_type),
    ]
