"""The installation in PostgreSQL: the schema and its migrations (`schema`), the roles'
privileges (`grants`), finding the database (`dsn`: a DSN, or the embedded server,
`embedded`) and telling a database that is gone from one that refuses (`outage`). It
imports the ground floor of the API (errors, logs, extras) and the statements in
`pgpool.sql`, nothing else.
"""
