"""`danube produce`: upstream danube-cli's produce command (same flags and output lines),
plus --output json and --pipeline for large counts. Without -i the messages go pipelined
(upstream paces them 500 ms apart); -i paces them as upstream does."""

import argparse
import asyncio
import json
import signal
import sys
import time

from danube.cli.connect import add_connection_options

# Sends in flight at once without -i (messages with a key each; otherwise send_many's batches).
DEFAULT_PIPELINE = 256

JSON_HELP = """\
output:
  text (default): one line per message, "📤 Message i/N sent successfully (ID: <id>)"
  (failures: "❌ Message i/N failed: <error>" on stderr), then a summary with
  "✅ Success: N", "❌ Errors: N" (when there were errors) and the rate.
  json: JSON Lines on stdout, one object per message
    {"index": i, "count": N, "request_id": <id>}   or   {"index": i, "count": N, "error": "..."}
  then a final summary object
    {"sent": N, "failed": N, "msgs_per_sec": R, "elapsed_s": S}
  Without -i the messages are sent pipelined (batches against this broker) and the lines
  come in message order as they are acknowledged; with -i, one every -i ms, as upstream.
  With --pipeline the per-message lines/objects are left out; only the summary is printed.
  With --count > 1 and stderr a terminal, a progress bar is drawn on stderr.
  Exit status: 0 when every message was sent, 1 otherwise (or when the producer cannot be
  created), 2 for bad arguments, 130 when interrupted.

examples:
  danube produce -s http://127.0.0.1:6650 -m "Hello Danube" -c 10 -i 100
  danube produce -s http://127.0.0.1:6650 -t /default/events -a "k1:v1,k2:v2" -m hi
  danube produce -s http://127.0.0.1:6650 -m x -c 100000 --pipeline 256 --output json
  danube produce -s http://127.0.0.1:6650 -t /default/orders -m hi -c 6 -i 100 -k "user-{i}"

-c N sends N messages pipelined (ours: upstream paces them 500 ms apart by default); -i MS
sends one every MS milliseconds (at least 100), as upstream; --pipeline N for bulk without
per-message lines.
"""


def _attributes(value):
    attrs = {}
    for pair in value.split(","):
        key, sep, val = pair.partition(":")
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(
                f"invalid attribute {pair!r}: expected 'key:value' pairs, e.g. 'k1:v1,k2:v2'")
        attrs[key.strip()] = val.strip()
    return attrs


def _positive(value):
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def add_parser(sub):
    p = sub.add_parser(
        "produce", help="send messages to a topic",
        description="Send messages to a topic (upstream danube-cli produce).",
        epilog=JSON_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-s", "--service-addr", required=True,
                   help="broker service URL, e.g. http://127.0.0.1:6650; several brokers of a "
                        "cluster comma-separated (lookups use whichever answers)")
    p.add_argument("-n", "--producer-name", default="test_producer", help="producer name")
    p.add_argument("-t", "--topic", default="/default/test_topic", help="topic to produce to")
    p.add_argument("-m", "--message", help="message text (required unless --file)")
    p.add_argument("-f", "--file", help="send this file's bytes as the payload (wins over -m)")
    p.add_argument("-a", "--attributes", type=_attributes, help="attributes 'k1:v1,k2:v2'")
    p.add_argument("-p", "--partitions", type=_positive,
                   help="number of partitions (messages go round-robin)")
    p.add_argument("-c", "--count", type=_positive, default=1, help="messages to send (1)")
    p.add_argument("-i", "--interval", type=int, default=None,
                   help="milliseconds between messages (minimum 100); without it the "
                        "messages are sent pipelined (ours: upstream's default is 500)")
    p.add_argument("--reliable", action="store_true", help="Reliable dispatch strategy")
    p.add_argument("-k", "--routing-key", metavar="KEY",
                   help="ours: the messages' routing key (Key-Shared subscriptions, and the "
                        "partition of a partitioned topic); '{i}' in it is replaced by the "
                        "message's number (1..N), e.g. 'user-{i}'")
    subject = p.add_mutually_exclusive_group()
    subject.add_argument("--schema-subject", help="schema subject (latest version)")
    subject.add_argument("--schema-file",
                         help="schema to register under the subject derived from the topic")
    version = p.add_mutually_exclusive_group()
    version.add_argument("--schema-version", type=int,
                         help="pin this schema version (needs --schema-subject)")
    version.add_argument("--schema-min-version", type=int,
                         help="require at least this schema version (needs --schema-subject)")
    p.add_argument("--schema-type", choices=("json_schema", "avro", "protobuf"),
                   help="type of --schema-file")
    p.add_argument("--output", choices=("text", "json"), default="text",
                   help="output format (ours; see below)")
    add_connection_options(p)
    p.add_argument("--pipeline", type=_positive, metavar="N",
                   help="ours: ignore --interval and keep up to N sends in flight")
    p.set_defaults(func=run, parser=p)


def _check(args):
    """Upstream's rules that argparse cannot express; returns an error message or None."""
    if args.message is None and args.file is None:
        return "one of -m/--message or -f/--file is required"
    if args.interval is not None and args.interval < 100 and args.pipeline is None:
        return "The interval must be at least 100 milliseconds"
    if (args.schema_version is not None or args.schema_min_version is not None) \
            and not args.schema_subject:
        return "--schema-version and --schema-min-version require --schema-subject"
    if args.schema_file and not args.schema_type:
        return "--schema-file requires --schema-type"
    if args.routing_key is not None:
        if not args.routing_key:
            return "--routing-key must not be empty"
        if "{i}" in args.routing_key and args.pipeline:
            return "--routing-key with {i} (a key per message) does not go with --pipeline"
    return None


def run(args):
    problem = _check(args)
    if problem:
        args.parser.error(problem)
    try:
        payload = open(args.file, "rb").read() if args.file else args.message.encode()
        schema_definition = open(args.schema_file, "rb").read() if args.schema_file else None
    except OSError as exc:
        print(f"danube produce: error: cannot read {exc.filename}: {exc.strerror}",
              file=sys.stderr)
        return 1
    sys.stdout.reconfigure(errors="backslashreplace", line_buffering=True)
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    return runner(_produce(args, payload, schema_definition))


async def _produce(args, payload, schema_definition):
    from danube.cli.connect import ConnectError, make_client
    from danube.client import DanubeError, register_schema, schema_reference

    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    report = Report(args)
    try:
        client = make_client(args)
    except (DanubeError, ConnectError) as exc:
        print(f"danube produce: error: {exc}", file=sys.stderr)
        return 1
    try:
        schema = None
        if schema_definition is not None:
            # Upstream's auto-register: subject = topic without the leading "/", "/" -> "-".
            subject = args.topic.lstrip("/").replace("/", "-")
            report.say(f"📤 Auto-registering schema for subject '{subject}' "
                       f"(type: {args.schema_type})...")
            registered = await register_schema(client, subject, args.schema_type,
                                               schema_definition)
            report.say(f"✅ Schema registered with ID: {registered.schema_id}")
            schema = schema_reference(subject)
        elif args.schema_subject:
            schema = schema_reference(args.schema_subject, args.schema_version,
                                      args.schema_min_version)
            pinned = (f"pinned to version {args.schema_version}"
                      if args.schema_version is not None else
                      f"minimum version {args.schema_min_version}"
                      if args.schema_min_version is not None else "latest version")
            report.say(f"📋 Using schema subject: {args.schema_subject} ({pinned})")
        producer = await client.create_producer(
            args.topic, args.producer_name, partitions=args.partitions,
            reliable=args.reliable, schema=schema)
        report.start()
        if args.pipeline:
            await producer.send_many(
                [payload] * args.count, args.attributes, args.routing_key,
                window=args.pipeline,
                return_exceptions=True,
                on_result=lambda i, r: report.result(i + 1, r, quiet=True))
        elif args.interval is not None or args.count == 1:
            await _paced(producer, payload, args, report)
        elif args.routing_key is not None and "{i}" in args.routing_key:
            await _keyed_pipelined(producer, payload, args, report)
        else:
            await producer.send_many([payload] * args.count, args.attributes,
                                     args.routing_key, window=DEFAULT_PIPELINE,
                                     return_exceptions=True,
                                     on_result=lambda i, r: report.result(i + 1, r))
    except asyncio.CancelledError:
        task.uncancel()
        report.finish(interrupted=True)
        return 130
    except DanubeError as exc:
        report.abort()
        print(f"danube produce: error: {exc}", file=sys.stderr)
        return 1
    finally:
        await client.close()
    report.finish()
    return 0 if report.failed == 0 else 1


async def _keyed_pipelined(producer, payload, args, report):
    """Without -i, a key per message ('{i}'): up to DEFAULT_PIPELINE sends in flight."""
    from danube.client import DanubeError

    slots = asyncio.Semaphore(DEFAULT_PIPELINE)

    async def one(i):
        try:
            outcome = await producer.send(payload, args.attributes,
                                          args.routing_key.replace("{i}", str(i)))
        except DanubeError as exc:
            outcome = exc
        finally:
            slots.release()
        report.result(i, outcome)

    tasks = []
    try:
        for i in range(1, args.count + 1):
            await slots.acquire()
            tasks.append(asyncio.ensure_future(one(i)))
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()


async def _paced(producer, payload, args, report):
    """Send `count` messages, one every `interval` ms (upstream's pacing)."""
    from danube.client import DanubeError

    start = time.monotonic()
    for i in range(1, args.count + 1):
        key = args.routing_key
        if key is not None:
            key = key.replace("{i}", str(i))
        try:
            outcome = await producer.send(payload, args.attributes, key)
        except DanubeError as exc:
            outcome = exc
        report.result(i, outcome)
        if i < args.count:
            await asyncio.sleep(max(0.0, start + i * (args.interval or 0) / 1000
                                    - time.monotonic()))


class Report:
    """Per-message lines, the progress bar and the summary, in text or JSON."""

    def __init__(self, args):
        self.count = args.count
        self.json = args.output == "json"
        self.sent = self.failed = 0
        # Each message counts once, sent or failed: the first outcome reported for it is
        # its outcome (the client's send_many reports one per message; the report keeps
        # that rule itself rather than trust every path to it).
        self._settled = bytearray(self.count + 1)
        self.started = None
        self.bar = ProgressBar(self.count) if self.count > 1 and sys.stderr.isatty() else None

    def say(self, text):
        """A status line: stdout in text mode (upstream's), stderr with --output json."""
        print(text, file=sys.stderr if self.json else sys.stdout, flush=True)

    def start(self):
        self.started = time.monotonic()
        if self.bar is not None:
            self.bar.started = self.started     # the rate counts sending, not connecting

    def result(self, index, outcome, quiet=False):
        if not 1 <= index <= self.count or self._settled[index]:
            return
        self._settled[index] = 1
        ok = not isinstance(outcome, Exception)
        if ok:
            self.sent += 1
        else:
            self.failed += 1
        if self.bar is not None and not quiet:
            self.bar.clear()        # the line goes where the bar was; the bar is redrawn
        if ok and not quiet:
            self._line({"index": index, "count": self.count, "request_id": outcome},
                       f"📤 Message {index}/{self.count} sent successfully (ID: {outcome})")
        elif not ok and not quiet:
            if self.json:
                self._line({"index": index, "count": self.count, "error": str(outcome)}, "")
            else:
                print(f"❌ Message {index}/{self.count} failed: {outcome}", file=sys.stderr)
        if self.bar is not None:
            self.bar.draw(self.sent + self.failed, self.failed, force=not quiet)

    def _line(self, obj, text):
        print(json.dumps(obj) if self.json else text, flush=True)

    def abort(self):
        if self.bar is not None:
            self.bar.clear()

    def finish(self, interrupted=False):
        if self.bar is not None:
            self.bar.clear()
        if not interrupted and self.started is not None:
            # A message no outcome was reported for was not acknowledged: failed.
            self.failed = self.count - self.sent
        elapsed = time.monotonic() - self.started if self.started is not None else 0.0
        rate = self.sent / elapsed if elapsed > 0 else 0.0
        if self.json:
            summary = {"sent": self.sent, "failed": self.failed,
                       "msgs_per_sec": round(rate, 1), "elapsed_s": round(elapsed, 3)}
            if interrupted:
                summary["interrupted"] = True
            print(json.dumps(summary), flush=True)
            return
        print("📊 Summary:" + (" (interrupted)" if interrupted else ""))
        print(f"   ✅ Success: {self.sent}")
        if self.failed:
            print(f"   ❌ Errors: {self.failed}")
        print(f"   ⏱️  {self.sent} sent, {self.failed} failed in {elapsed:.2f} s "
              f"({rate:.1f} msgs/s)", flush=True)


class ProgressBar:
    """A one-line bar on stderr, redrawn at most 10 times a second."""

    WIDTH = 30

    def __init__(self, total, stream=sys.stderr):
        self.total = total
        self.stream = stream
        self.started = time.monotonic()
        self._drawn_at = 0.0

    def draw(self, done, failed, force=False):
        now = time.monotonic()
        if not force and done < self.total and now - self._drawn_at < 0.1:
            return
        self._drawn_at = now
        filled = self.WIDTH * done // self.total
        rate = done / (now - self.started) if now > self.started else 0.0
        text = (f"\r[{'#' * filled}{'.' * (self.WIDTH - filled)}] {done}/{self.total} "
                f"{rate:.0f} msgs/s" + (f", {failed} failed" if failed else ""))
        self.stream.write(text)
        self.stream.flush()

    def clear(self):
        self.stream.write("\r\x1b[K")
        self.stream.flush()
