"""Scripts that run inside build containers (stdlib only: the container's Python has nothing else)."""

from pathlib import Path

CONTAINER_DIR = Path(__file__).resolve().parent
