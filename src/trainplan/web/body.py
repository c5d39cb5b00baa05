"""What the web API accepts as a request body, and how it writes its answers.

A body is read only when it is a JSON POST from this origin (`check_headers`), at most
MAX_BODY_BYTES, nested at most MAX_DEPTH deep, with integers of at most MAX_INT_DIGITS digits
and finite numbers only (`parse`). Every refusal is a `Refusal`: an HTTP status with the field
and the rule. Answers are written as strict JSON (`dumps`): no NaN or Infinity, which browsers
cannot parse.
"""

from __future__ import annotations

import json
import math
import re
from urllib.parse import urlsplit

MAX_BODY_BYTES = 256 * 1024  # a pasted config.json is a few KB
MAX_DEPTH = 64  # a real config.json nests 3 or 4 deep
MAX_INT_DIGITS = 64  # far past any count of GPUs, tokens or parameters; far below Python's 4,300-digit limit

# A JSON string (closed or not: the match never fails, so the scan stays linear) or a bracket.
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.?)*"?|[\[\]{}]')


class Refusal(Exception):
    """A request the API does not run: its HTTP status, the field and the rule."""

    def __init__(self, status: int, field: str, rule: str, headers: dict[str, str] | None = None,
                 where: str = "body"):
        super().__init__(f"{field}: {rule}")
        self.status, self.field, self.rule, self.headers, self.where = status, field, rule, headers or {}, where

    def content(self) -> dict:
        return {"field": self.field, "rule": self.rule,
                "detail": [{"loc": [self.where, self.field], "msg": self.rule, "type": "plan_error"}]}


# The names a server on loopback answers to. A request naming another host reached it through
# a name that resolves to this machine: DNS rebinding, where another site's page re-points its
# own name at 127.0.0.1 and so passes the same-origin check below. Refused.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def check_host(headers, allowed: frozenset[str] | None) -> None:
    """The Host header names one of `allowed` (any port); None allows every host (a server
    bound to all interfaces on purpose)."""
    if allowed is None:
        return
    host = headers.get("host", "")
    try:
        name = urlsplit("//" + host).hostname
    except ValueError:
        name = None
    if name not in allowed:
        raise Refusal(421, "host", f"{host!r} is not a name of this server ({', '.join(sorted(allowed))}); "
                      "open the explorer by one of those", where="header")


def check_headers(headers) -> None:
    """A POST must say it is JSON (a form or text/plain POST is what another site's page can send
    without asking: refused, 415) and, when the browser names its origin, come from the page this
    server serves (403)."""
    media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise Refusal(415, "content-type", f"must be application/json (got {media or 'none'})",
                      where="header")
    origin = headers.get("origin")
    if origin is not None:
        host = headers.get("host", "").lower()
        parts = urlsplit(origin.strip().lower())
        if parts.scheme not in ("http", "https") or not host or parts.netloc != host:
            raise Refusal(403, "origin", f"{origin!r} is not this server ({host or 'no Host header'}); "
                          "the API answers its own page only", where="header")


class _Big:
    """An integer with too many digits, kept to name its field."""


class _NotFinite:
    def __init__(self, text: str):
        self.text = text


def _parse_int(text: str):
    return _Big() if len(text.lstrip("-")) > MAX_INT_DIGITS else int(text)


def _parse_float(text: str):
    value = float(text)
    return value if math.isfinite(value) else _NotFinite(text)


def _depth(raw: bytes) -> int:
    """How deep the brackets of `raw` nest (brackets inside strings do not count); stops counting
    past MAX_DEPTH."""
    depth = deepest = 0
    for match in _TOKENS.finditer(raw):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
            if depth > MAX_DEPTH:
                break
        elif token in (b"]", b"}"):
            depth -= 1
    return deepest


def parse(raw: bytes) -> dict:
    """The JSON object of a body, or a 422 Refusal naming the field that cannot be read."""
    if len(raw) > MAX_BODY_BYTES:
        raise Refusal(413, "body", f"request body must be at most {MAX_BODY_BYTES} bytes")
    if _depth(raw) > MAX_DEPTH:
        raise Refusal(422, "body", f"must nest at most {MAX_DEPTH} levels of objects and lists")
    try:
        body = json.loads(raw or b"{}", parse_int=_parse_int, parse_float=_parse_float, parse_constant=_NotFinite)
    except json.JSONDecodeError as exc:
        raise Refusal(422, "body", f"must be a JSON object ({exc.msg})") from None
    except (UnicodeDecodeError, RecursionError, ValueError) as exc:
        raise Refusal(422, "body", f"must be a JSON object in UTF-8 ({exc.__class__.__name__})") from None
    if not isinstance(body, dict):
        raise Refusal(422, "body", "must be a JSON object of plan options")
    for path, value in _leaves(body):
        if isinstance(value, _Big):
            raise Refusal(422, path, f"integers have at most {MAX_INT_DIGITS} digits")
        if isinstance(value, _NotFinite):
            raise Refusal(422, path, f"must be a finite number (got {value.text})")
    return body


def _leaves(obj, prefix: str = ""):
    """(dotted path, value) of every value in a parsed body, iteratively (no recursion)."""
    stack = [(prefix, obj)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((f"{path}.{k}" if path else str(k), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{path}.{i}" if path else str(i), v) for i, v in enumerate(value))
        else:
            yield path, value


def dumps(data) -> bytes:
    """Strict JSON: a figure that is not finite is a 422 naming it, never NaN in the answer."""
    try:
        return json.dumps(data, separators=(",", ":"), allow_nan=False).encode()
    except ValueError:
        bad = next((p for p, v in _leaves(data) if isinstance(v, float) and not math.isfinite(v)), "result")
        raise Refusal(422, bad, "is not a finite number: these options lead to a figure that cannot be "
                      "computed") from None
