"""Example handler modules: copy one, change the kinds, point `pgpool run --handlers` at it."""
