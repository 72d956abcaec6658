"""Anthropic's Messages API over the same LLM layer as OpenAI chat (`gateway.openai`)."""
