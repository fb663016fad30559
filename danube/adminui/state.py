"""What every handler of the UI API shares: the admin client, the Prometheus queries and
one short-lived cache of whole answers (upstream keeps one per page, for --cache-ttl-ms)."""

from danube.console.cache import TtlCache


class UiState:
    def __init__(self, admin, queries, cache_ttl):
        self.admin = admin
        self.queries = queries
        self.cache = TtlCache(cache_ttl)

    async def call(self, service, method, request=None):
        return await self.admin.call(service, method, request)

    def forget(self, *keys):
        """After a write: the cached answers it made stale."""
        if not keys:
            self.cache.clear()
        for key in keys:
            self.cache.drop(key)
