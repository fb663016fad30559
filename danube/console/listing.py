"""One page of a namespace's topic table: filter by a name substring, sort by a column,
slice. A namespace of 10,000 topics renders 100 rows at a time, so the page costs the same
whatever the namespace holds (the broker's answer itself is cached for the TTL)."""

DEFAULT_PER_PAGE = 100
MAX_PER_PAGE = 10_000
SORTABLE = ("name", "delivery", "msg_rate_in", "messages_in", "backlog", "subscriptions",
            "producers", "consumers")


class Query:
    """The table's query string: q (name contains), sort, desc, page (from 1), per."""

    def __init__(self, params):
        self.q = params.get("q", "").strip()
        sort = params.get("sort", "name")
        self.sort = sort if sort in SORTABLE else "name"
        self.desc = params.get("desc", "") in ("1", "true", "yes")
        self.page = _int(params.get("page"), 1, 1, 10**9)
        self.per = _int(params.get("per"), DEFAULT_PER_PAGE, 1, MAX_PER_PAGE)

    def args(self, **change):
        """The query string of this view with ``change`` applied (for links)."""
        values = {"q": self.q, "sort": self.sort, "desc": "1" if self.desc else "",
                  "page": self.page, "per": self.per}
        values.update(change)
        return "&".join(f"{k}={_quote(v)}" for k, v in values.items()
                        if v not in ("", None) and not (k == "per" and v == DEFAULT_PER_PAGE)
                        and not (k == "page" and v == 1) and not (k == "sort" and v == "name"))


def page_of(rows, query):
    """{rows, total, matched, page, pages, first, last} for the query."""
    if query.q:
        needle = query.q.lower()
        rows = [r for r in rows if needle in r["name"].lower()]
    if query.sort != "name" or query.desc:
        key = query.sort
        # Ties keep name order (the broker's order), so the table does not shuffle on
        # refresh when many rows share a value (0 msg/s, say).
        rows = sorted(rows, key=lambda r: r[key], reverse=query.desc)
    matched = len(rows)
    pages = max(1, -(-matched // query.per))
    page = min(query.page, pages)
    start = (page - 1) * query.per
    return {"rows": rows[start:start + query.per], "matched": matched, "page": page,
            "pages": pages, "first": start + 1 if matched else 0,
            "last": min(start + query.per, matched)}


def _int(text, default, low, high):
    try:
        value = int(text)
    except (TypeError, ValueError):
        return default
    return min(max(value, low), high)


def _quote(value):
    from urllib.parse import quote
    return quote(str(value), safe="")
