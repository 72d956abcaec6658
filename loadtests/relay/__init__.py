"""What the gateway adds on the LLM path: relaying streams, and tokenizing chats."""
