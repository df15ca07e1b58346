"""Reading the world: vLLM /metrics scraping, parsing and windowed observations."""
