"""Fault bounds measured rather than asserted: how fast a stream ends when its worker dies."""
