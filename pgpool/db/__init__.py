"""The installation in PostgreSQL: the schema's migrations, one SQL file each
(`migrations/`), read and applied by `schema`, the roles' privileges (`grants`), finding
the database (`dsn`: a DSN, or the embedded server, `embedded`) and telling a database that
is gone from one that refuses (`outage`). It imports the ground floor of the API (errors,
logs, extras) and the statements in `pgpool.sql`, nothing else.

Adding a migration is adding one file, ``migrations/NNNN_what_it_does.sql`` with the next
number: its header says what it does (`pgpool.db.migrations` has the format), and
`schema` finds it, checks it and applies it; nothing else is edited.
"""
