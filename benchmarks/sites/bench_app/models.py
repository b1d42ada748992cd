from django.db import models


class AppRow(models.Model):
    created = models.DateTimeField(auto_now_add=True)
    payload = models.CharField(max_length=100)
