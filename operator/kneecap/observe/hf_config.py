"""Read a Hugging Face ``config.json`` (a file, or a ConfigMap's key) into a
:class:`~kneecap.model.arch.ModelArch`."""

from __future__ import annotations

import base64
import binascii
import json
from pathlib import Path
from typing import Mapping

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


def arch_from_config_map(config_map: Mapping, key: str, field: str, name: str | None = None) -> ModelArch:
    """The shape from ``data[key]`` (or ``binaryData[key]``) of a ConfigMap as the API returns it.
    Errors name ``field`` (e.g. ``spec.model.configMapRef``) and what is wrong with the content."""
    cm_name = (config_map.get("metadata") or {}).get("name", "?")
    data = config_map.get("data") or {}
    binary = config_map.get("binaryData") or {}
    if key in data:
        text = data[key]
    elif key in binary:
        try:
            text = base64.b64decode(binary[key], validate=True).decode()
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise InputError(f"{field}.key", f"ConfigMap {cm_name!r} binaryData[{key!r}] is not UTF-8 text: {exc}") from None
    else:
        keys = sorted({*data, *binary})
        raise InputError(f"{field}.key", f"ConfigMap {cm_name!r} has no key {key!r} (its keys: {', '.join(keys) or 'none'})")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{field}.key", f"ConfigMap {cm_name!r} key {key!r} is not valid JSON: {exc}") from None
    try:
        return arch_from_hf_config(config, key=name)
    except InputError as exc:
        raise InputError(field, f"ConfigMap {cm_name!r} key {key!r}: {exc}") from None
