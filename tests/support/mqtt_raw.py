"""Hand-built MQTT packets over a plain socket, for the tests a well-behaved client library
cannot send (oversized, malformed, too many in flight) and for reading exactly what the
server answers."""

import socket
import struct
import time


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def string(s):
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack(">H", len(raw)) + raw


def packet(first, body):
    return bytes([first]) + varint(len(body)) + body


def connect(client_id="raw", level=4, keep_alive=60, clean=True, username=None,
            password=None, name="MQTT"):
    flags = (0x02 if clean else 0) | (0x80 if username is not None else 0) | \
        (0x40 if password is not None else 0)
    body = string(name) + bytes([level, flags]) + struct.pack(">H", keep_alive)
    if level == 5:
        body += b"\x00"
    body += string(client_id)
    if username is not None:
        body += string(username)
    if password is not None:
        body += string(password)
    return packet(0x10, body)


def publish(topic, payload, qos=0, packet_id=1, level=4, props=b""):
    body = string(topic)
    if qos:
        body += struct.pack(">H", packet_id)
    if level == 5:
        body += varint(len(props)) + props
    return packet(0x30 | (qos << 1), body + payload)


class RawClient:
    def __init__(self, port, timeout=10):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def send(self, data):
        self.sock.sendall(data)

    def read_packet(self):
        """(type, flags, body), or None when the server closed the connection."""
        while True:
            if len(self.buf) >= 2:
                length = shift = 0
                i = 1
                while i < len(self.buf):
                    b = self.buf[i]
                    length |= (b & 0x7F) << shift
                    shift += 7
                    i += 1
                    if not b & 0x80:
                        if len(self.buf) >= i + length:
                            first = self.buf[0]
                            body = self.buf[i:i + length]
                            self.buf = self.buf[i + length:]
                            return first >> 4, first & 0x0F, body
                        break
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                return None
            self.buf += data

    def closed_within(self, seconds):
        """Read (and drop) packets until the server closes; whether it did in time."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                if self.read_packet() is None:
                    return True
            except socket.timeout:
                return False
        return False

    def close(self):
        self.sock.close()
