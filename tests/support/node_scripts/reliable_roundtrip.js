// A Node.js client (@grpc/grpc-js + @grpc/proto-loader, i.e. protobufjs, which keeps only
// the last occurrence of an embedded message instead of merging them) against the broker:
// a reliable producer sends messages with attributes, a consumer receives them through
// ReceiveMessages and acks each one with the msg_id it was given.
//
// Usage: node reliable_roundtrip.js '<json args>'
//   args: {url, proto, topic, count}   (url as host:port)
// Prints one JSON line: {producer_id, messages: [...], acks: [...]}.

"use strict";

const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const args = JSON.parse(process.argv[2]);
// longs as strings: producer and consumer ids are random 64-bit numbers.
const def = protoLoader.loadSync(args.proto, {keepCase: true, longs: String, enums: Number,
                                              defaults: true});
const danube = grpc.loadPackageDefinition(def).danube;
const creds = grpc.credentials.createInsecure();
const producers = new danube.ProducerService(args.url, creds);
const consumers = new danube.ConsumerService(args.url, creds);
const deadline = () => ({deadline: Date.now() + 10000});

function call(client, method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, deadline(), (err, resp) => (err ? reject(err) : resolve(resp)));
  });
}

async function main() {
  const {topic, count} = args;
  const producer = await call(producers, "CreateProducer", {
    request_id: 1, producer_name: "node-producer", topic_name: topic,
    dispatch_strategy: 1 /* Reliable */});
  // A new reliable subscription starts at the live tail: subscribe before sending.
  const consumer = await call(consumers, "Subscribe", {
    request_id: 2, topic_name: topic, consumer_name: "node-consumer",
    subscription: "node-sub", subscription_type: 0 /* Exclusive */});
  const stream = consumers.ReceiveMessages({request_id: 3,
                                            consumer_id: consumer.consumer_id});
  const received = [];
  const done = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(
      `received ${received.length} of ${count} messages in 20 s`)), 20000);
    stream.on("data", (msg) => {
      received.push(msg);
      if (received.length === count) {
        clearTimeout(timer);
        resolve();
      }
    });
    stream.on("error", (err) => {
      if (received.length < count) reject(err);
    });
  });
  for (let i = 0; i < count; i++) {
    await call(producers, "SendMessage", {
      request_id: i + 1,
      msg_id: {producer_id: producer.producer_id, topic_name: topic,
               broker_addr: `http://${args.url}`},
      payload: Buffer.from(`node-${i}`), publish_time: Date.now(),
      producer_name: "node-producer", attributes: {index: String(i), lang: "js"}});
  }
  await done;
  const acks = [];
  for (const msg of received) {
    try {
      await call(consumers, "Ack", {request_id: msg.request_id, msg_id: msg.msg_id,
                                    subscription_name: "node-sub"});
      acks.push({ok: true});
    } catch (err) {
      acks.push({ok: false, code: err.code, details: err.details});
    }
  }
  stream.cancel();
  console.log(JSON.stringify({
    producer_id: producer.producer_id,
    messages: received.map((m) => ({
      payload: m.payload.toString(), attributes: m.attributes, request_id: m.request_id,
      producer_name: m.producer_name, producer_id: m.msg_id && m.msg_id.producer_id,
      topic_name: m.msg_id && m.msg_id.topic_name,
      broker_addr: m.msg_id && m.msg_id.broker_addr,
      topic_offset: m.msg_id && m.msg_id.topic_offset})),
    acks}));
}

main().then(() => process.exit(0), (err) => {
  console.error(err && err.stack || String(err));
  process.exit(1);
});
