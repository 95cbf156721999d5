"""``pgpool web``: a live dashboard of the queue, served by one small HTTP server.

`pgpool.web.server` answers the page, its assets (``static/``, shipped in the package), the
JSON API the page reads and acts through, ``/metrics`` and ``/healthz``;
`pgpool.web.snapshots` is the one snapshot loop that feeds every open page. Both need the
``web`` extra (aiohttp); this package's ``__init__`` imports nothing, so the CLI can say so
in one line when it is missing.
"""
