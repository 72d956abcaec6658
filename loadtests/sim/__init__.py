"""The sim engine's cost model fitted against a real vLLM CPU worker, and checked on the same workload."""
