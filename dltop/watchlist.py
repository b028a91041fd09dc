"""Edits of what is watched, as plain functions of the Settings: each returns the new Settings (None where nothing
changes) and what to say about it. The Session applies them; tests read them without a screen."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Literal

from dltop.config import Settings, server_url

Severity = Literal["information", "warning", "error"]
Edit = tuple[Settings | None, str, Severity]


def add_dataset(settings: Settings, typed: str) -> Edit:
    """Watch one more dataset folder (`~` expanded, made absolute)."""
    path = os.path.abspath(os.path.expanduser(typed))
    if not os.path.exists(path):
        return None, f"no such file or directory: {path}", "error"
    if path in settings.datasets:
        return None, f"{path} is watched already", "warning"
    return replace(settings, datasets=(*settings.datasets, path)), f"watching {path}: scanning…", "information"


def remove_dataset(settings: Settings, path: str) -> Edit:
    """Stop watching a dataset folder (a path not watched is not an error: nothing to say)."""
    if path not in settings.datasets:
        return None, "", "information"
    datasets = tuple(p for p in settings.datasets if p != path)
    return replace(settings, datasets=datasets), f"no longer watching {path}", "information"


def add_server(settings: Settings, text: str) -> Edit:
    """Scrape one more inference server (host:port or a URL, as typed)."""
    try:
        url = server_url(text)
    except ValueError as e:
        return None, f"not added: {e} (give host:port or http://host:port/metrics)", "error"
    if url in settings.servers:
        return None, f"{url} is scraped already", "warning"
    return replace(settings, servers=(*settings.servers, url)), f"scraping {url}", "information"


def remove_server(settings: Settings, text: str) -> Edit:
    """Stop scraping an inference server (as typed, or its /metrics URL)."""
    try:
        url = server_url(text)
    except ValueError as e:
        return None, f"not removed: {e}", "error"
    if url not in settings.servers:
        return None, f"{url} is not scraped (scraped: {', '.join(settings.servers) or 'none'})", "warning"
    servers = tuple(u for u in settings.servers if u != url)
    return replace(settings, servers=servers), f"no longer scraping {url}", "information"
