"""Remote LLM workers: the registered pool, and what each worker says about itself."""
