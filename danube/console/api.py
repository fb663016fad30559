"""The console's JSON endpoints (GET only): what the pages show, for scripts and for a
browser on another origin when --cors-allow-origin names it."""

from starlette.routing import Route

from danube.console import listing
from danube.console.backend import totals
from danube.console.render import json_response


def routes():
    return [
        Route("/api/overview", overview),
        Route("/api/namespaces/{namespace}/topics", namespace_topics),
        Route("/api/topics/{namespace}/{topic}", topic),
        Route("/api/topics/{namespace}/{topic}/subscriptions/{subscription:path}",
              subscription),
        Route("/api/schemas", schemas),
        Route("/api/schemas/{subject:path}", subject),
    ]


def _backend(request):
    return request.app.state.backend


def _topic_name(request):
    p = request.path_params
    return f"/{p['namespace']}/{p['topic']}"


async def overview(request):
    return json_response(await _backend(request).overview())


async def namespace_topics(request):
    """One page of the namespace's topics (?q, sort, desc, page, per as on the page; per up
    to 10,000) and the namespace's totals."""
    rows = await _backend(request).namespace_topics(request.path_params["namespace"])
    query = listing.Query(request.query_params)
    page = listing.page_of(rows, query)
    page["per"] = query.per
    page["totals"] = totals(rows)
    return json_response(page)


async def topic(request):
    return json_response(await _backend(request).topic(_topic_name(request)))


async def subscription(request):
    data = await _backend(request).subscription(_topic_name(request),
                                                request.path_params["subscription"])
    return json_response(data)


async def schemas(request):
    return json_response(await _backend(request).subjects())


async def subject(request):
    version = request.query_params.get("version")
    version = int(version) if version and version.isdigit() else None
    return json_response(await _backend(request).subject(request.path_params["subject"],
                                                         version))
