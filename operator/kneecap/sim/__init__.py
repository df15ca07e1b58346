"""A vLLM-compatible engine twin that shows GPU-scale behaviour on a CPU."""
