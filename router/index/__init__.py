"""The prefix index: block hashing, which worker holds which block, and the KV events that keep it exact."""
