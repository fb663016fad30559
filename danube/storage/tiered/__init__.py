"""Tiered storage: the durable catalogue, the background uploader and history reads."""
