import { Client, Worker } from "delaywheel-client";

const dw = new Client(process.env.DELAYWHEEL_URL ?? "delaywheel://127.0.0.1:3450");

// Add a task due in 2 seconds; the body is any MessagePack value.
const { id } = await dw.add("emails", { to: "a@example.com" }, { delay: 2 });
console.log("added", id);

// Reserve it (waiting up to 5 s for it to be due), do the work, ack it.
const task = await dw.reserve("emails", 5);
console.log("reserved", task.id, task.body.to);
await dw.ack(task.id);

// Or let a Worker do that: one handler per topic, 4 tasks at a time.
// A handler that returns acks the task; one that throws releases it with backoff.
const worker = new Worker(dw, { concurrency: 4 });
worker.handle("emails", async (task) => {
  console.log("sending to", task.body.to);
});
await dw.add("emails", { to: "b@example.com" });
await worker.run({ maxTasks: 1 }); // without maxTasks: until worker.stop()
dw.close();
