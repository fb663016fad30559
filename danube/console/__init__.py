"""The web console of `danube admin serve`: a Starlette app that renders server-side HTML
pages (Jinja2 templates, a little vanilla JS for live refresh) from a broker's admin API.

It talks to the broker through danube.client.admin.AdminClient only, wrapped by
``backend.Backend`` (which caches list answers and turns messages into plain dicts), so the
app can be driven by any object with the same methods."""
