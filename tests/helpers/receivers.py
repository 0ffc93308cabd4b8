"""Real notification receivers on loopback, for Apprise to send to: an HTTP endpoint taking ``json://`` posts
and an SMTP server (aiosmtpd) taking ``mailto://`` mail. Each keeps what it received, in order.

The fixtures (:func:`json_receiver`, :func:`smtp_receiver`) are imported by the test modules that use them.
"""

from __future__ import annotations

import email
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Received:
    """One notification as the receiver got it: its title, body, and what else came with it."""

    title: str
    body: str
    kind: str = ""  # Apprise's notify type (json://): success | warning | failure | info
    path: str = ""
    headers: dict[str, str] = field(default_factory=dict)


class JsonReceiver:
    """``json://127.0.0.1:PORT/<path>`` posts; ``status`` is what it answers (500: a failing service)."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.status = 200
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name
                payload = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                receiver.received.append(
                    Received(payload["title"], payload["message"], payload["type"], self.path, dict(self.headers))
                )
                self.send_response(receiver.status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "hooks/seqcls", auth: str = "") -> str:
        return f"json://{auth + '@' if auth else ''}127.0.0.1:{self.port}/{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class SmtpReceiver:
    """An SMTP server (no TLS, no auth) on loopback; :meth:`url` is Apprise's ``mailto://`` for it."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        self.received: list[Received] = []
        receiver = self

        class Handler:
            async def handle_DATA(self, server, session, envelope) -> str:  # aiosmtpd's name
                msg = email.message_from_bytes(envelope.content, policy=policy.default)
                body = msg.get_body(preferencelist=("plain", "html")).get_content()
                receiver.received.append(Received(str(msg["Subject"]), body.replace("\r\n", "\n").strip()))
                return "250 OK"

        with socket.socket() as s:  # aiosmtpd checks it is up by connecting to the port it was given
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)
        self.controller.start()

    def url(self, to: str = "ops@example.com") -> str:
        return f"mailto://127.0.0.1:{self.port}?mode=insecure&from=seqcls@example.com&to={to}"

    def close(self) -> None:
        self.controller.stop()


def wait_for(receiver: JsonReceiver | SmtpReceiver, count: int, timeout: float = 10.0) -> list[Received]:
    """What ``receiver`` got once it has ``count`` messages (or after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while len(receiver.received) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return list(receiver.received)


@pytest.fixture
def json_receiver() -> Iterator[JsonReceiver]:
    receiver = JsonReceiver()
    yield receiver
    receiver.close()


@pytest.fixture
def smtp_receiver() -> Iterator[SmtpReceiver]:
    receiver = SmtpReceiver()
    yield receiver
    receiver.close()
