"""OpenAI's Responses API over the same LLM layer as chat: schemas, the conversion onto a chat
request, the output items and events, and the gateway's own store of responses."""
