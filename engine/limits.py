"""What one HTTP request may ask of the server (the CLI sets them at start)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerLimits:
    max_prompt_tokens: int = 32768
    max_body_bytes: int = 4 * 1024 * 1024
    max_completion_tokens: int = 8192
