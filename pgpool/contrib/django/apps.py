"""The Django app: ``"pgpool.contrib.django"`` in ``INSTALLED_APPS``."""

from django.apps import AppConfig


class PgpoolConfig(AppConfig):
    """pgpool's app; its one migration installs or upgrades pgpool's tables."""

    name = "pgpool.contrib.django"
    label = "pgpool"
    verbose_name = "pgpool"
