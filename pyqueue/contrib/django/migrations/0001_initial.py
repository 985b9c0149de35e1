"""The results table of pyqueue.contrib.django (made by makemigrations, Django 5.2)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name='TaskResultRecord',
            fields=[
                ('id', models.CharField(max_length=200, primary_key=True, serialize=False)),
                ('task_path', models.CharField(max_length=1000)),
                ('queue_name', models.CharField(max_length=100)),
                ('backend', models.CharField(max_length=100)),
                ('priority', models.SmallIntegerField(default=0)),
                ('args', models.JSONField(default=list)),
                ('kwargs', models.JSONField(default=dict)),
                ('run_after', models.DateTimeField(blank=True, null=True)),
                ('status', models.CharField(
                    choices=[('READY', 'Ready'), ('RUNNING', 'Running'), ('FAILED', 'Failed'),
                             ('SUCCESSFUL', 'Successful')],
                    default='READY', max_length=10)),
                ('return_value', models.JSONField(blank=True, null=True)),
                ('errors', models.JSONField(default=list)),
                ('worker_ids', models.JSONField(default=list)),
                ('enqueued_at', models.DateTimeField()),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('last_attempted_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'verbose_name': 'task result',
                'db_table': 'pyqueue_django_task_result',
                'indexes': [models.Index(fields=['status', 'queue_name'], name='pyqueue_dj_status_queue'),
                            models.Index(fields=['finished_at'], name='pyqueue_dj_finished_at')],
            },
        ),
    ]
