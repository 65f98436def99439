"""Calls for tests/test_isolation.py to run in checker children (imported there, through PYTHONPATH)."""

import os
import time


class Targets:
    def add(self, a: int, b: int) -> int:
        return a + b

    def pid(self) -> int:
        return os.getpid()

    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    def spin(self) -> None:
        while True:
            pass

    def crash(self) -> None:
        os._exit(3)

    def allocate(self, n_bytes: int) -> int:
        return len(bytearray(n_bytes))
