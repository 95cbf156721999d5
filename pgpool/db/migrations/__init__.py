"""pgpool's schema migrations, one SQL file each, applied in order by `pgpool.db.schema.migrate`.

A file is named ``NNNN_what_it_does.sql``: ``NNNN`` is its version, four digits, so that
``ls`` lists them in the order they apply; the words after it are for the reader. The
versions run from 1. Adding a migration is adding the next file; a number may be missing
while a migration written in parallel with it is not merged yet (then `migrate` applies
that one too once it arrives, even into a database that has a later one). A migration
that has shipped is never edited, since databases have applied it as it was: a change is a
new migration (tests/test_schema.py keeps a digest of each shipped one).

A file opens with a header of ``--`` comment lines, then a blank line, then the SQL::

    -- description: what it does, recorded in pgpool_schema_version
    -- drain: what it holds while it works through a table's rows (only for such a one)
    --   a line of -- and two spaces or more continues the field above it

    CREATE TABLE pgpool_...

``description`` is required, ``drain`` optional: `pgpool migrate` names the migrations
that have one before it applies them, since the fleet should be stopped for them
(`pgpool.db.schema.Migration`). The SQL's own comments come after the blank line. `migrate`
runs the SQL as it stands, in one transaction with the other migrations it applies, with
``search_path`` set to the installation's schema: tables are named unqualified.

The metadata is a comment in the file rather than a Python table beside it, so that a
migration is one file to read, review and add, and the whole file is SQL to an editor or
to psql. A malformed file (its name, its header, a version 0 or a repeated version) stops
pgpool with a `pgpool.SchemaError` naming it, the first time the migrations are read: when
a command checks or migrates the schema, never when `pgpool` is imported.
"""
