"""The web console (`danube admin serve`) against a real broker, driven through headless
Chromium (the system's /usr/bin/chromium, through Playwright): every page loads with its
own CSS and JS and nothing fetched elsewhere; the create-topic form creates a topic; a
topic's page shows a subscription's backlog and follows it live as messages arrive; the
page's unsubscribe and failure-policy actions reach the broker; the broker's errors show
on the page; a broker that cannot be reached gives a page naming it."""

import asyncio
import json
import os
import queue
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid

import pytest
from playwright.async_api import async_playwright, expect

from broker_process import BrokerProcess
from tls_broker import start_tls_broker
from danube.proto import DanubeAdmin_pb2 as adm
from danube.proto import SchemaRegistry_pb2 as sr

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
LISTENING = re.compile(r"listening on (http://\S+/)")


class Console:
    """`danube admin serve` as a subprocess on a free port."""

    def __init__(self, *args):
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "danube", "admin", "serve", "--listen", "127.0.0.1:0",
             *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.url = None
        seen = []
        while self.url is None:
            try:
                line = self.lines.get(timeout=20)
            except queue.Empty:
                break
            if line is None:
                break
            seen.append(line)
            m = LISTENING.search(line)
            if m:
                self.url = m.group(1).rstrip("/")
        if self.url is None:
            self.stop()
            raise RuntimeError("the console did not start:\n" + "".join(seen))

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(2)       # Ctrl-C
            try:
                return self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
        return self.proc.returncode


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(data_dir=tmp_path_factory.mktemp("console")).start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def console(broker):
    c = Console("--broker-endpoint", f"http://{broker.admin_addr}", "--cache-ttl-ms", "500")
    yield c
    assert c.stop() == 0, "Ctrl-C must stop the console cleanly"


@pytest.fixture
async def page(console):
    """A fresh page; every request it makes must go to the console (offline: no CDN) and
    its scripts must not fail."""
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        pg = await browser.new_page(viewport={"width": 1280, "height": 800})
        elsewhere, script_errors = [], []
        pg.on("request", lambda r: None if r.url.startswith(console.url)
              else elsewhere.append(r.url))
        pg.on("pageerror", lambda exc: script_errors.append(str(exc)))
        yield pg
        await browser.close()
        assert not elsewhere, f"requests outside the console: {elsewhere}"
        assert not script_errors, f"script errors: {script_errors}"


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def create(admin, name, reliable=True):
    await admin.call("TopicAdmin", "CreateTopic", adm.NewTopicRequest(
        name=name, dispatch_strategy=adm.Reliable if reliable else adm.NonReliable))


async def subscriptions(admin, name):
    return list((await admin.call("TopicAdmin", "ListSubscriptions",
                                  adm.TopicRequest(name=name))).subscriptions)


async def test_every_page_loads_styled_and_offline(page, console, admin, client):
    name = f"/default/{unique('pages')}"
    await create(admin, name)
    consumer = await client.subscribe(name, "c1", "audit", sub_type="exclusive")
    subject = unique("orders")
    schema = {"type": "object", "properties": {"id": {"type": "integer"}}}
    await admin.call("SchemaRegistry", "RegisterSchema", sr.RegisterSchemaRequest(
        subject=subject, schema_type="json_schema", schema_definition=json.dumps(schema).encode()))

    pages = {
        "/": "Dashboard", "/namespaces/default": "Namespace default",
        "/create-topic": "Create topic", f"/topics{name}": f"Topic {name}",
        f"/topics{name}/subscriptions/audit": "Subscription audit",
        "/schemas": "Schema subjects", f"/schemas/{subject}": f"Subject {subject}",
    }
    for path, heading in pages.items():
        response = await page.goto(console.url + path)
        assert response.status == 200, path
        await expect(page.locator("h1")).to_have_text(heading)
        # The stylesheet was served and applied (the header's colour comes from it).
        color = await page.eval_on_selector("header", "e => getComputedStyle(e).backgroundColor")
        assert color == "rgb(31, 78, 121)", path

    await page.goto(console.url + "/")
    await expect(page.locator("#brokers tbody tr")).to_have_count(1)
    await expect(page.locator("#brokers")).to_contain_text("leader")
    await expect(page.locator("#namespaces")).to_contain_text("default")
    await page.goto(f"{console.url}/namespaces/default?q={name.split('/')[-1]}")
    await expect(page.locator("#topics tbody tr")).to_have_count(1)
    await expect(page.locator("#topics")).to_contain_text("Reliable")
    await page.goto(f"{console.url}/schemas/{subject}")
    await expect(page.locator("#definition")).to_contain_text('"integer"')
    await consumer.close()


async def test_the_create_topic_form_creates_a_topic(page, console, admin):
    short = unique("made")
    await page.goto(console.url + "/namespaces/default")
    await page.click("text=Create topic >> nth=-1")
    await page.fill("input[name=name]", short)
    await page.select_option("select[name=dispatch_strategy]", "reliable")
    await page.click("button:has-text('Create')")
    name = f"/default/{short}"
    await expect(page.locator(".notice")).to_have_text(f"topic {name} created")
    await expect(page.locator("h1")).to_have_text(f"Topic {name}")
    await expect(page.locator(".describe")).to_contain_text("Reliable")
    topics = (await admin.call("TopicAdmin", "ListNamespaceTopics",
                               adm.NamespaceRequest(name="default"))).topics
    assert [t.delivery for t in topics if t.name == name] == ["Reliable"]
    await page.goto(f"{console.url}/namespaces/default?q={short}")
    await expect(page.locator(f"#topics tr[data-topic='{name}']")).to_have_count(1)


async def test_a_partitioned_topic_through_the_form(page, console, admin):
    short = unique("parts")
    await page.goto(console.url + "/create-topic")
    await page.fill("input[name=name]", short)
    await page.fill("input[name=partitions]", "3")
    await page.click("button:has-text('Create')")
    await expect(page.locator(".notice")).to_contain_text("with 3 partitions")
    await expect(page.locator("section.partition")).to_have_count(3)
    topics = (await admin.call("TopicAdmin", "ListNamespaceTopics",
                               adm.NamespaceRequest(name="default"))).topics
    assert sorted(t.name for t in topics if short in t.name) == [
        f"/default/{short}-part-{i}" for i in range(3)]


async def test_the_broker_s_error_shows_on_the_form(page, console, admin):
    name = f"/default/{unique('twice')}"
    await create(admin, name)
    await page.goto(console.url + "/create-topic")
    await page.fill("input[name=name]", name)
    async with page.expect_response(lambda r: r.request.method == "POST") as answer:
        await page.click("button:has-text('Create')")
    assert (await answer.value).status == 409
    error = page.locator(".error")
    await expect(error).to_contain_text("ALREADY_EXISTS")
    await expect(error).to_contain_text(f"{name} already exists")
    # The form keeps what was typed, to fix and send again.
    await expect(page.locator("input[name=name]")).to_have_value(name)
    # A field the console can tell is wrong is refused before the broker is asked.
    await page.fill("input[name=partitions]", "many")
    await page.click("button:has-text('Create')")
    await expect(error).to_contain_text("partitions: 'many' is not a whole number")


async def test_the_topic_page_follows_the_backlog_live(page, console, admin, client):
    name = f"/default/{unique('live')}"
    await create(admin, name)
    consumer = await client.subscribe(name, "c1", "audit", sub_type="exclusive")
    producer = await client.create_producer(name, "p1", reliable=True)
    for i in range(3):
        await producer.send(b"m%d" % i)
    await page.goto(console.url + f"/topics{name}")
    backlog = page.locator("tr[data-subscription='audit'] td.backlog")
    await expect(backlog).to_have_text("3", timeout=10_000)
    await page.evaluate("window.notReloaded = true")

    n = 25
    for i in range(n):
        await producer.send(b"more%d" % i)
    await expect(backlog).to_have_text(str(3 + n), timeout=15_000)
    assert await page.evaluate("window.notReloaded === true"), "the page was reloaded"
    await expect(page.locator(".topic-backlog")).to_have_text(str(3 + n))
    await expect(page.locator("#live-status")).to_contain_text("updated")
    await consumer.close()


async def test_unsubscribe_through_the_page(page, console, admin, client):
    name = f"/default/{unique('unsub')}"
    await create(admin, name)
    consumer = await client.subscribe(name, "c1", "audit", sub_type="exclusive")
    await consumer.close()
    await page.goto(console.url + f"/topics{name}")
    row = page.locator("tr[data-subscription='audit']")
    # Dismissing the confirmation keeps the subscription.
    page.once("dialog", lambda dialog: asyncio.ensure_future(dialog.dismiss()))
    await row.locator("button:has-text('Unsubscribe')").click()
    await asyncio.sleep(0.5)
    assert await subscriptions(admin, name) == ["audit"]

    questions = []

    def accept(dialog):
        questions.append(dialog.message)
        asyncio.ensure_future(dialog.accept())
    page.once("dialog", accept)
    await row.locator("button:has-text('Unsubscribe')").click()
    await expect(page.locator(".notice")).to_have_text("subscription audit removed")
    assert "audit" in questions[0] and name in questions[0]
    await expect(row).to_have_count(0)
    assert await subscriptions(admin, name) == []


async def test_set_the_failure_policy_through_the_form(page, console, admin, client):
    name = f"/default/{unique('policy')}"
    await create(admin, name)
    consumer = await client.subscribe(name, "c1", "work", sub_type="shared")
    await page.goto(console.url + f"/topics{name}")
    await page.click("tr[data-subscription='work'] >> text=failure policy")
    await expect(page.locator("h1")).to_have_text("Subscription work")
    form = page.locator("#policy-form")
    await form.locator("input[name=max_redelivery_count]").fill("7")
    await form.locator("input[name=ack_timeout_ms]").fill("1500")
    await form.locator("input[name=base_redelivery_delay_ms]").fill("20")
    await form.locator("input[name=max_redelivery_delay_ms]").fill("400")
    await form.locator("select[name=backoff_strategy]").select_option("exponential")
    await form.locator("select[name=poison_policy]").select_option("drop")
    await form.locator("input[name=dead_letter_topic]").fill("")
    await form.locator("button").click()
    await expect(page.locator(".notice")).to_have_text("failure policy saved")

    got = await admin.call("TopicAdmin", "GetSubscriptionFailurePolicy",
                           adm.GetSubscriptionFailurePolicyRequest(topic=name,
                                                                   subscription="work"))
    p = got.failure_policy
    assert (p.max_redelivery_count, p.ack_timeout_ms, p.base_redelivery_delay_ms,
            p.max_redelivery_delay_ms) == (7, 1500, 20, 400)
    assert p.backoff_strategy == adm.Exponential and p.poison_policy == adm.Drop
    assert not p.HasField("dead_letter_topic")
    # The page shows what the broker now has.
    current = page.locator("#current-policy tbody td")
    await expect(current).to_have_text(["7", "1500", "20", "400", "exponential", "-", "drop"])

    # A value out of range is refused with the field named, and nothing changes.
    await form.locator("input[name=max_redelivery_count]").fill("-1")
    await form.locator("button").click()
    await expect(page.locator(".error")).to_contain_text("max redelivery count")
    got = await admin.call("TopicAdmin", "GetSubscriptionFailurePolicy",
                           adm.GetSubscriptionFailurePolicyRequest(topic=name,
                                                                   subscription="work"))
    assert got.failure_policy.max_redelivery_count == 7
    await consumer.close()


async def test_a_non_reliable_subscription_has_no_policy_form(page, console, admin, client):
    name = f"/default/{unique('plain')}"
    await create(admin, name, reliable=False)
    consumer = await client.subscribe(name, "c1", "live", sub_type="shared")
    await page.goto(console.url + f"/topics{name}/subscriptions/live")
    await expect(page.locator("#policy-not-applicable")).to_contain_text("NonReliable")
    await expect(page.locator("#policy-form")).to_have_count(0)
    await consumer.close()


async def test_a_missing_topic_is_a_404_page(page, console):
    response = await page.goto(console.url + "/topics/default/no-such-topic")
    assert response.status == 404
    await expect(page.locator(".error")).to_contain_text("NOT_FOUND")
    await expect(page.locator(".error")).to_contain_text("/default/no-such-topic")


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_an_unreachable_broker_is_a_page_naming_it():
    dead = "http://127.0.0.1:1"
    console = Console("--broker-endpoint", dead, "--request-timeout-ms", "2000")
    try:
        status, body = get(console.url + "/")
        assert status == 503
        assert "Broker unreachable" in body and dead in body and "Traceback" not in body
        status, body = get(console.url + "/api/namespaces/default/topics")
        assert status == 503 and json.loads(body)["endpoint"] == dead
    finally:
        assert console.stop() == 0
    output = []
    while (line := console.lines.get(timeout=5)) is not None:
        output.append(line)
    assert any("does not answer yet" in line and dead in line
               for line in output), output


def test_cross_site_form_posts_are_refused(console):
    request = urllib.request.Request(console.url + "/create-topic", data=b"name=evil",
                                     headers={"Origin": "http://elsewhere.example"})
    status, body = get(request)
    assert status == 403 and "cross-origin" in body


def test_serve_refuses_what_it_cannot_do():
    def serve(*args, env=None):
        return subprocess.run([sys.executable, "-P", "-m", "danube", "admin", "serve", *args],
                              capture_output=True, text=True, timeout=30,
                              env=dict(os.environ, **(env or {})))
    out = serve("--mode", "rest")
    assert out.returncode == 2 and "use ui, mcp or all" in out.stderr
    out = subprocess.run([sys.executable, "-P", "-m", "danube", "admin", "server", "--mode",
                          "rest"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "use ui, mcp or all" in out.stderr   # upstream's alias
    out = serve(env={"DANUBE_ADMIN_MODE": "mcp", "DANUBE_MCP_CONFIG": "/nonexistent.yml"})
    assert out.returncode == 2 and "/nonexistent.yml" in out.stderr
    out = serve("--prometheus-url", "localhost:9090")
    assert out.returncode == 2 and "prometheus URL" in out.stderr
    out = serve("--listen-addr", "nonsense")
    assert out.returncode == 2 and "HOST:PORT" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory):
    b = start_tls_broker(tmp_path_factory.mktemp("console-tls"))
    yield b
    b.stop()


def test_the_console_reaches_a_broker_over_tls(tls_broker):
    https = f"https://{tls_broker.admin_addr}"
    untrusted = Console("--broker-endpoint", https)
    try:
        status, body = get(untrusted.url + "/")
        assert status == 503 and "certificate verify failed" in body
    finally:
        assert untrusted.stop() == 0
    trusted = Console("--broker-endpoint", https, "--grpc-ca", tls_broker.ca_file)
    try:
        status, body = get(trusted.url + "/")
        assert status == 200 and "Cluster_Leader" in body
    finally:
        assert trusted.stop() == 0
    # --grpc-enable-tls for an endpoint without https://; the name checked is --grpc-domain
    wrong_name = Console("--broker-endpoint", tls_broker.admin_addr, "--grpc-enable-tls",
                         "--grpc-ca", tls_broker.ca_file, "--grpc-domain", "elsewhere.example")
    try:
        status, body = get(wrong_name.url + "/")
        assert status == 503 and "elsewhere.example" in body
    finally:
        assert wrong_name.stop() == 0
