"""Upstream danube-admin's PromQL queries (danube-admin/src/metrics/queries/), the same
metric names, labels and arithmetic, so the admin UI's API and the MCP tools show what
upstream's do against the same Prometheus. Every function returns (data, errors): a query
that fails adds its message to `errors` and counts as zero, as upstream's helpers do, so a
page still shows what the broker's admin API answered when Prometheus is away.

Label values are escaped for PromQL (upstream pastes them in as they are)."""

import asyncio


def label(value):
    """A PromQL string literal's inside: backslash and double quote escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(sample):
    try:
        return float(sample["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None


class Queries:
    def __init__(self, client):
        self.client = client

    async def _result(self, query, errors, what=None):
        try:
            return await self.client.query_instant(query)
        except Exception as exc:        # PromError, or anything the thread raised
            errors.append(f"{what} query failed: {exc}" if what else str(exc))
            return None

    async def sum_int(self, query, errors):
        """Upstream's sum_u64: each sample truncated to an integer, then summed."""
        result = await self._result(query, errors)
        values = (_number(s) for s in result or ())
        return sum(int(v) for v in values if v is not None and v == v and v >= 0)

    async def sum_float(self, query, errors):
        result = await self._result(query, errors)
        values = (_number(s) for s in result or ())
        return float(sum(v for v in values if v is not None and v == v))

    async def one_float(self, query, errors):
        """Upstream's one_f64: the first sample, else 0."""
        for sample in await self._result(query, errors) or ():
            v = _number(sample)
            if v is not None:
                return v if v == v else 0.0
        return 0.0

    async def by_label(self, query, key, errors, what):
        """{label value: number} over the samples that carry `key`."""
        out = {}
        for sample in await self._result(query, errors, what) or ():
            name = (sample.get("metric") or {}).get(key)
            v = _number(sample)
            if name is not None and v is not None and v == v:
                out[name] = v
        return out

    # -- brokers (queries/broker.rs) --------------------------------------------------------

    async def broker_connections(self, broker_id, topic_names):
        """rpc_total and the producers + consumers of the broker's topics in `topic_names`."""
        errors = []
        b = label(broker_id)
        rpc, prod, cons = await asyncio.gather(
            self.sum_int(f'sum(danube_broker_rpc_total{{broker="{b}"}})', errors),
            self.by_label(f'danube_topic_active_producers{{broker="{b}"}}', "topic", errors,
                          "producers"),
            self.by_label(f'danube_topic_active_consumers{{broker="{b}"}}', "topic", errors,
                          "consumers"))
        active = sum(int(v) for t, v in prod.items() if t in topic_names) + \
            sum(int(v) for t, v in cons.items() if t in topic_names)
        return {"rpc_total": rpc, "active_connections": active}, errors

    async def broker_bytes_and_rpc(self, broker_id):
        errors = []
        b = label(broker_id)
        rpc, b_in, b_out = await asyncio.gather(
            self.sum_int(f'sum(danube_broker_rpc_total{{broker="{b}"}})', errors),
            self.sum_int(f'sum(danube_topic_bytes_in_total{{broker="{b}"}})', errors),
            self.sum_int(f'sum(danube_consumer_bytes_out_total{{broker="{b}"}})', errors))
        return {"rpc_total": rpc, "bytes_in_total": b_in, "bytes_out_total": b_out}, errors

    async def topics_by_broker(self, broker_id):
        """{topic: (producers, consumers, subscriptions)} from the broker's gauges."""
        errors = []
        b = label(broker_id)
        maps = await asyncio.gather(*(
            self.by_label(f'danube_topic_active_{kind}{{broker="{b}"}}', "topic", errors, kind)
            for kind in ("producers", "consumers", "subscriptions")))
        out = {}
        for i, values in enumerate(maps):
            for topic, v in values.items():
                entry = out.setdefault(topic, [0, 0, 0])
                entry[i] = int(v)
        return {t: tuple(v) for t, v in out.items()}, errors

    async def broker_metrics(self, broker_id):
        """The MCP tool's summary of one broker."""
        errors = []
        b = label(broker_id)
        owned, rpc, prod, cons, b_in, b_out = await asyncio.gather(
            self.sum_int(f'danube_broker_topics_owned{{broker="{b}"}}', errors),
            self.sum_int(f'sum(danube_broker_rpc_total{{broker="{b}"}})', errors),
            self.sum_int(f'sum(danube_topic_active_producers{{broker="{b}"}})', errors),
            self.sum_int(f'sum(danube_topic_active_consumers{{broker="{b}"}})', errors),
            self.sum_int(f'sum(danube_topic_bytes_in_total{{broker="{b}"}})', errors),
            self.sum_int(f'sum(danube_consumer_bytes_out_total{{broker="{b}"}})', errors))
        return {"broker_id": broker_id, "topics_owned": owned, "rpc_total": rpc,
                "producers": prod, "consumers": cons, "bytes_in_total": b_in,
                "bytes_out_total": b_out}, errors

    # -- cluster (queries/cluster.rs) -------------------------------------------------------

    async def cluster_metrics(self):
        errors = []
        i, f = self.sum_int, self.sum_float
        values = await asyncio.gather(
            i("count(danube_leader_election_state)", errors),
            i("sum(danube_broker_topics_owned)", errors),
            i("sum(danube_topic_active_producers)", errors),
            i("sum(danube_topic_active_consumers)", errors),
            i("sum(danube_topic_active_subscriptions)", errors),
            f("sum(rate(danube_topic_messages_in_total[1m]))", errors),
            f("sum(rate(danube_consumer_messages_out_total[1m]))", errors),
            f("sum(rate(danube_topic_bytes_in_total[1m]))", errors),
            f("sum(rate(danube_consumer_bytes_out_total[1m]))", errors),
            self.one_float("max(danube_cluster_imbalance_cv)", errors))
        keys = ("broker_count", "topics_total", "producers_total", "consumers_total",
                "subscriptions_total", "messages_in_rate", "messages_out_rate",
                "bytes_in_rate", "bytes_out_rate", "imbalance_cv")
        return dict(zip(keys, values)), errors

    # -- topics (queries/topic.rs) ----------------------------------------------------------

    async def topic_core(self, topic, errors):
        t = label(topic)
        values = await asyncio.gather(*(self.sum_int(q, errors) for q in (
            f'sum(danube_topic_messages_in_total{{topic="{t}"}})',
            f'sum(danube_consumer_messages_out_total{{topic="{t}"}})',
            f'sum(danube_topic_bytes_in_total{{topic="{t}"}})',
            f'sum(danube_consumer_bytes_out_total{{topic="{t}"}})')))
        return dict(zip(("messages_in_total", "messages_out_total", "bytes_in_total",
                         "bytes_out_total"), values))

    async def topic_active(self, topic, errors):
        t = label(topic)
        values = await asyncio.gather(*(
            self.sum_int(f'sum(danube_topic_active_{kind}{{topic="{t}"}})', errors)
            for kind in ("producers", "consumers", "subscriptions")))
        return dict(zip(("producers", "consumers", "subscriptions"), values))

    async def topic_rates(self, topic, errors):
        t = label(topic)
        pub, disp = await asyncio.gather(
            self.sum_float(f'sum(rate(danube_topic_messages_in_total{{topic="{t}"}}[1m]))',
                           errors),
            self.sum_float(
                f'sum(rate(danube_consumer_messages_out_total{{topic="{t}"}}[1m]))', errors))
        return {"publish_rate_1m": pub, "dispatch_rate_1m": disp}

    async def producer_quality(self, topic, errors):
        t = label(topic)
        ok, err, by_code = await asyncio.gather(
            self.sum_int(f'sum(danube_producer_send_total{{topic="{t}",result="ok"}})', errors),
            self.sum_int(f'sum(danube_producer_send_total{{topic="{t}",result="error"}})',
                         errors),
            self.by_label('sum by (error_code) (danube_producer_send_total'
                          f'{{topic="{t}",result="error"}})', "error_code", errors,
                          "send_error_by_code"))
        return {"send_ok_total": ok, "send_error_total": err,
                "send_error_by_code": [[code, int(v)] for code, v in by_code.items()]}

    async def latency_summary(self, topic, errors):
        """p50/p95/p99 from the summary's quantile series (the UI's topic page)."""
        t = label(topic)
        values = await asyncio.gather(*(self.one_float(
            f'danube_producer_send_latency_ms{{topic="{t}",quantile="{q}"}}', errors)
            for q in ("0.5", "0.95", "0.99")))
        return dict(zip(("p50_ms", "p95_ms", "p99_ms"), values))

    async def latency_histogram(self, topic, errors):
        """p50/p95/p99 over 5 minutes from the histogram's buckets (the MCP tool)."""
        t = label(topic)
        values = await asyncio.gather(*(self.one_float(
            f"histogram_quantile({q}, sum(rate(danube_producer_send_latency_ms_bucket"
            f'{{topic="{t}"}}[5m])) by (le))', errors) for q in ("0.5", "0.95", "0.99")))
        return dict(zip(("p50_ms", "p95_ms", "p99_ms"), values))

    async def message_size_avg(self, topic, errors):
        t = label(topic)
        total, count = await asyncio.gather(
            self.one_float(f'danube_topic_message_size_bytes_sum{{topic="{t}"}}', errors),
            self.one_float(f'danube_topic_message_size_bytes_count{{topic="{t}"}}', errors))
        count = int(count)
        return total / count if count > 0 else 0.0

    async def subscription_lag(self, topic, errors):
        t = label(topic)
        return await self.sum_int(f'sum(danube_subscription_lag_messages{{topic="{t}"}})',
                                  errors)

    async def reliable(self, topic, errors):
        """WAL and cloud upload figures, or None when the topic shows no WAL activity."""
        t = label(topic)
        appends, p50, p95, p99 = await asyncio.gather(
            self.sum_int(f'sum(danube_wal_append_total{{topic="{t}"}})', errors),
            *(self.one_float(f'danube_wal_flush_latency_ms{{topic="{t}",quantile="{q}"}}',
                             errors) for q in ("0.5", "0.95", "0.99")))
        if appends == 0 and p50 == 0 and p95 == 0 and p99 == 0:
            return None
        a_bytes, flushes, c_bytes, c_objects = await asyncio.gather(*(
            self.sum_int(q, errors) for q in (
                f'sum(danube_wal_append_bytes_total{{topic="{t}"}})',
                f'sum(danube_wal_flush_total{{topic="{t}"}})',
                f'sum(danube_cloud_upload_bytes_total{{topic="{t}"}})',
                f'sum(danube_cloud_upload_objects_total{{topic="{t}",result="ok"}})')))
        return {"wal_append_total": appends, "wal_append_bytes_total": a_bytes,
                "wal_flush_total": flushes, "wal_flush_latency_ms_p50": p50,
                "wal_flush_latency_ms_p95": p95, "wal_flush_latency_ms_p99": p99,
                "cloud_upload_bytes_total": c_bytes, "cloud_upload_objects_total": c_objects}

    async def topic_metrics(self, topic):
        """The MCP tool's summary of one topic."""
        errors = []
        core, active, rates, lag, latency = await asyncio.gather(
            self.topic_core(topic, errors), self.topic_active(topic, errors),
            self.topic_rates(topic, errors), self.subscription_lag(topic, errors),
            self.latency_histogram(topic, errors))
        return {"topic": topic, **core, **active, **rates, "subscription_lag": lag,
                "latency_p50_ms": latency["p50_ms"], "latency_p95_ms": latency["p95_ms"],
                "latency_p99_ms": latency["p99_ms"]}, errors

    # -- series and raw (queries/series.rs) -------------------------------------------------

    async def series(self, query, start, end, step):
        """[(labels, [(ms, value)])] of a range query; raises PromError."""
        out = []
        for s in await self.client.query_range(query, start, end, step):
            points = []
            for ts, v in s.get("values") or ():
                try:
                    points.append([int(float(ts) * 1000), float(v)])
                except (TypeError, ValueError):
                    continue
            out.append((s.get("metric") or {}, points))
        return out

    async def raw(self, query):
        """Upstream's query_raw text: one line per sample, labels and value."""
        result = await self.client.query_instant(query)
        lines = [f"Query: {query}", "Results:"]
        if not result:
            lines.append("  (no data)")
        for s in result:
            labels = ", ".join(f'{k}="{v}"' for k, v in (s.get("metric") or {}).items())
            value = (s.get("value") or [None, ""])[1]
            lines.append(f"  {{{labels}}} => {value}")
        return "\n".join(lines) + "\n"
