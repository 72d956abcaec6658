"""Sluice gateway: the front door (OpenAI, KServe v2 HTTP and gRPC, metrics, CLI)."""

__version__ = "0.1.0"
