"""What the router learns from workers: load, health, scraped metrics, and the drivers that poll them."""
