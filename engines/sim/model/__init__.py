"""The modelled engine itself: scheduler, KV block cache, requests and outputs. Pure: no I/O, no clock."""
