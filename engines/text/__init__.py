"""Text in and out of an LLM: the model's tokenizer and chat template, incremental detokenization, stop strings."""
