"""The test session's memory guard (tests/support/memory_guard.py): a test that outgrows the
limit stops the session with its name and every thread's stack instead of an OOM kill."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, body: str, limit_bytes: int) -> subprocess.CompletedProcess:
    (tmp_path / "test_grow.py").write_text(body)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KNEECAP_TEST_RSS_LIMIT_BYTES": str(limit_bytes)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-c", os.devnull, "-p", "no:cacheprovider",
                           "-p", "tests.support.memory_guard", "-p", "no:timeout", str(tmp_path / "test_grow.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                          # started in the background as CI scripts do (`cmd &`): SIGINT ignored
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))


def test_a_test_past_the_limit_stops_the_session_naming_it_with_its_stack(tmp_path):
    run = _run(tmp_path, "import time\n\n\ndef test_balloon():\n    held = []\n    while True:\n"
                         "        held.append(bytearray(8 * 1024 * 1024))\n        time.sleep(0.02)\n\n\n"
                         "def test_after():\n    pass\n", limit_bytes=1024**3)
    assert run.returncode == 2, run.stdout + run.stderr  # interrupted, not killed (-9) and not passed
    assert "memory guard: the test process holds" in run.stderr
    assert "test_grow.py::test_balloon" in run.stderr
    # where it grew (allocating or between allocations)
    assert re.search(re.escape(f'File "{tmp_path / "test_grow.py"}", line ') + "[78] in test_balloon", run.stderr)
    assert "KeyboardInterrupt" in run.stdout and "test_after" not in run.stdout + run.stderr.split("stack:")[0]


def test_a_test_within_the_limit_runs_as_usual(tmp_path):
    run = _run(tmp_path, "def test_small():\n    assert len(bytearray(16 * 1024 * 1024)) > 0\n", limit_bytes=2 * 1024**3)
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout + run.stderr
    assert "memory guard" not in run.stderr
