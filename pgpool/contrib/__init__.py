"""Integrations with the frameworks applications enqueue from, each behind its own extra
(``pgpool[sqlalchemy]``, ``pgpool[django]``): pgpool itself never imports them."""
