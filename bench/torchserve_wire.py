"""HTTP/1.1 over a raw socket, recorded byte for byte, and its Markdown (bench/torchserve_facts.py).

:func:`exchange` sends the bytes it shows and reads the answer as it comes:
the status line and headers verbatim (their case, their order), an interim
``100 Continue``, a chunked body chunk by chunk with each one's arrival time.
:class:`Recorder` writes calls as Markdown, the real ports shown as
TorchServe's defaults.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from bench.servers import PeerServer

SHOWN_PORTS = {"inference": 8080, "management": 8081, "metrics": 8082}
BODY_SHOWN = 1500
BOUNDARY = "----facts7MA4YWxkTrZu0gW"


@dataclass
class Exchange:
    """One call as it went over the socket."""

    request: bytes
    status: str = ""
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    interim: list[str] = field(default_factory=list)
    chunks: list[tuple[float, bytes]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def code(self) -> int:
        """The status code; 0 when there was no answer."""
        parts = self.status.split()
        return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    def json(self) -> Any:
        return json.loads(self.body)


def exchange(
    base: str,
    method: str,
    path: str,
    body: bytes | str = b"",
    headers: dict[str, str] | None = None,
    expect_continue: bool = False,
    timeout: float = 120.0,
) -> Exchange:
    """Send one HTTP/1.1 request on a fresh connection and read its whole answer."""
    where = urlsplit(base)
    data = body.encode() if isinstance(body, str) else body
    lines = [f"{method} {path} HTTP/1.1", f"Host: {where.netloc}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if data or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(data)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode()
    start = time.monotonic()
    result = Exchange(head + data)
    try:
        with socket.create_connection((where.hostname, where.port), timeout=timeout) as sock:
            stream = sock.makefile("rb")
            sock.sendall(head)
            if expect_continue:
                status, _ = _read_head(stream)
                result.interim.append(status)
            sock.sendall(data)
            while True:
                result.status, result.headers = _read_head(stream)
                if result.code != 100:
                    break
                result.interim.append(result.status)
            _read_body(stream, result, start)
    except OSError as error:  # a timeout or a closed connection: shown as the answer
        result.status = f"(no answer after {time.monotonic() - start:.0f} s: {error!r})"
    result.seconds = time.monotonic() - start
    return result


def _read_head(stream: Any) -> tuple[str, list[tuple[str, str]]]:
    status = stream.readline().decode("latin-1").rstrip("\r\n")
    headers = []
    while (line := stream.readline().decode("latin-1").rstrip("\r\n")) != "":
        name, _, value = line.partition(":")
        headers.append((name, value.strip()))
    return status, headers


def _read_body(stream: Any, result: Exchange, start: float) -> None:
    if (result.header("transfer-encoding") or "").lower() == "chunked":
        while size := int(stream.readline().split(b";")[0], 16):
            chunk = stream.read(size)
            stream.readline()
            result.chunks.append((time.monotonic() - start, chunk))
        while stream.readline() not in (b"\r\n", b""):
            pass  # trailers
        result.body = b"".join(c for _, c in result.chunks)
    elif (length := result.header("content-length")) is not None:
        result.body = stream.read(int(length))
    elif result.code not in (204, 304):
        result.body = stream.read()


def multipart(fields: list[tuple[str, str | None, str | None, bytes]]) -> tuple[str, bytes]:
    """(content type, body) of a multipart/form-data with (name, filename, type, value)."""
    out = b""
    for name, filename, ctype, value in fields:
        out += f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"'.encode()
        out += f'; filename="{filename}"'.encode() if filename else b""
        out += f"\r\nContent-Type: {ctype}".encode() if ctype else b""
        out += b"\r\n\r\n" + value + b"\r\n"
    return f"multipart/form-data; boundary={BOUNDARY}", out + f"--{BOUNDARY}--\r\n".encode()


class Recorder:
    """Collects the Markdown: calls with their exchanges, notes, field types."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.ports: dict[str, str] = {}
        self.server: PeerServer | None = None
        self.servers: list[PeerServer] = []
        self.listed: dict[tuple[str, ...], str] = {}

    def serve(self, server: PeerServer) -> None:
        """Calls go to ``server`` from now on (and its ports are shown as the defaults)."""
        self.server = server
        self.servers.append(server)
        self.ports = {
            urlsplit(url).netloc: f"127.0.0.1:{SHOWN_PORTS[kind]}"
            for kind, url in server.urls.items()
            if kind in SHOWN_PORTS
        }

    def text(self, *lines: str) -> None:
        self.lines += [self._ports(line) for line in lines]

    def _ports(self, text: str) -> str:
        for real, shown in self.ports.items():
            text = text.replace(real, shown)
        return text

    @property
    def urls(self) -> dict[str, str]:
        assert self.server is not None
        return self.server.urls

    def call(
        self,
        title: str,
        api: str,
        method: str,
        path: str,
        note: str = "",
        limit: int = BODY_SHOWN,
        fields: bool | None = None,
        **kw: Any,
    ) -> Exchange:
        """Make a call and show it; a JSON answer's field types are listed where ``fields``
        (by default on every API but inference, whose answers are the handlers')."""
        done = exchange(self.urls[api], method, path, **kw)
        self.show(title, done, note, limit, api != "inference" if fields is None else fields)
        return done

    def script(
        self, text: str, api: str, bodies: dict[str, tuple[str, bytes]]
    ) -> dict[str, Exchange]:
        """Make and show the calls ``text`` lists; return those it names ``=key``.

        A call is ``title :: METHOD path [@api] [=key]``, then indented lines:
        ``H name: value``, ``B body`` (Python escapes, or a name of ``bodies``:
        its bytes; as a header value, its content type), ``N note``, ``E``
        (send ``Expect: 100-continue`` and wait for the interim answer), ``T seconds``
        (how long to wait for the answer), ``F`` (list the answer's field types).
        """
        seen: dict[str, Exchange] = {}
        for block in re.split(r"\n(?=\S)", text.strip()):
            first, *rest = block.splitlines()
            title, _, target = first.partition(" :: ")
            method, path, *tags = target.split()
            where = next((t[1:] for t in tags if t.startswith("@")), api)
            headers: dict[str, str] = {}
            body, note, expect, timeout, fields = b"", "", False, 120.0, None
            for line in (r.strip() for r in rest):
                kind, _, value = line.partition(" ")
                if kind == "H":
                    name, _, value = value.partition(": ")
                    headers[name] = bodies[value][0] if value in bodies else value
                elif kind == "B":
                    body = bodies[value][1] if value in bodies else _unescape(value)
                elif kind == "N":
                    note = value
                elif kind == "E":
                    expect = True
                elif kind == "T":
                    timeout = float(value)
                elif kind == "F":
                    fields = True
            done = self.call(
                title,
                where,
                method,
                path,
                note,
                body=body,
                headers=headers,
                expect_continue=expect,
                timeout=timeout,
                fields=fields,
            )
            for tag in tags:
                if tag.startswith("="):
                    seen[tag[1:]] = done
        return seen

    def show(
        self,
        title: str,
        done: Exchange,
        note: str = "",
        limit: int = BODY_SHOWN,
        fields: bool = True,
    ) -> None:
        self.text(f"### {title}", "")
        if note:
            self.text(note, "")
        head, _, sent = done.request.partition(b"\r\n\r\n")
        self.text("```http", *head.decode("latin-1").splitlines(), "")
        self.text(*_shown(sent).splitlines(), "```", "")
        answer = [*done.interim, done.status, *(f"{k}: {v}" for k, v in done.headers)]
        self.text(f"Answer ({done.seconds * 1000:.0f} ms):", "", "```http", *answer, "")
        if done.chunks:
            self.text(*_shown(done.body, limit).splitlines(), "```", "", "Chunks as received:", "")
            for at, chunk in done.chunks:
                self.text(f"- +{at * 1000:.0f} ms, {len(chunk)} bytes: `{chunk!r}`")
            self.text("")
        else:
            self.text(*_shown(done.body, limit).splitlines(), "```", "")
        if fields and done.body[:1] in (b"{", b"[") and done.code < 300:
            with contextlib.suppress(ValueError):
                listed = tuple(f"- `{p}`: {t}" for p, t in _types(done.json()))
                if listed in self.listed:
                    self.text(f'Fields: as under "{self.listed[listed]}".', "")
                else:
                    self.listed[listed] = title
                    self.text("Fields (arrays by their first element):", "", *listed, "")


def _unescape(text: str) -> bytes:
    """A script's body: Python's backslash escapes, each other character as Latin-1."""
    return text.encode("latin-1", "backslashreplace").decode("unicode_escape").encode("latin-1")


def _shown(data: bytes, limit: int = BODY_SHOWN) -> str:
    """Bytes as text where they are UTF-8 (cut after BODY_SHOWN), else as a Python literal."""
    cut = data[:limit]
    try:
        text = cut.decode()
    except UnicodeDecodeError:
        text = repr(cut)
    text = text.replace("\r\n", "\n")
    return text + (f"\n... ({len(data)} bytes in all)" if len(data) > limit else "")


def _types(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(path, JSON type) of every field, lists walked through their first element."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _types(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        yield (path or "(top)", "array" + ("" if value else " (empty here)"))
        if value:
            yield from _types(value[0], f"{path}[]")
    else:
        kind = {bool: "boolean", int: "integer", float: "number", str: "string"}
        yield (path or "(top)", kind.get(type(value), "null"))


def concurrently(calls: list[Callable[[], Exchange]]) -> list[Exchange]:
    results: list[Exchange | None] = [None] * len(calls)

    def run(i: int) -> None:
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [r for r in results if r is not None]
