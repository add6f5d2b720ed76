"""Reading what an index hands a consumer: one GET of a page or file, bounded in bytes and wall-clock time,
credentials in a URL sent as basic auth to their own host only (`factory which`, `factory verify`, a build
request's POST); through `bounded.request` and `bounded.open_url` (its `opener`): the factory's one HTTP
stack.
"""

from __future__ import annotations

import contextlib
import urllib.error
import urllib.request
from collections.abc import Iterator
from urllib.parse import urlsplit

from factory.core import bounded
from factory.core.errors import FactoryError
from factory.core.urls import without_credentials
from factory.spec.options import MAX_PAGE, PAGE_DEADLINE_S


def _http_request(url: str, *, data: bytes | None = None, headers: dict[str, str]) -> urllib.request.Request:
    """A request for `url` (`bounded.request`: its user:pass@ a header for its own host only; file://
    directories: their index.html)."""
    if urlsplit(url).scheme == "file" and url.endswith("/"):
        url += "index.html"
    return bounded.request(url, data=data, headers=headers)


@contextlib.contextmanager
def open_url(
    url: str, *, accept: str, seconds: float | None = None, max_bytes: int | None = None, whole: bool = True
) -> Iterator[bounded.Body]:
    """Open one URL of an index for reading (`_http_request`), within a total wall-clock deadline (`seconds`,
    default PAGE_DEADLINE_S) and a byte cap (`max_bytes`, default MAX_PAGE) over connecting and every read
    (`bounded.open_url`; a file: URL is a regular file only; `whole=False`: the caller reads a prefix);
    FactoryError, naming the URL without its credentials, for HTTP errors, no answer, too slow or too
    large."""
    shown = without_credentials(url)
    limit = MAX_PAGE if max_bytes is None else max_bytes
    try:
        with bounded.open_url(
            _http_request(url, headers={"Accept": accept}),
            seconds=PAGE_DEADLINE_S if seconds is None else seconds,
            max_bytes=limit,
            shown=shown,
            whole=whole,
        ) as body:
            yield body
    except urllib.error.HTTPError as exc:
        raise FactoryError(f"{shown}: HTTP {exc.code}") from None
    except bounded.Refused as exc:
        raise FactoryError(str(exc)) from None
    except FileNotFoundError:
        raise FactoryError(f"{shown}: no such file") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc.strerror or exc
        raise FactoryError(f"{shown}: {reason}") from None


def fetch_page(url: str) -> str:
    """GET one HTML page (`open_url`: at most MAX_PAGE within PAGE_DEADLINE_S, never read whole past it)."""
    with open_url(url, accept="text/html") as resp:
        return resp.read_all().decode("utf-8", "replace")
