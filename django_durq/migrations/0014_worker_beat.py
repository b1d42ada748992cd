"""How often a worker that holds no presence lock writes its row (``durq_worker.beat_ms``).

Nullable without a default, so every database adds it in place. A worker that leaves it empty
(one that does not write its row that often) is left to its jobs' leases (worker/row_presence.py).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_durq", "0013_trace_context")]

    operations = [
        migrations.AddField(
            model_name="workerprocess",
            name="beat_ms",
            field=models.IntegerField(
                blank=True,
                help_text="Holding no lock, it writes last_seen_ms this often (ms); silent far longer, it is gone.",
                null=True,
            ),
        ),
    ]
