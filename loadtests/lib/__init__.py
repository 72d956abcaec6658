"""What several benchmarks share: processes on loopback, the lean streaming client, percentiles, py-spy summaries."""
