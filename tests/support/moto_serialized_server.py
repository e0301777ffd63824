"""moto's S3 server with one request handled at a time: ``python moto_serialized_server.py HOST PORT``.

moto checks a PUT's ``If-None-Match: *`` and stores the object in two steps without a lock, while its
server handles requests in threads, so two racing conditional PUTs of one key could both succeed. S3
makes a conditional PUT atomic; serializing the requests makes moto's atomic too, which the put-if-absent
commit tests rely on. Connections are still accepted in threads, so keep-alive clients never starve others.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple


class _Serialized:
    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        with self._lock:
            # Drain the response inside the lock: the write must be complete before the next request.
            return list(self._app(environ, start_response))


def main(host: str, port: int) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    app = _Serialized(DomainDispatcherApplication(create_backend_app))
    run_simple(host, port, app, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
