"""HTTP server of the live agent: /metrics, /healthz, /readyz, the JSON API, a status page."""

from rankwatch.server.app import Server, make_app, parse_listen, start_server

__all__ = ["Server", "make_app", "parse_listen", "start_server"]
