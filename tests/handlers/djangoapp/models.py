from django.db import models


class Effect(models.Model):
    """A row a view or a task writes, for the tests to find."""

    note = models.TextField()
