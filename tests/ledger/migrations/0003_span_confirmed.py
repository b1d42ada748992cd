from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("ledger", "0002_span")]

    operations = [
        migrations.AddField(model_name="span", name="confirmed", field=models.TextField(blank=True, default="")),
    ]
