"""A raw HTTP/1.1 client for uploads to `captioner serve` that behaves like a patient browser under refusal:
it stops sending the body as soon as the server has answered (a 413 mid-body, a 503 before it), reads the
answer, and reports how much of the body it had sent. Shared by the server's limit tests and its load test."""

from __future__ import annotations

import json
import select
import socket
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator

PIECE = 64 * 1024  # bytes sent between two looks for an early answer


@dataclass
class Answer:
    status: int  # 0: no answer (the connection failed)
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    sent: int = 0  # body bytes sent before the answer came (or all of them)
    seconds: float = 0.0
    error: str = ""

    def json(self) -> dict:
        return json.loads(self.body)


def multipart(filename: str, data: bytes, boundary: str = "captionerboundary") -> tuple[bytes, str]:
    """(body, content type) of a multipart/form-data upload of ``data`` in the field 'image'; ``filename`` goes
    into the header as it is (control characters included, which is the point of some tests)."""
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"image\"; filename=\"{filename}\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode("utf-8", "surrogateescape")
    return head + data + f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def _pieces(body: bytes | Iterable[bytes]) -> Iterator[bytes]:
    if isinstance(body, bytes):
        for start in range(0, len(body), PIECE):
            yield body[start : start + PIECE]
    else:
        yield from body


def _read_answer(sock: socket.socket, deadline: float) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the answer's headers")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body[:length]


def post(port: int, body: bytes | Iterable[bytes], content_type: str, path: str = "/api/caption",
         host: str = "127.0.0.1", content_length: int | None = None, extra_headers: dict[str, str] | None = None,
         timeout: float = 60.0) -> Answer:
    """POST ``body`` (bytes, or pieces sent chunked when ``content_length`` is None and body is not bytes);
    ``content_length`` may declare more than is sent (an oversized upload that stops once refused)."""
    chunked = not isinstance(body, bytes) and content_length is None
    if isinstance(body, bytes) and content_length is None:
        content_length = len(body)
    headers = {"Host": f"{host}:{port}", "Content-Type": content_type, **(extra_headers or {})}
    headers.update({"Transfer-Encoding": "chunked"} if chunked else {"Content-Length": str(content_length)})
    request = f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    start = time.monotonic()
    deadline = start + timeout
    answer = Answer(0)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(request.encode("latin-1"))
            for piece in _pieces(body):
                if select.select([sock], [], [], 0)[0]:
                    break  # answered already: the rest is not wanted
                try:
                    sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                except (BrokenPipeError, ConnectionResetError):
                    break
                answer.sent += len(piece)
            else:
                if chunked:
                    sock.sendall(b"0\r\n\r\n")
            answer.status, answer.headers, answer.body = _read_answer(sock, deadline)
    except (OSError, ValueError, IndexError) as err:
        answer.error = f"{type(err).__name__}: {err}"
    answer.seconds = time.monotonic() - start
    return answer
