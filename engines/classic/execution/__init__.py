"""Executing batches: instance threads, inline runs on the event loop, and the backends that run model code."""
