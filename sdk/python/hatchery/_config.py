"""Where the daemon is and which key to use: arguments first, then
HATCHERY_URL / HATCHERY_API_KEY, then the local daemon's defaults."""

from __future__ import annotations

import os
from typing import Optional
from urllib.parse import urlsplit

DEFAULT_URL = "http://127.0.0.1:7423"
DEFAULT_KEY_FILE = "/var/lib/hatchery/api_key"
_LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}


def resolve_url(url: Optional[str]) -> str:
    return (url or os.environ.get("HATCHERY_URL") or DEFAULT_URL).rstrip("/")


def resolve_key(api_key: Optional[str], url: str, key_file: Optional[str] = None) -> Optional[str]:
    """The key file is only read for a daemon on this machine: it is the
    one `hatcheryd` writes into its data directory (HATCHERY_KEY_FILE
    overrides its path)."""
    key = api_key or os.environ.get("HATCHERY_API_KEY")
    if key:
        return key
    if (urlsplit(url).hostname or "") not in _LOCAL_HOSTS:
        return None
    path = key_file or os.environ.get("HATCHERY_KEY_FILE") or DEFAULT_KEY_FILE
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None
