"""Routing policies compared: in virtual time, on a live sim fleet, on real vLLM workers, and one decision's cost."""
