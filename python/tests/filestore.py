"""A file-backed store with torch Store's methods, shared by processes."""

import datetime
import fcntl
import os
import time
from pathlib import Path


class FileStore:
    """A key-value store over a directory, with torch Store's methods (set, get, wait, check,
    add, delete_key): a Python store shared by processes, for testing `new_comm(store=...)`."""

    def __init__(self, path):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def _file(self, key):
        return self.path / key.encode().hex()

    def set(self, key, value):
        if isinstance(value, str):
            value = value.encode()
        f = self._file(key)
        tmp = f.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(bytes(value))
        os.replace(tmp, f)

    def get(self, key):
        self.wait([key], datetime.timedelta(seconds=60))
        return self._file(key).read_bytes()

    def wait(self, keys, timeout=datetime.timedelta(seconds=60)):
        deadline = time.monotonic() + timeout.total_seconds()
        for k in keys:
            while not self._file(k).exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"Timeout waiting for key {k}")
                time.sleep(0.002)

    def check(self, keys):
        return all(self._file(k).exists() for k in keys)

    def add(self, key, delta):
        with open(self.path / "lock", "a") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            f = self._file(key)
            cur = int(f.read_bytes()) if f.exists() else 0
            cur += int(delta)
            self.set(key, str(cur))
            return cur

    def delete_key(self, key):
        try:
            self._file(key).unlink()
            return True
        except FileNotFoundError:
            return False
