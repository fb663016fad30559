"""The broker's side of the transport boundary: a consumer hands its messages to a
DeliverySink, and knows nothing else of how they reach the client. The services implement it
over a ReceiveMessages server stream (danube.services.delivery); tests use a list."""

from typing import Callable, Protocol


class DeliverySink(Protocol):
    """Where one consumer's messages go while its delivery stream is open. Every method is
    called on the event loop; none of them blocks."""

    finished: bool
    """The stream is over (ended by either side): nothing more can be sent."""

    blocked: bool
    """Sending now would only queue: a flow-control window or the socket is full."""

    def start_response(self) -> None:
        """Open the stream towards the client now, before any message (the client sees its
        ReceiveMessages call answered)."""

    def send_framed(self, data: bytes) -> bool:
        """Send length-prefixed gRPC messages (a consumer's outbox); False when some of it
        had to queue, and the sink is blocked."""

    def when_writable(self, callback: Callable[[bool], None]) -> None:
        """Call ``callback(True)`` once the queued data is out and sending would no longer
        only queue, or ``callback(False)`` if the connection went away first. At most one
        is pending at a time."""

    def cancel_writable(self) -> None:
        """Forget the pending when_writable callback, if any."""

    def end(self, reason) -> None:
        """End the stream: ``reason`` (a BrokerError) becomes its status, None is a clean
        end."""
