"""The records' tables, adopted from the scheduler app: they were created by its migrations
0001–0007 and keep their names (each model's ``db_table``), so this changes Django's state only
and touches no table."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('scheduler', '0007_admission_decision_retry_after'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='StreamCursor',
                    fields=[
                        ('stream', models.CharField(max_length=100, primary_key=True, serialize=False)),
                        ('last_id', models.CharField(default='0-0', max_length=40)),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                    ],
                    options={
                        'db_table': 'scheduler_streamcursor',
                    },
                ),
                migrations.CreateModel(
                    name='AdmissionDecision',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('stream_id', models.CharField(help_text='The sy:decisions entry it came from.', max_length=40, unique=True)),
                        ('request_id', models.CharField(db_index=True, max_length=128)),
                        ('record_id', models.CharField(blank=True, db_index=True, help_text="The interaction record's id.", max_length=40)),
                        ('occurred_at', models.DateTimeField(db_index=True)),
                        ('decision', models.CharField(choices=[('admitted', 'Admitted'), ('queued', 'Queued'), ('rejected', 'Rejected'), ('shed', 'Shed')], max_length=16)),
                        ('reason', models.CharField(blank=True, help_text='The limit or cause.', max_length=200)),
                        ('tenant', models.CharField(help_text='The slug as the gateway saw it.', max_length=100)),
                        ('tenant_id', models.BigIntegerField(blank=True, null=True)),
                        ('use_case_id', models.BigIntegerField()),
                        ('key_id', models.BigIntegerField(blank=True, null=True)),
                        ('model', models.CharField(max_length=200)),
                        ('retry_after_s', models.PositiveIntegerField(default=0, help_text='The Retry-After the refusal answered, in seconds (0: none).')),
                        ('queued_ms', models.BigIntegerField(default=0)),
                        ('policy_version', models.BigIntegerField(blank=True, null=True)),
                        ('audit_sequence', models.BigIntegerField(blank=True, help_text='The audit event summarising this refusal (rejected or shed); set once, in the transaction that stores the row, so a refusal is summarised exactly once.', null=True)),
                    ],
                    options={
                        'db_table': 'scheduler_admissiondecision',
                        'ordering': ['-occurred_at'],
                        'indexes': [models.Index(fields=['tenant', 'occurred_at'], name='decision_tenant_time'), models.Index(fields=['tenant_id', 'occurred_at'], name='decision_tenant_id_time')],
                    },
                ),
                migrations.CreateModel(
                    name='GuardrailFinding',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('stream_id', models.CharField(help_text='The sy:guardrails entry it came from.', max_length=40, unique=True)),
                        ('request_id', models.CharField(db_index=True, max_length=128)),
                        ('record_id', models.CharField(blank=True, db_index=True, help_text="The interaction record's id.", max_length=40)),
                        ('occurred_at', models.DateTimeField(db_index=True)),
                        ('tenant', models.CharField(help_text='The slug as the gateway saw it.', max_length=100)),
                        ('tenant_id', models.BigIntegerField(blank=True, null=True)),
                        ('use_case_id', models.BigIntegerField()),
                        ('key_id', models.BigIntegerField(blank=True, null=True)),
                        ('model', models.CharField(max_length=200)),
                        ('stage', models.CharField(choices=[('request', 'Request'), ('response', 'Response')], max_length=8)),
                        ('guardrail', models.CharField(max_length=64)),
                        ('action', models.CharField(choices=[('blocked', 'Blocked'), ('redacted', 'Redacted'), ('flagged', 'Flagged'), ('failed_open', 'failed open'), ('failed_closed', 'failed closed')], max_length=16)),
                        ('entities', models.JSONField(default=dict, help_text='Entity type → count; never the text.')),
                        ('score', models.FloatField(blank=True, null=True)),
                        ('policy_version', models.BigIntegerField(blank=True, null=True)),
                    ],
                    options={
                        'db_table': 'scheduler_guardrailfinding',
                        'ordering': ['-occurred_at', '-id'],
                        'indexes': [models.Index(fields=['tenant_id', 'occurred_at'], name='finding_tenant_id_time'), models.Index(fields=['use_case_id', 'occurred_at'], name='finding_use_case_time'), models.Index(fields=['guardrail', 'occurred_at'], name='finding_guardrail_time')],
                    },
                ),
                migrations.CreateModel(
                    name='GuardrailHour',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('use_case_id', models.BigIntegerField()),
                        ('tenant_id', models.BigIntegerField(blank=True, null=True)),
                        ('tenant', models.CharField(max_length=100)),
                        ('guardrail', models.CharField(max_length=64)),
                        ('action', models.CharField(choices=[('blocked', 'Blocked'), ('redacted', 'Redacted'), ('flagged', 'Flagged'), ('failed_open', 'failed open'), ('failed_closed', 'failed closed')], max_length=16)),
                        ('hour', models.DateTimeField(help_text='Start of the hour, UTC.')),
                        ('findings', models.BigIntegerField(default=0)),
                    ],
                    options={
                        'db_table': 'scheduler_guardrailhour',
                        'ordering': ['-hour', 'guardrail', 'action'],
                        'indexes': [models.Index(fields=['hour'], name='guardrail_hour_hour')],
                        'constraints': [models.UniqueConstraint(fields=('use_case_id', 'guardrail', 'action', 'hour'), name='guardrail_hour_key')],
                    },
                ),
                migrations.CreateModel(
                    name='RecordObject',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('key', models.CharField(help_text="The object's name.", max_length=512, unique=True)),
                        ('use_case_id', models.BigIntegerField()),
                        ('tenant_id', models.BigIntegerField(blank=True, null=True)),
                        ('hour', models.DateTimeField(help_text='Start of the hour (UTC) its records finished in.')),
                        ('records', models.PositiveIntegerField()),
                        ('size', models.BigIntegerField(help_text='Bytes stored (sealed).')),
                        ('sha256', models.CharField(help_text='Of the plaintext JSON Lines.', max_length=64)),
                        ('sealed_sha256', models.CharField(help_text='Of the bytes stored.', max_length=64)),
                        ('key_id', models.CharField(help_text='The key-encryption key that sealed it.', max_length=64)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('audit_sequence', models.BigIntegerField(blank=True, help_text='The audit event that recorded its checksums.', null=True)),
                    ],
                    options={
                        'db_table': 'scheduler_recordobject',
                        'ordering': ['-hour', 'key'],
                        'indexes': [models.Index(fields=['use_case_id', 'hour'], name='record_object_use_case')],
                    },
                ),
                migrations.CreateModel(
                    name='UsageMinute',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('use_case_id', models.BigIntegerField()),
                        ('tenant', models.CharField(max_length=100)),
                        ('model', models.CharField(max_length=200)),
                        ('minute', models.DateTimeField(help_text='Start of the minute, UTC.')),
                        ('requests', models.BigIntegerField(default=0)),
                        ('errors', models.BigIntegerField(default=0, help_text='Requests answered with status ≥ 400.')),
                        ('prompt_tokens', models.BigIntegerField(default=0)),
                        ('completion_tokens', models.BigIntegerField(default=0)),
                        ('queued_ms', models.BigIntegerField(default=0, help_text='Sum of time spent queued.')),
                        ('total_ms', models.BigIntegerField(default=0, help_text='Sum of time in the gateway.')),
                    ],
                    options={
                        'db_table': 'scheduler_usageminute',
                        'ordering': ['-minute', 'tenant', 'model'],
                        'indexes': [models.Index(fields=['tenant', 'minute'], name='usage_minute_tenant'), models.Index(fields=['minute'], name='usage_minute_minute')],
                        'constraints': [models.UniqueConstraint(fields=('use_case_id', 'tenant', 'model', 'minute'), name='usage_minute_key')],
                    },
                ),
                migrations.CreateModel(
                    name='InteractionRecord',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('record_id', models.CharField(max_length=40, unique=True)),
                        ('request_id', models.CharField(db_index=True, max_length=128)),
                        ('occurred_at', models.DateTimeField(help_text='When the request finished.')),
                        ('tenant', models.CharField(help_text='The slug as the gateway saw it.', max_length=100)),
                        ('tenant_id', models.BigIntegerField(blank=True, null=True)),
                        ('use_case_id', models.BigIntegerField()),
                        ('key_id', models.BigIntegerField(blank=True, null=True)),
                        ('model', models.CharField(max_length=200)),
                        ('endpoint', models.CharField(blank=True, max_length=64)),
                        ('replica', models.CharField(blank=True, max_length=300)),
                        ('status', models.PositiveSmallIntegerField()),
                        ('streamed', models.BooleanField(default=False)),
                        ('prompt_tokens', models.BigIntegerField(default=0)),
                        ('completion_tokens', models.BigIntegerField(default=0)),
                        ('queued_ms', models.BigIntegerField(default=0)),
                        ('upstream_ms', models.BigIntegerField(default=0)),
                        ('total_ms', models.BigIntegerField(default=0)),
                        ('policy_version', models.BigIntegerField(blank=True, null=True)),
                        ('record_policy', models.CharField(help_text='metadata or full, as applied.', max_length=8)),
                        ('content', models.CharField(choices=[('none', 'not kept (metadata policy)'), ('pending', 'not received yet'), ('stored', 'stored'), ('dropped', 'dropped by the gateway (buffer full)')], default='none', max_length=8)),
                        ('line', models.PositiveIntegerField(blank=True, help_text='Index in the object.', null=True)),
                        ('content_sha256', models.CharField(blank=True, help_text='Of its line.', max_length=64)),
                        ('truncated', models.BooleanField(default=False, help_text='The request or response was longer than the capture limit.')),
                        ('object', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='lines', to='records.recordobject')),
                    ],
                    options={
                        'db_table': 'scheduler_interactionrecord',
                        'ordering': ['-occurred_at', '-id'],
                        'indexes': [models.Index(fields=['occurred_at'], name='record_time'), models.Index(fields=['tenant_id', 'occurred_at'], name='record_tenant_time'), models.Index(fields=['use_case_id', 'occurred_at'], name='record_use_case_time'), models.Index(fields=['key_id', 'occurred_at'], name='record_key_time'), models.Index(fields=['model', 'occurred_at'], name='record_model_time'), models.Index(fields=['status', 'occurred_at'], name='record_status_time')],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
