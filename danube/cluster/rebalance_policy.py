"""The rules of automatic rebalancing (``load_manager.rebalancing``), as pure functions of the
cluster's numbers and the clock, so each rule is testable on its own.

Upstream's rules: at most one move per check; only when at least
``min_brokers_for_rebalance`` brokers are active and the coefficient of variation of their
load is at least the aggressiveness' threshold (conservative 0.40, balanced 0.30,
aggressive 0.20); at most ``max_moves_per_hour`` moves in any hour; ``cooldown_seconds``
between two moves; never a topic named by ``blacklist_topics`` (exact names, or
``/namespace/*``) or one that has been on its broker for less than
``min_topic_age_seconds`` (new, or moved recently).
"""

from __future__ import annotations

import collections

HOUR = 3600.0


def is_blacklisted(topic: str, patterns) -> bool:
    """Upstream's matching: an exact name, or ``/ns/*`` for every topic of namespace ns
    (not ``/ns`` itself, nor ``/nsx/...``)."""
    for pattern in patterns:
        if pattern == topic:
            return True
        if pattern.endswith("/*"):
            prefix = pattern[:-1]
            if topic.startswith(prefix) and len(topic) > len(prefix):
                return True
    return False


def old_enough(placed_at: float | None, now: float, min_age: float) -> bool:
    """A topic whose placement on its broker this leader has not seen counts from the
    moment it took the lead (``placed_at`` set then), never as old."""
    return placed_at is not None and now - placed_at >= min_age


class MoveBudget:
    """The moves made, for ``max_moves_per_hour`` (a sliding hour) and ``cooldown_seconds``
    (the time since the last move)."""

    def __init__(self, per_hour: int, cooldown: float):
        self.per_hour = per_hour
        self.cooldown = cooldown
        self.moves: collections.deque[float] = collections.deque()

    def record(self, now: float) -> None:
        self.moves.append(now)

    def in_last_hour(self, now: float) -> int:
        while self.moves and self.moves[0] <= now - HOUR:
            self.moves.popleft()
        return len(self.moves)

    def blocked(self, now: float) -> str | None:
        """Why no move may be made at ``now``, or None."""
        if self.in_last_hour(now) >= self.per_hour:
            return f"{self.per_hour} moves in the last hour (max_moves_per_hour)"
        if self.moves and now - self.moves[-1] < self.cooldown:
            return f"cooling down {self.cooldown - (now - self.moves[-1]):.1f}s more " \
                   "(cooldown_seconds)"
        return None


def skip_reason(cfg, active_brokers: int, cv: float) -> str | None:
    """Why this check moves nothing, before looking at topics; None to go on."""
    if active_brokers < max(2, cfg.min_brokers_for_rebalance):
        return f"{active_brokers} active brokers (min_brokers_for_rebalance " \
               f"{cfg.min_brokers_for_rebalance})"
    if cv < cfg.cv_threshold:
        return f"balanced: CV {cv:.3f} below {cfg.cv_threshold:.2f} ({cfg.aggressiveness})"
    return None
