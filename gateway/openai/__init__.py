"""OpenAI-compatible routes: schemas (pydantic) and handlers."""
