"""The HTTP API under /v1 (--api-port; docs/http.md), imported only when it is on."""
