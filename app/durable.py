"""Making a file operation survive a crash of the machine, not only of the process."""

from __future__ import annotations

import os
from pathlib import Path


def sync_directory(directory: Path) -> None:
    """Make a rename (or a new name) in ``directory`` durable: ``fsync`` the directory."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
