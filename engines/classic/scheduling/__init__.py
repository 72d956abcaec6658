"""Scheduling a classic model version: the dynamic batcher (pure policy and its async driver), its timer, ensembles."""
