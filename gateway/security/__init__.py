"""Access control and quotas: API and admin keys, per-key limits, and the edges that apply them.

- `keys`: keys loaded from the environment or a file and kept as SHA-256 digests.
- `access`: what each HTTP path and gRPC method needs; loopback and forwarded peers.
- `guard`: the shared decision (`Security.authenticate`) and its construction from settings.
- `limits`, `redis_store`, `node_quotas`, `quotas`: requests per minute, tokens per minute and
  concurrency, in process or shared (through Redis, or by the frontends of one node) with a local fallback.
- `http`, `grpc`: the ASGI middleware and the grpc.aio interceptor.

Nothing here imports the app, the routes or the LLM layer: they import this.
"""
