"""Integrations with the frameworks applications enqueue from, one subpackage each, each
behind an extra (``pip install pgpool[django]``): pgpool itself imports none of them."""
