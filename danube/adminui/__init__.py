"""Upstream danube-admin's `/ui/v1/...` JSON API (danube-admin/src/server/), the API that
upstream's admin UI (danube-admin-ui) reads: the same paths, methods and answer shapes,
served by `danube admin serve` beside the web console. Like the console it reaches the
broker only through the admin client (danube.client.admin) and reads metrics from a
Prometheus HTTP API (danube.promql), as upstream does."""
