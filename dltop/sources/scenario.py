"""Scenario files, the machines that the fake NVML and fake amdsmi backends play: read, or why not."""

from __future__ import annotations

import json
from typing import Any


class ScenarioError(ValueError):
    """A fake-NVML or fake-amdsmi scenario file that cannot be used."""


def read_scenario(path: str) -> Any:
    """A scenario file's JSON, or ScenarioError naming why not (unreadable, not JSON)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise ScenarioError(f"cannot read {path}: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ScenarioError(f"{path} is not JSON: {e}") from None
