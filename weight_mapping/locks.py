"""One writer per directory: the lock every command that writes a directory takes (harvest, features, convert,
save_pretrained), before it does any work, so a second one there refuses at once, naming the first.

An flock on `.scratch-models.lock` inside the directory, holding who took it (what, pid, host, start): the kernel
lets go of an flock when its process ends however it ends (kill -9 included), so the lock of a process that is gone
is taken over, and there is nothing stale to clean up by hand. flock holds between the processes of one machine; on
NFS, Linux emulates it with a byte-range lock that the server arbitrates between machines; a file system without
lock support does not stop a writer on another machine.

Within one thread the lock is reentrant: `convert` holds its destination's while its save_pretrained takes it again.
"""

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
from pathlib import Path

LOCK_FILE = ".scratch-models.lock"
_HELD: dict[tuple[Path, int], list] = {}  # (directory, thread) -> [its lock, how many times taken]


class DirectoryBusy(ValueError):
    """Another process (or thread) is writing the directory: the message names it and what to do."""


class DirectoryLock:
    """`with DirectoryLock(directory, "harvest"):` the only writer of `directory` (created, with its missing parents,
    if need be; removed again on release if the lock made it and nothing else was written there). Raises
    DirectoryBusy at once if another holds it."""

    def __init__(self, directory, what: str):
        self.directory = Path(directory).expanduser().resolve()
        self.path = self.directory / LOCK_FILE
        self.what = what
        self.fd = None
        self.created: list[Path] = []

    def acquire(self) -> "DirectoryLock":
        key = (self.directory, threading.get_ident())
        if key in _HELD:
            _HELD[key][1] += 1
            return self
        if self.directory.exists() and not self.directory.is_dir():
            raise NotADirectoryError(f"{self.directory}: exists and is not a directory")
        self.created = [d for d in [self.directory, *self.directory.parents] if not d.exists()][::-1]
        self.directory.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 4096).decode(errors="replace")
                os.close(fd)
                self._remove_created()
                raise DirectoryBusy(f"{self.directory}: {_holder(holder)}: wait for it to end, or stop it; the same "
                                    "command then resumes or starts") from None
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:  # its holder removed it between our open and our lock
                same = False
            if same:
                break
            os.close(fd)
        who = {"what": self.what, "pid": os.getpid(), "host": socket.gethostname(),
               "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(who).encode(), 0)
        self.fd = fd
        _HELD[key] = [self, 1]
        return self

    def release(self) -> None:
        key = (self.directory, threading.get_ident())
        held = _HELD.get(key)
        if held is None:
            return
        held[1] -= 1
        if held[1] > 0:
            return
        del _HELD[key]
        lock = held[0]
        lock.path.unlink(missing_ok=True)  # before the unlock: a process waiting on this file sees it gone
        os.close(lock.fd)
        lock.fd = None
        lock._remove_created()

    def _remove_created(self) -> None:
        for directory in reversed(self.created):
            with contextlib.suppress(OSError):  # one that something was written into stays
                directory.rmdir()

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def _holder(text: str) -> str:
    try:
        who = json.loads(text)
        return (f"another {who.get('what', 'scratch-models command')} is running there (pid {who['pid']} on "
                f"{who['host']}, started {who['started']})")
    except (ValueError, KeyError, TypeError):
        return "another scratch-models command is running there (it has not yet said who it is)"
