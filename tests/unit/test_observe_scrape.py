"""scrape() refuses a non-positive timeout or size cap before it connects anywhere. Against real
local HTTP servers: tests/integration/test_observe_scrape_http.py."""

from __future__ import annotations

import pytest

from kneecap.observe import scrape


async def test_bad_arguments():
    with pytest.raises(ValueError, match="timeout_s"):
        await scrape("http://127.0.0.1:1/metrics", timeout_s=0, max_bytes=1)
    with pytest.raises(ValueError, match="max_bytes"):
        await scrape("http://127.0.0.1:1/metrics", timeout_s=1, max_bytes=0)
