"""This broker's id: random, non-zero, kept in ``{data_dir}/broker_id`` so that a restarted
broker is the same broker (its topics' assignments and registration are under the id)."""

import os
import secrets

from danube.dirsync import fsync_dir


class BrokerIdentity:
    def __init__(self, data_dir):
        self.data_dir = data_dir
        self.value = None           # the id once loaded (BrokerCore.start)

    def load(self):
        """Read the id, or create and store one (the first start in this data_dir)."""
        path = os.path.join(self.data_dir, "broker_id")
        try:
            with open(path, encoding="ascii") as f:
                self.value = int(f.read().strip())
        except (FileNotFoundError, ValueError):
            value = secrets.randbits(63) or 1
            tmp = path + ".tmp"
            with open(tmp, "w", encoding="ascii") as f:
                f.write(str(value))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fsync_dir(self.data_dir)     # the rename, or a power cut undoes it
            self.value = value
        return self.value
