"""An HTTP server answering a minimal vLLM /metrics page on a given address, recording who asked
for what: which pod IPs the operator scraped."""

from __future__ import annotations

import http.server
import threading


class CountingServer:
    """Listens on ``host:port`` (a pod's kwok IP and engine port; port 0: any free one) and
    records each request's path."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        hits = self.hits = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                hits.append(self.path)
                body = b"vllm:num_requests_running 1\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.host = host
        self.server = http.server.ThreadingHTTPServer((host, port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, host: str | None = None) -> str:
        return f"http://{host or self.host}:{self.port}/metrics"

    def close(self):
        self.server.shutdown()
        self.server.server_close()
