"""Stopping background tasks: every long-running loop of the broker (cluster membership,
election, load reports, the rebalancer, tiered uploads) ends the same way."""

import asyncio


async def cancel_and_wait(*tasks):
    """Cancel ``tasks`` (None entries are skipped) and wait until each has finished; their
    cancellation is not an error, any other exception they end with is raised."""
    tasks = [t for t in tasks if t is not None]
    for task in tasks:
        task.cancel()
    for task in tasks:
        try:
            await task
        except asyncio.CancelledError:
            pass
