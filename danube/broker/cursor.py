"""Persisting a reliable subscription's progress: the cursor and the offsets acknowledged
out of order above it (so that a restart redelivers only what was not acknowledged). A
mixin of danube.broker.reliable.ReliableDispatcher, which owns the state; writes are
debounced (about once a second while acks flow), forced by flush_cursor (a consumer left,
close, a durable AckRanges), and one at a time."""

import logging

from danube.broker import _window

log = logging.getLogger("danube.broker.reliable")


class CursorPersistence:
    async def flush_cursor(self):
        """Persist the cursor and (with on_acked) the acks above it; returns once what was
        acknowledged when it was called is stored. One write at a time: a write landing
        after a later one would put an older cursor back."""
        async with self._flush_lock:
            if self._on_acked is not None:
                acked = sorted(self.acked)
                if acked != self._saved_acked:
                    await self._on_acked(_window.to_ranges(acked))
                    self._saved_acked = acked
            if self._saved_cursor != self.cursor:
                cursor = self.cursor
                await self._on_cursor(cursor)
                self._saved_cursor = max(self._saved_cursor, cursor)

    def flush_cursor_soon(self):
        """Persist the cursor in the background (a consumer left: what it acked must
        survive a restart); close() waits for it."""
        if not self._closing:
            self._flushes.spawn(self._flush_in_background())

    async def _flush_in_background(self):
        try:
            await self.flush_cursor()
        except Exception:  # noqa: BLE001 - the next flush (or close) writes it again
            log.exception("%s/%s: saving the cursor failed", self.topic.name, self.sub.name)

    def _schedule_save(self):
        # Debounced: the cursor is written at most about once a second while acks flow,
        # and on close / consumer disconnect (flush_cursor).
        if self._save_timer is None and not self._closing:
            self._save_timer = self.loop.call_later(1.0, self._save_due)

    def _save_due(self):
        self._save_timer = None
        self.flush_cursor_soon()
