"""The redactor: every secret a run knows (a sudo password, a token) becomes ``<redacted>`` in
whatever it prints or writes. A leaf: the transport, the executor, the report and the run
folder all take one, so it imports nothing of gpuk8s."""

from __future__ import annotations

import re
import threading

_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^\s/:@'\"]+:)[^\s/@'\"]+@")


class Redactor:
    """Replaces every registered secret value with ``<redacted>`` in any text."""

    def __init__(self) -> None:
        self._secrets: set[str] = set()
        self._lock = threading.Lock()

    def add(self, *values: str | None) -> None:
        with self._lock:
            for value in values:
                if value and len(value) >= 4:
                    self._secrets.add(value)

    def __call__(self, text: str) -> str:
        for secret in sorted(self._secrets, key=len, reverse=True):
            if secret in text:
                text = text.replace(secret, "<redacted>")
        # a password in a URL (http://user:pass@proxy), wherever it came from
        return _URL_PASSWORD.sub(r"\1<redacted>@", text)
