"""A page of a stored list (a response's input items, a conversation's items, files, batches) as
OpenAI's list endpoints give them: `order`, `limit` and `after` from the query string."""

from __future__ import annotations

from typing import Any, TypeVar
from urllib.parse import parse_qs

from .errors import bad_request
from .http import Request
from .responses_schemas import InputItemList

T = TypeVar("T")


def query_values(request: Request) -> dict[str, str]:
    """The query string's parameters, each its last value."""
    return {k: v[-1] for k, v in parse_qs(request.scope.get("query_string", b"").decode("latin-1")).items()}


def page_limit(query: dict[str, str], max_limit: int, default_limit: int) -> int:
    """The query's `limit`: 1 to `max_limit` (default `default_limit`); a 400 naming it otherwise."""
    try:
        limit = int(query.get("limit", str(default_limit)))
    except ValueError:
        limit = 0
    if not 1 <= limit <= max_limit:
        raise bad_request(f"limit must be an integer from 1 to {max_limit}", param="limit")
    return limit


def item_page(items: list[dict[str, Any]], request: Request, where: str, max_limit: int = 100,
              default_limit: int = 20, default_order: str = "desc") -> InputItemList:
    """A page of `items` (each with an id, oldest first): in the query's `order` (asc or desc,
    default `default_order`), `limit` (1 to `max_limit`, default `default_limit`) at a time after
    the item `after` (`where`: what holds them, for its error)."""
    query = query_values(request)
    order = query.get("order", default_order)
    if order not in ("asc", "desc"):
        raise bad_request("order must be asc or desc", param="order")
    limit = page_limit(query, max_limit, default_limit)
    listed = items if order == "asc" else items[::-1]
    after = query.get("after")
    if after is not None:
        ids = [item["id"] for item in listed]
        if after not in ids:
            raise bad_request(f"no item {after!r} in {where}", param="after")
        listed = listed[ids.index(after) + 1:]
    page = listed[:limit]
    return InputItemList(page, page[0]["id"] if page else None, page[-1]["id"] if page else None,
                         len(listed) > limit)


def id_page(items: list[T], ids: list[str], request: Request, what: str, max_limit: int = 1000,
            default_limit: int = 20) -> tuple[list[T], bool]:
    """Anthropic's page of `items` (in the list's order; `ids` theirs): the query's `limit` (1 to
    `max_limit`) after `after_id` or before `before_id`, and whether there are more that way
    (`has_more`). An id not in the list is a 400 naming its key (`what`: what the ids name)."""
    query = query_values(request)
    limit = page_limit(query, max_limit, default_limit)
    if "after_id" in query and "before_id" in query:  # (before_id alone was followed)
        raise bad_request("give after_id or before_id, not both", param="before_id")
    for key in ("after_id", "before_id"):
        if key in query and query[key] not in ids:
            raise bad_request(f"no {what} {query[key]!r} in the list", param=key)
    if "before_id" in query:
        end = ids.index(query["before_id"])
        return items[max(0, end - limit):end], end > limit
    start = ids.index(query["after_id"]) + 1 if "after_id" in query else 0
    return items[start:start + limit], len(items) > start + limit
