"""The console's HTML pages and form actions. A page with live figures renders them from a
partial template (``_*_live.html``); the same URL with ``?live=1`` answers that partial
alone, which the page's script fetches every 2 s and swaps in."""

from urllib.parse import parse_qsl, quote

from starlette.responses import RedirectResponse
from starlette.routing import Route

from danube.client import errors

from danube.console import forms, listing
from danube.console.backend import totals
from danube.console.render import broker_status, render, topic_path


def routes():
    return [
        Route("/", dashboard),
        Route("/namespaces/{namespace}", namespace),
        Route("/create-topic", create_topic, methods=["GET", "POST"]),
        Route("/topics/{namespace}/{topic}", topic),
        Route("/topics/{namespace}/{topic}/unsubscribe", unsubscribe, methods=["POST"]),
        Route("/topics/{namespace}/{topic}/failure-policy", set_failure_policy,
              methods=["POST"]),
        Route("/topics/{namespace}/{topic}/subscriptions/{subscription:path}", subscription),
        Route("/schemas", schemas),
        Route("/schemas/{subject:path}", subject),
    ]


def _render(request, template, live_template=None, **context):
    if live_template and request.query_params.get("live"):
        return render(request, live_template, **context)
    return render(request, template, **context)


def _backend(request):
    return request.app.state.backend


def _topic_name(request):
    p = request.path_params
    return f"/{p['namespace']}/{p['topic']}"


async def _form(request):
    body = (await request.body()).decode("utf-8", "replace")
    return dict(parse_qsl(body, keep_blank_values=True))


async def dashboard(request):
    data = await _backend(request).overview()
    return _render(request, "dashboard.html", "_dashboard_live.html", **data)


async def namespace(request):
    ns = request.path_params["namespace"]
    rows = await _backend(request).namespace_topics(ns)
    query = listing.Query(request.query_params)
    return _render(request, "namespace.html", "_namespace_live.html", namespace=ns,
                   query=query, listing=listing.page_of(rows, query), totals=totals(rows),
                   sortable=listing.SORTABLE)


async def topic(request):
    name = _topic_name(request)
    info = await _backend(request).topic(name)
    return _render(request, "topic.html", "_topic_live.html", topic=info,
                   notice=request.query_params.get("notice"))


async def subscription(request):
    name = _topic_name(request)
    sub = request.path_params["subscription"]
    info = await _backend(request).subscription(name, sub)
    return _render(request, "subscription.html", "_subscription_live.html", sub=info,
                   notice=request.query_params.get("notice"), error=None, form=None)


async def unsubscribe(request):
    name = _topic_name(request)
    form = await _form(request)
    sub = form.get("subscription", "")
    try:
        await _backend(request).unsubscribe(name, sub)
    except errors.DanubeError as exc:
        return await _topic_with_error(request, name, str(exc), exc)
    return _see(topic_path(name), f"subscription {sub} removed")


async def set_failure_policy(request):
    name = _topic_name(request)
    form = await _form(request)
    sub = form.get("subscription", "")
    backend = _backend(request)
    try:
        policy = forms.failure_policy(form)
        await backend.set_failure_policy(name, sub, policy)
    except (forms.FormError, errors.DanubeError) as exc:
        status = 400 if isinstance(exc, forms.FormError) else broker_status(exc)
        info = await backend.subscription(name, sub)
        return render(request, "subscription.html", status, sub=info, notice=None,
                      error=str(exc), form=form)
    return _see(f"{topic_path(name)}/subscriptions/{quote(sub, safe='')}",
                "failure policy saved")


async def create_topic(request):
    if request.method == "GET":
        return render(request, "create_topic.html", form={
            "namespace": request.query_params.get("namespace", "default"),
            "dispatch_strategy": "reliable"}, error=None)
    form = await _form(request)
    try:
        fields = forms.create_topic(form)
        await _backend(request).create_topic(**fields)
    except forms.FormError as exc:
        return render(request, "create_topic.html", 400, form=form, error=str(exc))
    except errors.DanubeError as exc:
        return render(request, "create_topic.html", broker_status(exc), form=form,
                      error=str(exc))
    notice = f"topic {fields['name']} created"
    if fields["partitions"]:
        notice += f" with {fields['partitions']} partitions"
    return _see(topic_path(fields["name"]), notice)


async def schemas(request):
    return _render(request, "schemas.html", subjects=await _backend(request).subjects())


async def subject(request):
    version = request.query_params.get("version")
    try:
        version = int(version) if version else None
    except ValueError:
        version = None
    data = await _backend(request).subject(request.path_params["subject"], version)
    return _render(request, "subject.html", **data)


async def _topic_with_error(request, name, message, exc):
    info = await _backend(request).topic(name)
    return render(request, "topic.html", broker_status(exc), topic=info, notice=None,
                  error=message)


def _see(url, notice):
    return RedirectResponse(f"{url}?notice={quote(notice, safe='')}", status_code=303)
