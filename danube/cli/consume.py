"""`danube consume`: upstream danube-cli's consume command (same flags and output lines),
plus --count, --timeout, --output json and --quiet. Every message is acknowledged.

It consumes through our client's defaults, the fast path against this broker (deliveries in
batches, acks as ranges; docs/consume.md): what it takes from the client is handled a
whole batch at a time, and stdout is written once per batch instead of once per line."""

import argparse
import asyncio
import base64
import json
import signal
import sys
import time

from danube.cli.connect import add_connection_options

# Upstream prints reliable payloads above this size as "[binary data]".
LARGE_MESSAGE_THRESHOLD = 1024

EPILOG = """\
output:
  text (default), as upstream danube-cli:
    Received message: <text>
    Size: N bytes, Total received: M bytes
  or, for reliable messages (topic offset increased):
    Received reliable message: "<text>"
    Topic offset: O, Size: N bytes, Total received: M bytes
    Producer: <producer id>, Topic: <topic>
  followed by "Attributes: k=v, ..." when the message has attributes.
  json: one object per message on stdout (JSON Lines):
    {"topic", "offset", "producer", "producer_id", "request_id", "publish_time",
     "attributes", "payload", "encoding": "utf-8"|"base64", "size"}
  --quiet: no line per message; at the end one summary line (json: one object)
    Received N messages (B bytes) in S s: R msgs/s
    {"received", "bytes", "elapsed_s", "msgs_per_sec"}
  where S runs from the first message to the last (the rate of the drain itself).
  A status line ("Consuming from ...") goes to stderr once subscribed.
  Exit status: 0 on SIGINT/SIGTERM, after --count messages, or when --timeout ends a run
  without --count; 1 on errors or when --timeout expires before --count messages arrived.

examples:
  danube consume -s http://127.0.0.1:6650 -m my_subscription
  danube consume -s http://127.0.0.1:6650 -t /default/orders -m sub --sub-type exclusive
  danube consume -s http://127.0.0.1:6650 -m sub --count 100 --timeout 30 --output json
  danube consume -s http://127.0.0.1:6650 -m sub --count 200000 --quiet
"""

SUB_TYPES = {"exclusive": "exclusive", "shared": "shared", "fail-over": "failover",
             "key-shared": "key_shared"}


def _positive(value):
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def _seconds(value):
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return number


def add_parser(sub):
    p = sub.add_parser(
        "consume", help="receive messages from a topic",
        description="Receive and acknowledge messages (upstream danube-cli consume). Runs "
                    "until interrupted unless --count or --timeout is given.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-s", "--service-addr", required=True,
                   help="broker service URL, e.g. http://127.0.0.1:6650; several brokers of a "
                        "cluster comma-separated (lookups use whichever answers)")
    p.add_argument("-t", "--topic", default="/default/test_topic", help="topic to consume")
    p.add_argument("-n", "--consumer", default="consumer_pubsub", help="consumer name")
    p.add_argument("-m", "--subscription", required=True, help="subscription name")
    p.add_argument("--sub-type", choices=tuple(SUB_TYPES), default="shared",
                   help="subscription type (default shared)")
    p.add_argument("--count", type=_positive, help="ours: exit after N messages")
    p.add_argument("--timeout", type=_seconds, metavar="S", help="ours: stop after S seconds")
    add_connection_options(p)
    p.add_argument("--output", choices=("text", "json"), default="text",
                   help="output format (ours; see below)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="ours: no line per message, only the count and the rate at the end "
                        "(for draining backlogs)")
    p.set_defaults(func=run)


def run(args):
    # Block-buffered: _consume flushes once per batch it takes (and before it waits).
    sys.stdout.reconfigure(errors="backslashreplace", line_buffering=False)
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    return runner(_consume(args))


async def _consume(args):
    from danube.cli.connect import ConnectError, make_client
    from danube.client import DanubeError

    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    printer = (Tally if args.quiet else Printer)(args.output == "json")
    try:
        client = make_client(args)
    except (DanubeError, ConnectError) as exc:
        print(f"danube consume: error: {exc}", file=sys.stderr)
        return 1
    schemas = Schemas(client)
    try:
        async with asyncio.timeout(args.timeout):
            consumer = await client.subscribe(args.topic, args.consumer, args.subscription,
                                              SUB_TYPES[args.sub_type])
            print(f"Consuming from {args.topic} (subscription {args.subscription!r}, "
                  f"{args.sub_type}); press Ctrl+C to stop", file=sys.stderr, flush=True)
            while args.count is None or printer.received < args.count:
                wanted = BATCH if args.count is None else min(BATCH,
                                                              args.count - printer.received)
                for msg in await consumer.receive_many(wanted):
                    printer.show(msg, None if args.quiet else await schemas.of(msg))
                    try:
                        await consumer.ack(msg)
                    except DanubeError as exc:
                        print(f"Failed to acknowledge message: {exc}", file=sys.stderr)
                sys.stdout.flush()          # before waiting for more: lines are never held
    except asyncio.CancelledError:
        task.uncancel()             # SIGINT/SIGTERM: a normal way to stop
    except TimeoutError:
        if args.count is not None:
            print(f"danube consume: timed out after {args.timeout:g} s: received "
                  f"{printer.received} of {args.count} messages", file=sys.stderr)
            return 1
    except DanubeError as exc:
        print(f"danube consume: error: {exc}", file=sys.stderr)
        return 1
    finally:
        printer.done()
        await client.close()
    return 0


# Messages handled per receive_many: what the client holds, up to one delivery window.
BATCH = 1000


class Tally:
    """--quiet: counts messages and bytes; one summary at the end."""

    def __init__(self, as_json):
        self.as_json = as_json
        self.received = 0
        self.total_bytes = 0
        self.first = self.last = None

    def show(self, msg, schema=None):
        self.last = time.monotonic()
        if self.first is None:
            self.first = self.last
        self.received += 1
        self.total_bytes += len(msg.payload)

    def done(self):
        elapsed = self.last - self.first if self.first is not None else 0.0
        rate = self.received / elapsed if elapsed > 0 else 0.0
        if self.as_json:
            print(json.dumps({"received": self.received, "bytes": self.total_bytes,
                              "elapsed_s": round(elapsed, 3), "msgs_per_sec": round(rate, 1)}))
        else:
            print(f"Received {self.received} messages ({self.total_bytes} bytes) in "
                  f"{elapsed:.3f} s: {rate:.0f} msgs/s")
        sys.stdout.flush()


class Printer:
    def __init__(self, as_json):
        self.as_json = as_json
        self.received = 0
        self.total_bytes = 0
        self.last_offset = 0

    def show(self, msg, schema=None):
        self.received += 1
        size = len(msg.payload)
        self.total_bytes += size
        if self.as_json:
            obj = self._json(msg, size)
            if schema is not None:
                obj.update(schema.describe(msg.payload))
            print(json.dumps(obj))
            return
        offset = msg.msg_id.topic_offset
        try:
            text = msg.payload.decode("utf-8")
        except UnicodeDecodeError:
            text = f"[Binary data - {size} bytes]"
        # Upstream's test for a reliable message: its topic offset went up.
        if offset > self.last_offset:
            preview = "[binary data]" if size > LARGE_MESSAGE_THRESHOLD else f'"{text}"'
            print(f"Received reliable message: {preview}\n"
                  f"Topic offset: {offset}, Size: {size} bytes, "
                  f"Total received: {self.total_bytes} bytes\n"
                  f"Producer: {msg.msg_id.producer_id}, Topic: {msg.msg_id.topic_name}")
        else:
            print(f"Received message: {text}\n"
                  f"Size: {size} bytes, Total received: {self.total_bytes} bytes")
        if msg.attributes:
            print("Attributes: " + ", ".join(f"{k}={v}" for k, v in sorted(msg.attributes.items())))
        if schema is not None:
            schema.show(msg.payload)
        self.last_offset = offset

    def done(self):
        sys.stdout.flush()

    @staticmethod
    def _json(msg, size):
        try:
            payload, encoding = msg.payload.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            payload, encoding = base64.b64encode(msg.payload).decode("ascii"), "base64"
        obj = {"topic": msg.msg_id.topic_name, "offset": msg.msg_id.topic_offset,
               "producer": msg.producer_name, "producer_id": msg.msg_id.producer_id,
               "request_id": msg.request_id, "publish_time": msg.publish_time,
               "attributes": dict(msg.attributes), "payload": payload,
               "encoding": encoding, "size": size}
        if msg.HasField("routing_key"):
            obj["routing_key"] = msg.routing_key
        return obj


class Schemas:
    """The schema of each message's (schema_id, schema_version), fetched once from the
    registry (upstream's consume does the same)."""

    def __init__(self, client):
        self.client = client
        self._known = {}

    async def of(self, msg):
        if not msg.HasField("schema_id"):
            return None
        version = msg.schema_version if msg.HasField("schema_version") else None
        key = (msg.schema_id, version)
        if key not in self._known:
            self._known[key] = await self._fetch(msg.schema_id, version)
        return self._known[key]

    async def _fetch(self, schema_id, version):
        from danube.proto import SchemaRegistry_pb2 as sr
        from danube.rpc import RpcError
        request = sr.GetSchemaRequest(schema_id=schema_id)
        if version is not None:
            request.version = version
        try:
            resp = await self.client.pool.stub(self.client.service_url).get_schema(
                request, timeout=self.client.rpc_timeout)
        except RpcError as exc:
            print(f"⚠️  schema {schema_id} (version {version}) not fetched: {exc.details}",
                  file=sys.stderr)
            return None
        return MessageSchema(resp)


class MessageSchema:
    def __init__(self, resp):
        self.subject, self.version, self.type = resp.subject, resp.version, resp.schema_type
        self.validator = None
        if self.type == "json_schema":
            from danube.schema.formats import from_definition_json
            from danube.schema.validate import validator_for
            try:
                self.validator = validator_for(from_definition_json(
                    resp.schema_definition.decode()))
            except ValueError:
                self.validator = None

    def _problem(self, payload):
        from danube.schema.validate import PayloadInvalid
        try:
            self.validator.check(payload)
        except PayloadInvalid as exc:
            return str(exc)
        return None

    def describe(self, payload):
        out = {"schema_subject": self.subject, "schema_version": self.version,
               "schema_type": self.type}
        if self.validator is not None:
            problem = self._problem(payload)
            out["schema_valid"] = problem is None
            if problem:
                out["schema_error"] = problem
        return out

    def show(self, payload):
        print(f"Schema: {self.subject} v{self.version} ({self.type})")
        if self.type != "json_schema":
            return
        try:
            print(json.dumps(json.loads(payload), indent=2, ensure_ascii=False))
        except ValueError:
            pass
        if self.validator is not None:
            problem = self._problem(payload)
            print("✅ Valid against the schema" if problem is None
                  else f"⚠️  Does not match the schema: {problem}")
