"""Serving the modelled engine as a vLLM-shaped worker: HTTP, metrics, KV-event publishing, launch."""
