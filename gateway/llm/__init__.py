"""The LLM layer: one protocol-neutral call from admission and routing to the last delta."""
