"""A directory's lock held by another thread, as a second command would hold it (the lock is reentrant within a
thread, so the test's own thread cannot stand in for another writer)."""

import contextlib
import threading

from weight_mapping import DirectoryLock


@contextlib.contextmanager
def held_elsewhere(directory, what: str):
    taken, done = threading.Event(), threading.Event()
    errors = []

    def hold():
        try:
            with DirectoryLock(directory, what):
                taken.set()
                done.wait(60)
        except BaseException as e:  # noqa: BLE001 - reported in the test's thread
            errors.append(e)
            taken.set()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    taken.wait(60)
    if errors:
        raise errors[0]
    try:
        yield
    finally:
        done.set()
        thread.join(60)
