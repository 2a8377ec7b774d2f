"""What `captioner serve` refuses, and where: the demo server is the part of the project that strangers'
bytes reach, so every request is bounded before it costs memory, disk or CPU.

- ``RequestGuard`` (ASGI middleware, every route): the Host header must name this server (by default
  ``127.0.0.1``, ``localhost`` or ``--host``; ``--allow-host`` adds names), so a web page cannot reach it
  through DNS rebinding (400); with ``--token`` every request must carry the token (401).
- ``AdmissionGate``: at most ``max_in_flight`` uploads are decoded and captioned at once and ``max_queue``
  more wait; beyond that the answer is 503 at once, with ``Retry-After``, before the body is read.
- ``read_multipart_upload``: the body is read as it streams in and parsed in memory; past the upload limit
  (a declared Content-Length or the bytes counted so far) the answer is 413 and the rest is never stored,
  so nothing reaches the disk. A body that stalls is answered 408.
- ``clean_filename``: the uploaded name is only ever echoed back, without path parts, control characters
  (a NUL byte among them) or excess length.

The pixel limit (``--max-pixels``, checked from the image header before decoding) is the image loader's
(captioner/data/images.py), applied to the upload in ``serve.read_upload``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import math
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable
from urllib.parse import parse_qs

MAX_UPLOAD_BYTES = 20 * 1024 * 1024
MULTIPART_OVERHEAD = 64 * 1024  # body bytes allowed beyond the file: boundaries and part headers
MAX_PIXELS = 40_000_000  # a 40-megapixel photo decodes to 120 MB of RGB; the 9400x9400 16-bit PNG is refused
MAX_IN_FLIGHT = 2  # uploads decoded or captioned at once: one decodes while another is captioned
MAX_QUEUE = 8  # admitted uploads waiting for a slot (their bodies held in memory, each <= the upload limit)
BODY_TIMEOUT_S = 60.0  # a body that has not fully arrived by then is answered 408
FILENAME_MAX_CHARS = 100
LOOPBACK_HOSTS = ("127.0.0.1", "localhost")
TOKEN_COOKIE = "captioner_token"
TOKEN_HEADER = "x-captioner-token"

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


class Refusal(Exception):
    """A request the server answers with ``status`` and ``detail`` (JSON, as FastAPI's HTTPException)."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.headers = status, detail, headers or {}


def clean_filename(raw: str | None, fallback: str = "upload") -> str:
    """The name to echo back for an uploaded file: its last path part, printable characters only, at most
    FILENAME_MAX_CHARS (the suffix kept), or ``fallback`` when nothing is left."""
    name = (raw or "").replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(ch for ch in name if ch.isprintable()).strip()
    if len(name) > FILENAME_MAX_CHARS:
        stem, dot, suffix = name.rpartition(".")
        suffix = suffix[:10] if dot else ""
        name = stem[: FILENAME_MAX_CHARS - len(suffix) - 4] + "..." + ("." + suffix if suffix else "")
    return name or fallback


def host_name(header: str | None) -> str:
    """The host part of a Host header, lowercased, without port or trailing dot ("[::1]:80" -> "::1")."""
    host = (header or "").strip().lower()
    if host.startswith("["):  # an IPv6 literal
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


# --------------------------------------------------------------------------------------- Host and token


async def send_json(send: Send, status: int, body: dict, headers: Iterable[tuple[str, str]] = ()) -> None:
    """A complete JSON response through raw ASGI."""
    data = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})


class RequestGuard:
    """ASGI middleware: answers 400 for a Host header this server does not go by, and 401 without the token
    (when one is set). A valid ``?token=`` on a page request also sets a same-site cookie, so the page's
    own requests carry it."""

    def __init__(self, app: Any, allowed_hosts: Iterable[str], token: str | None = None) -> None:
        self.app = app
        self.allowed = {host_name(h) for h in allowed_hosts}
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = host_name(headers.get("host"))
        if host not in self.allowed:
            detail = (f"this server does not answer to the Host {host or '(none)'!r} (it answers to "
                      f"{', '.join(sorted(self.allowed))}; `captioner serve --allow-host NAME` adds one)")
            return await send_json(send, 400, {"detail": detail})
        if self.token is None:
            return await self.app(scope, receive, send)
        given, from_query = self._presented_token(scope, headers)
        if given is None or not hmac.compare_digest(given.encode(), self.token.encode()):
            detail = ("this server needs its token: open the address `captioner serve` printed (…/?token=…), "
                      f"or send the header {TOKEN_HEADER}")
            return await send_json(send, 401, {"detail": detail})
        if not from_query:
            return await self.app(scope, receive, send)

        async def send_with_cookie(message: dict) -> None:
            if message["type"] == "http.response.start":
                cookie = f"{TOKEN_COOKIE}={self.token}; Path=/; HttpOnly; SameSite=Strict"
                message = {**message, "headers": [*message.get("headers", []),
                                                  (b"set-cookie", cookie.encode("latin-1"))]}
            await send(message)

        await self.app(scope, receive, send_with_cookie)

    @staticmethod
    def _presented_token(scope: Scope, headers: dict[str, str]) -> tuple[str | None, bool]:
        """(the token the request carries, whether it came in the query string)."""
        query = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token")
        if query:
            return query[0], True
        if TOKEN_HEADER in headers:
            return headers[TOKEN_HEADER], False
        authorization = headers.get("authorization", "")
        if authorization.lower().startswith("bearer "):
            return authorization[7:].strip(), False
        for part in headers.get("cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == TOKEN_COOKIE:
                return value, False
        return None, False


# --------------------------------------------------------------------------------------- admission


class AdmissionGate:
    """Bounds the uploads a server holds: ``max_in_flight`` decode and caption at once (``slot``), up to
    ``max_queue`` more wait for a slot; ``admit`` refuses beyond that with 503 and a Retry-After estimated from
    recent service times. Lives on the server's event loop: ``admit``/``leave`` run there, not in threads."""

    def __init__(self, max_in_flight: int = MAX_IN_FLIGHT, max_queue: int = MAX_QUEUE) -> None:
        if max_in_flight < 1 or max_queue < 0:
            raise ValueError(f"max_in_flight must be >= 1 and max_queue >= 0, got {max_in_flight} and {max_queue}")
        self.max_in_flight, self.max_queue = max_in_flight, max_queue
        self.admitted = 0  # requests between admit() and leave(): reading their body, waiting or in flight
        self.peak = 0
        self.service_s = 1.0  # moving average of one upload's decode + caption time
        self._slots: asyncio.Semaphore | None = None  # made on the loop that uses it (a test client may
        self._loop: asyncio.AbstractEventLoop | None = None  # run each request on a loop of its own)

    @property
    def capacity(self) -> int:
        return self.max_in_flight + self.max_queue

    def retry_after(self) -> int:
        """Seconds until a slot is likely free: the queue ahead, served max_in_flight at a time."""
        return max(1, math.ceil(self.service_s * self.capacity / self.max_in_flight))

    def admit(self) -> None:
        if self.admitted >= self.capacity:
            raise Refusal(503, f"the server is busy ({self.max_in_flight} uploads in flight and {self.max_queue} "
                               "waiting); try again shortly", {"Retry-After": str(self.retry_after())})
        self.admitted += 1
        self.peak = max(self.peak, self.admitted)

    def leave(self) -> None:
        self.admitted -= 1

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._slots, self._loop = asyncio.Semaphore(self.max_in_flight), loop
        async with self._slots:
            start = time.perf_counter()
            try:
                yield
            finally:
                self.service_s = 0.8 * self.service_s + 0.2 * (time.perf_counter() - start)


# --------------------------------------------------------------------------------------- the body


def _multipart() -> tuple[Any, Callable]:
    """python-multipart's streaming MultipartParser and its header parser (the import name changed in 0.0.13)."""
    try:
        from python_multipart.multipart import MultipartParser, parse_options_header
    except ImportError:  # python-multipart < 0.0.13
        from multipart.multipart import MultipartParser, parse_options_header  # type: ignore[no-redef]
    return MultipartParser, parse_options_header


class _ImagePart:
    """Collects the 'image' part of a multipart body through python-multipart's callbacks (other parts are
    read past, not kept); raises Refusal(413) as soon as the image passes ``max_bytes``."""

    def __init__(self, max_bytes: int, parse_options_header: Callable) -> None:
        self.max_bytes = max_bytes
        self._parse_options = parse_options_header
        self.data: bytearray | None = None
        self.filename: str | None = None
        self._headers: dict[bytes, bytes] = {}
        self._field, self._value = b"", b""
        self._current = False

    def callbacks(self) -> dict[str, Callable]:
        return {"on_part_begin": self._begin, "on_header_field": self._on_field, "on_header_value": self._on_value,
                "on_header_end": self._header_end, "on_headers_finished": self._headers_done,
                "on_part_data": self._on_data}

    def _begin(self) -> None:
        self._headers, self._field, self._value, self._current = {}, b"", b"", False

    def _on_field(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]

    def _on_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def _header_end(self) -> None:
        self._headers[self._field.strip().lower()] = self._value.strip()
        self._field, self._value = b"", b""

    def _headers_done(self) -> None:
        _, options = self._parse_options(self._headers.get(b"content-disposition", b""))
        if options.get(b"name") == b"image" and self.data is None:
            self._current, self.data = True, bytearray()
            self.filename = options.get(b"filename", b"").decode("utf-8", "replace")

    def _on_data(self, data: bytes, start: int, end: int) -> None:
        if not self._current:
            return
        if len(self.data) + (end - start) > self.max_bytes:
            raise Refusal(413, f"{clean_filename(self.filename)!r} is larger than the "
                               f"{self.max_bytes / 2**20:g} MiB this server accepts")
        self.data += data[start:end]


async def read_multipart_upload(headers: dict[str, str], chunks: AsyncIterator[bytes],
                                max_bytes: int = MAX_UPLOAD_BYTES,
                                timeout_s: float = BODY_TIMEOUT_S) -> tuple[str, bytes]:
    """(clean file name, bytes) of the multipart field 'image', read from ``chunks`` as they arrive and parsed
    in memory. Refusal(413) past ``max_bytes`` (declared or counted: nothing more is read), 408 when the body
    takes longer than ``timeout_s``, 400 for a body that is not multipart or holds no image."""
    parser_class, parse_options_header = _multipart()
    kind, options = parse_options_header(headers.get("content-type", ""))
    if kind != b"multipart/form-data" or not options.get(b"boundary"):
        raise Refusal(400, "no image uploaded (send it as multipart/form-data, in the field 'image')")
    limit = max_bytes + MULTIPART_OVERHEAD
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise Refusal(413, f"the upload is larger than the {max_bytes / 2**20:g} MiB this server accepts "
                           f"(Content-Length {int(declared)})")
    image = _ImagePart(max_bytes, parse_options_header)
    parser = parser_class(options[b"boundary"], image.callbacks())
    received = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in chunks:
                received += len(chunk)
                if received > limit:
                    raise Refusal(413, f"the upload is larger than the {max_bytes / 2**20:g} MiB this server "
                                       "accepts")
                parser.write(chunk)
        parser.finalize()
    except TimeoutError:
        raise Refusal(408, f"the upload did not arrive within {timeout_s:g} s") from None
    except Refusal:
        raise
    except Exception as err:  # noqa: BLE001 - python-multipart's parse errors: a malformed body
        raise Refusal(400, f"malformed multipart body ({type(err).__name__}: {err})") from None
    if image.data is None:
        raise Refusal(400, "no image uploaded (send it as the multipart field 'image')")
    return clean_filename(image.filename), bytes(image.data)
