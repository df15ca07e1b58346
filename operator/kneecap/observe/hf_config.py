"""Read a Hugging Face ``config.json`` from disk into a :class:`~kneecap.model.arch.ModelArch`."""

from __future__ import annotations

import json
from pathlib import Path

from kneecap.errors import InputError
from kneecap.model.arch import ModelArch, arch_from_hf_config


def load_hf_config(path: str | Path, key: str | None = None) -> ModelArch:
    """Read ``config.json`` (or a directory holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        config = json.loads(p.read_text())
    except FileNotFoundError:
        raise InputError("config", f"no such file: {p}") from None
    except json.JSONDecodeError as exc:
        raise InputError("config", f"{p} is not valid JSON: {exc}") from None
    return arch_from_hf_config(config, key=key or p.parent.name.lower() or None)
