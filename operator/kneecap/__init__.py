"""kneecap: keeps vLLM deployments at the knee of their throughput curve."""

__version__ = "0.1.0"
