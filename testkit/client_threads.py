"""Load for the failover tests: client threads that send until told to stop."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import Self


class ClientThreads(ABC):
    """``clients`` threads running ``self._run`` (which returns when ``self.stopping`` is
    set); ``with`` starts them and, on the way out, stops and joins them."""

    def __init__(self, clients: int) -> None:
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run) for _ in range(clients)]

    @abstractmethod
    def _run(self) -> None: ...

    def __enter__(self) -> Self:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join()
