"""The WAL's durability modes and settings (what each mode promises: see the package
docstring)."""

from __future__ import annotations

import dataclasses

ALWAYS = "always"
INTERVAL = "interval"
NONE = "none"
_MODES = (ALWAYS, INTERVAL, NONE)


@dataclasses.dataclass(frozen=True, slots=True)
class WALConfig:
    """WAL settings. Upstream's broker YAML keys are noted where one exists.

    * ``durability``: ``"always"`` | ``"interval"`` | ``"none"`` (see the package docstring;
      ``storage.wal.durability``, per topic ``storage.wal.topic_durability``).
    * ``sync_interval_ms``: interval mode's period
      (``storage.wal.advanced.file_sync.interval_ms``).
    * ``segment_max_bytes``: a segment is sealed once the next batch would not fit
      (``storage.wal.rotation.max_bytes``).
    * ``max_age_seconds``: a non-empty active segment older than this is sealed before the
      next append (``storage.wal.rotation.max_hours`` x 3600); None: no age limit.
    * ``cache_capacity``: messages kept in memory for readers at the head
      (``storage.wal.advanced.cache_capacity``).
    * ``segment_initial_bytes``: the first preallocation of a new segment; it doubles as
      needed up to ``segment_max_bytes``, so a thousand quiet topics do not reserve
      ``segment_max_bytes`` of disk each.
    * ``validate_sealed``: ``"lazy"`` scans a sealed segment the checkpoint vouches for on its
      first read; ``"open"`` scans every segment at open.
    * ``verify_reads``: check the CRC of every frame read from a segment (recovery has
      already checked everything written before the open).
    * ``max_mapped_sealed``: sealed segments kept mapped for readers (least recently read
      ones are unmapped beyond this).
    * ``first_segment_bytes``: the preallocation of a log's first segment (and of its
      active one when it is opened again): a topic reserves no more disk than it has
      written, rounded up to this, until it rotates.
    * ``journal``: the broker's ``Journal`` (danube/storage/journal): in mode ``always``
      appends are made durable by its group commits instead of this WAL's own syncs; the
      WAL then takes no directory lock file (the journal keeps the open directories) and
      syncs nothing at open and close. None: the WAL syncs its own segments.
    """
    durability: str = ALWAYS
    sync_interval_ms: int = 5000
    segment_max_bytes: int = 64 << 20
    max_age_seconds: float | None = None
    cache_capacity: int = 1024
    segment_initial_bytes: int = 1 << 20
    validate_sealed: str = "lazy"
    verify_reads: bool = False
    max_mapped_sealed: int = 8
    first_segment_bytes: int = 4096
    journal: object = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def journal_in_use(self):
        """The journal this WAL's appends go through: ``journal`` in mode always, else
        None (the other modes sync on their own schedule)."""
        return self.journal if self.durability == ALWAYS else None

    def __post_init__(self):
        if self.durability not in _MODES:
            raise ValueError(f"durability must be one of {_MODES}, got {self.durability!r}")
        if self.validate_sealed not in ("lazy", "open"):
            raise ValueError(f"validate_sealed must be 'lazy' or 'open', got "
                             f"{self.validate_sealed!r}")
        if self.segment_max_bytes < 4096:
            raise ValueError("segment_max_bytes must be at least 4096")
        if self.segment_initial_bytes < 1 or self.first_segment_bytes < 1:
            raise ValueError("segment_initial_bytes and first_segment_bytes must be positive")
        if self.sync_interval_ms <= 0:
            raise ValueError("sync_interval_ms must be positive")
        if self.max_age_seconds is not None and self.max_age_seconds <= 0:
            raise ValueError("max_age_seconds must be positive or None")
        if self.cache_capacity < 0 or self.max_mapped_sealed < 0:
            raise ValueError("cache_capacity and max_mapped_sealed must be >= 0")
