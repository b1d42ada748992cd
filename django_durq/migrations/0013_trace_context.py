"""The enqueuing trace's context on each job, and the monotonic counters of the metrics view.

``durq_job.trace_context`` is nullable without a default, so every database adds it in place (SQLite's
``ADD COLUMN``): the job table is not rebuilt. ``durq_counter`` is new (db/counters.py).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_durq", "0012_pause_reason")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="trace_context",
            field=models.TextField(blank=True, help_text="The enqueuing trace's context.", null=True),
        ),
        migrations.CreateModel(
            name="Counter",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "writer",
                    models.CharField(help_text='host:pid:thread; "" holds the folded counts of writers gone.', max_length=200),
                ),
                ("queue", models.CharField(max_length=100)),
                ("job_name", models.CharField(max_length=200)),
                ("metric", models.CharField(max_length=40)),
                ("value", models.BigIntegerField()),
                ("updated_ms", models.BigIntegerField()),
            ],
            options={
                "db_table": "durq_counter",
                "constraints": [
                    models.UniqueConstraint(fields=("writer", "queue", "job_name", "metric"), name="durq_counter_key")
                ],
            },
        ),
    ]
