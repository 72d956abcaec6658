"""The HTTP server: the ASGI app and its start-up, uvicorn's protocol, middleware, error handlers, the metrics port."""
