"""Routing state shared between gateway replicas (Redis)."""
