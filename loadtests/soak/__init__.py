"""Long runs of concurrent streams, some clients leaving mid-stream: nothing lost, hung or leaked."""
