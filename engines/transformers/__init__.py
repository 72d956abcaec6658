"""The in-process LLM engine over transformers' own continuous batching, and its supervisor."""
