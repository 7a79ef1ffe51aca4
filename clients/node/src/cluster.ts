/**
 * `ClusterClient`: several nodes on one keyspace, with `Client`'s methods. It decides
 * exactly as the Python `ClusterClient` does (delaywheel_client/retry.py, plans.py,
 * routing.py; docs/protocol.md, "Several nodes: the clients"):
 *
 * - The map: `cluster` from the known nodes, then the seeds (`no_method`: a server
 *   without partitions owns everything). A refresh or a `moved` hint replaces it whole.
 * - Routing: a call about a task goes to the owner of its id's partition
 *   (`crc32(id) % partitions`, an occurrence `s:{X}:{digits}` hashing `X`); `add` always
 *   sends an id (a random hex one when none is given), so resending it is safe.
 * - `moved`: take the hint, fetch the map, resend, at most 3 times in a row.
 * - `tryagain`, an owner that cannot be reached, or a node that closed saying
 *   `unavailable`: sleep `retry_after_ms` (or back off 50 ms doubling to 1 s), fetch the
 *   map, resend, for up to `failoverTimeoutS` (30 s).
 * - Outcome unknown (`unavailable`, a reply lost after sending): `add`, `addMany` and the
 *   reads are resent at most 3 times; other writes throw for the caller to decide.
 * - A resent add answered `exists` is read back: the same id, topic and body means the
 *   first send landed, and the add succeeds.
 * - `addMany` goes as one `add_many` per owner; `reserve` polls every node in turn, one
 *   node further on at each call, then waits on one node for at most `reserveSliceS`;
 *   `stats` is per node; `kick` and `list` visit every node; `ping` pings them all.
 */

import { randomUUID } from "node:crypto";
import { isDeepStrictEqual } from "node:util";

import { Client, type ClientOptions, parseUrl, sleep } from "./client.js";
import { Commands, READ_ONLY_METHODS } from "./commands.js";
import { ConnectionFailed, DelaywheelError, ServerClosed } from "./errors.js";
import { partitionOf } from "./partitions.js";
import type { ClusterMap, ClusterStats } from "./types.js";

/** `moved` is followed this many times in a row before the call throws it. */
export const MAX_MOVED_FOLLOWS = 3;
/** A call whose outcome is unknown is sent again at most this many times. */
export const MAX_UNKNOWN_RESENDS = 3;
export const FAILOVER_TIMEOUT_S = 30;
export const RESERVE_SLICE_S = 0.5;
const RETRY_MIN_S = 0.05;
const RETRY_MAX_S = 1.0;

const UNKNOWN_OUTCOME_RESENDABLE = new Set([...READ_ONLY_METHODS, "add", "add_many"]);

type Route = (params: unknown[]) => string | undefined;

const byId: Route = (params) => (typeof params[0] === "string" ? params[0] : undefined);
const byIdField: Route = (params) => {
  const first = params[0];
  const id = typeof first === "object" && first !== null ? (first as { id?: unknown }).id : undefined;
  return typeof id === "string" ? id : undefined;
};

/** The methods sent to the owner of a task (or schedule), by the param that names it. */
const ROUTES: Record<string, Route> = {
  add: byIdField,
  update: byId,
  delete: byId,
  get: byId,
  ack: byId,
  release: byId,
  touch: byId,
  kick_task: byId,
  schedule_add: byIdField,
  schedule_update: byId,
  schedule_pause: byId,
  schedule_resume: byId,
  schedule_delete: byId,
  schedule_get: byId,
  schedule_next: byId,
  schedule_trigger: byId,
  schedule_backfill: byId,
};

export function route(method: string, params: unknown[]): string | undefined {
  return ROUTES[method]?.(params);
}

/** A client-made id: `add` always sends one, so that sending it again is safe. */
export function newTaskId(): string {
  return randomUUID().replace(/-/g, "");
}

function isMap(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value) && !ArrayBuffer.isView(value);
}

/** `params` with an id given to an `add` (or each task of `add_many`) that has none. */
export function withId(method: string, params: unknown[]): unknown[] {
  if (method === "add" && isMap(params[0]) && !("id" in params[0])) {
    return [{ ...params[0], id: newTaskId() }, ...params.slice(1)];
  }
  if (method === "add_many" && Array.isArray(params[0])) {
    const tasks = params[0].map((task) => (isMap(task) && !("id" in task) ? { ...task, id: newTaskId() } : task));
    return [tasks, ...params.slice(1)];
  }
  return params;
}

/** Who owns which partition, as one node described it: immutable, replaced whole. */
export class PartitionMap {
  constructor(
    readonly partitions: number,
    readonly owners: readonly (string | null)[],
    readonly raw: ClusterMap,
  ) {}

  static fromCluster(result: unknown, asked: string): PartitionMap {
    if (!isMap(result)) throw new DelaywheelError(`${asked}: cluster answered ${JSON.stringify(result)}, not a map`, "internal");
    const partitions = result.partitions;
    if (typeof partitions !== "number" || !Number.isInteger(partitions) || partitions < 1) {
      throw new DelaywheelError(`${asked}: cluster gave partitions ${JSON.stringify(partitions)}`, "internal");
    }
    const owners: (string | null)[] = new Array(partitions).fill(null);
    for (const entry of Array.isArray(result.owners) ? result.owners : []) {
      if (!isMap(entry)) continue;
      const { partition, address } = entry;
      if (typeof partition === "number" && Number.isInteger(partition) && partition >= 0 && partition < partitions) {
        owners[partition] = typeof address === "string" && address !== "" ? address : null;
      }
    }
    return new PartitionMap(partitions, owners, structuredClone(result) as ClusterMap);
  }

  /** The map of a server without `cluster`: it owns everything. */
  static single(address: string): PartitionMap {
    const raw: ClusterMap = {
      node: address,
      partitions: 1,
      lease_s: null,
      owners: [{ partition: 0, node: address, address, epoch: null }],
    };
    return new PartitionMap(1, [address], raw);
  }

  ownerOf(taskId: string): string | null {
    return this.owners[partitionOf(taskId, this.partitions)] ?? null;
  }

  /** The owners' addresses, each once, sorted (the order `reserve` rotates through). */
  nodes(): string[] {
    return [...new Set(this.owners.filter((a): a is string => a !== null))].sort();
  }

  /** This map with a `moved` error's hint taken: `data.owner` owns `data.partition`. */
  followed(data: unknown): PartitionMap {
    if (!isMap(data)) return this;
    const { partition, owner } = data;
    if (typeof partition !== "number" || !Number.isInteger(partition) || partition < 0 || partition >= this.partitions) {
      return this;
    }
    if (typeof owner !== "string" || this.owners[partition] === owner) return this;
    const owners = [...this.owners];
    owners[partition] = owner;
    return new PartitionMap(this.partitions, owners, this.raw);
  }
}

/** How long to sleep after `tryagain` (its `retry_after_ms`) or an unreachable owner. */
export function retryAfterS(error: DelaywheelError, attempt: number): number {
  const waitMs = error.code === "tryagain" ? error.data?.retry_after_ms : undefined;
  if (typeof waitMs === "number" && waitMs >= 0) {
    return Math.min(Math.max(waitMs / 1000, RETRY_MIN_S), FAILOVER_TIMEOUT_S);
  }
  return Math.min(RETRY_MIN_S * 2 ** Math.min(attempt, 8), RETRY_MAX_S);
}

type Step = { action: "raise" } | { action: "confirm" } | { action: "resend"; waitS: number; hint?: unknown };

/** One call's retry policy: the same rules as the Python client's `Retry` (retry.py). */
export class Retry {
  resent: boolean;
  private moved = 0;
  private waits = 0;
  private unknown = 0;

  constructor(
    readonly method: string,
    readonly deadlineS: number,
    resent = false,
  ) {
    this.resent = resent;
  }

  after(error: DelaywheelError, nowS: number): Step {
    if (error.code === "exists") {
      return this.resent && (this.method === "add" || this.method === "add_many")
        ? { action: "confirm" }
        : { action: "raise" };
    }
    const step = this.step(error, nowS);
    if (step.action === "resend") this.resent = true;
    return step;
  }

  /** Part of the call got through (one owner's batch of an `add_many`). */
  progressed(): void {
    this.moved = 0;
  }

  private step(error: DelaywheelError, nowS: number): Step {
    if (error instanceof ServerClosed) {
      // Said before reading anything: over the connection limit. Bad input would come again.
      return error.code === "unavailable" ? this.wait(error, nowS) : { action: "raise" };
    }
    if (error instanceof ConnectionFailed) {
      return error.maybeApplied ? this.outcomeUnknown(error, nowS) : this.wait(error, nowS);
    }
    if (error.code === "moved") {
      if (this.moved >= MAX_MOVED_FOLLOWS) return { action: "raise" };
      this.moved += 1;
      return { action: "resend", waitS: 0, hint: error.data };
    }
    if (error.code === "tryagain") return this.wait(error, nowS);
    if (error.code === "unavailable") return this.outcomeUnknown(error, nowS);
    return { action: "raise" };
  }

  private wait(error: DelaywheelError, nowS: number): Step {
    if (nowS >= this.deadlineS) return { action: "raise" };
    const waitS = Math.min(retryAfterS(error, this.waits), this.deadlineS - nowS);
    this.waits += 1;
    return { action: "resend", waitS };
  }

  private outcomeUnknown(error: DelaywheelError, nowS: number): Step {
    const resendable = UNKNOWN_OUTCOME_RESENDABLE.has(this.method);
    if (!resendable || this.unknown >= MAX_UNKNOWN_RESENDS || nowS >= this.deadlineS) return { action: "raise" };
    const waitS = Math.min(retryAfterS(error, this.unknown), this.deadlineS - nowS);
    this.unknown += 1;
    return { action: "resend", waitS };
  }
}

/** Whether `stored` (`get`'s task) is the task `fields` (an `add`'s map) added. */
export function sameTask(fields: Record<string, unknown>, stored: unknown): boolean {
  return (
    isMap(stored) &&
    stored.id === fields.id &&
    stored.topic === fields.topic &&
    isDeepStrictEqual(normalBody(stored.body), normalBody(fields.body))
  );
}

// A body sent as a Buffer comes back as one (or a Uint8Array): compare bytes as bytes.
function normalBody(body: unknown): unknown {
  if (body === undefined) return null;
  if (ArrayBuffer.isView(body)) return Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  return body;
}

function addedResult(taskId: string, stored: Record<string, unknown>): Record<string, unknown> {
  const result: Record<string, unknown> = { id: taskId, at: stored.at };
  for (const key of ["cycle", "slot"]) if (key in stored) result[key] = stored[key];
  return result;
}

function nowS(): number {
  return performance.now() / 1000;
}

export interface ClusterClientOptions extends Omit<ClientOptions, "host" | "port"> {
  /** How long one call keeps trying while its partition has no reachable owner. Default 30 s. */
  failoverTimeoutS?: number;
  /** A blocking `reserve` waits on one node at a time for at most this long. Default 0.5 s. */
  reserveSliceS?: number;
}

/** The seed addresses, from a list or a comma-separated string; each one checked. */
export function parseSeeds(seeds: string | string[]): string[] {
  const items = typeof seeds === "string" ? seeds.split(",") : [...seeds];
  const addresses = items.map((item) => item.trim()).filter((item) => item !== "");
  if (addresses.length === 0) {
    throw new TypeError(`no seed addresses (host:port, comma-separated): ${JSON.stringify(seeds)}`);
  }
  for (const address of addresses) parseUrl(address);
  return addresses;
}

export class ClusterClient extends Commands<ClusterStats> {
  readonly seeds: string[];
  readonly failoverTimeoutS: number;
  readonly reserveSliceS: number;
  private readonly nodeOptions: ClientOptions;
  private readonly clients = new Map<string, Client>();
  private map: PartitionMap | undefined;
  private fetching: Promise<PartitionMap> | undefined;
  private turn = 0;
  private closed = false;

  /** `new ClusterClient(["10.0.0.1:3450", "10.0.0.2:3450"], {token})`, or one
   * comma-separated string. The options are `Client`'s, used for every node. */
  constructor(seeds: string | string[], options: ClusterClientOptions = {}) {
    super();
    this.seeds = parseSeeds(seeds);
    const { failoverTimeoutS, reserveSliceS, ...nodeOptions } = options;
    this.failoverTimeoutS = failoverTimeoutS ?? FAILOVER_TIMEOUT_S;
    this.reserveSliceS = reserveSliceS ?? RESERVE_SLICE_S;
    this.nodeOptions = nodeOptions;
  }

  /** The client of one node, by its `host:port` (made on first use). */
  node(address: string): Client {
    let client = this.clients.get(address);
    if (client === undefined) {
      if (this.closed) throw new ConnectionFailed(`${address}: the client is closed`);
      const { host, port } = parseUrl(address);
      client = new Client({ ...this.nodeOptions, host, port });
      this.clients.set(address, client);
    }
    return client;
  }

  /** Close every node's connection. */
  close(): void {
    this.closed = true;
    for (const client of this.clients.values()) client.close();
  }

  /** The map as last fetched (fetched now if it never was). */
  async partitionMap(): Promise<PartitionMap> {
    return this.map ?? this.refresh();
  }

  /** Fetch the map again: from the known nodes, then the seeds; the first answer wins. */
  refresh(): Promise<PartitionMap> {
    // Calls that need a fresh map at once share one fetch.
    this.fetching ??= this.fetchMap().finally(() => {
      this.fetching = undefined;
    });
    return this.fetching;
  }

  private async fetchMap(): Promise<PartitionMap> {
    const failures: string[] = [];
    const known = this.map?.nodes() ?? [];
    for (const address of new Set([...known, ...this.seeds])) {
      const answer = await this.sendTo(address, "cluster", []);
      if (answer instanceof ConnectionFailed) {
        failures.push(String(answer));
        continue;
      }
      let pmap: PartitionMap;
      if (answer instanceof DelaywheelError) {
        if (answer.code !== "no_method") throw answer;
        pmap = PartitionMap.single(address);
      } else {
        pmap = PartitionMap.fromCluster(answer, address);
      }
      this.map = pmap;
      return pmap;
    }
    throw new ConnectionFailed(`no node answered cluster: ${failures.join("; ")}`);
  }

  /** One call on one node: its result, or the error it failed with (not thrown). */
  private async sendTo(address: string, method: string, params: unknown[]): Promise<unknown> {
    try {
      return await this.node(address).call(method, ...params);
    } catch (exc) {
      if (exc instanceof DelaywheelError) return exc;
      throw exc;
    }
  }

  /** Before a resend: take the hint, sleep, fetch the map (all nodes down: the call's own
   * retry says so). */
  private async pause(step: Step): Promise<void> {
    if (step.action !== "resend") return;
    if (step.hint !== undefined && this.map !== undefined) this.map = this.map.followed(step.hint);
    if (step.waitS > 0) await sleep(step.waitS);
    try {
      await this.refresh();
    } catch (exc) {
      if (!(exc instanceof ConnectionFailed)) throw exc;
    }
  }

  private allNodes(pmap: PartitionMap): string[] {
    const nodes = pmap.nodes();
    return nodes.length > 0 ? nodes : this.seeds.slice(0, 1);
  }

  /** Every node, starting one further on at each call: no node is always last. */
  private rotate(pmap: PartitionMap): string[] {
    const nodes = this.allNodes(pmap);
    const start = this.turn % nodes.length;
    this.turn += 1;
    return [...nodes.slice(start), ...nodes.slice(0, start)];
  }

  private addressIn(pmap: PartitionMap, taskId: string | undefined): string {
    const owner = taskId !== undefined ? pmap.ownerOf(taskId) : null;
    return owner ?? this.rotate(pmap)[0]!;
  }

  protected async send(method: string, params: unknown[]): Promise<unknown> {
    switch (method) {
      case "ping":
      case "stats":
        return this.eachNode(method);
      case "kick":
        return this.kickEach(params[0] as string, params[1] as number);
      case "list":
      case "schedule_list":
        return this.page(method, params);
      case "cluster":
        return (await this.refresh()).raw;
      case "reserve":
        return this.reserveAny(params[0] as string | string[], (params[1] as number | undefined) ?? 0);
      default:
        return this.routedOrBatch(method, withId(method, params));
    }
  }

  /** `call` sends to one node (its owner), as the Python client's `call` does. */
  override call(method: string, ...params: unknown[]): Promise<unknown> {
    if (method === "reserve") return this.reserveAny(params[0] as string | string[], (params[1] as number | undefined) ?? 0);
    return this.routedOrBatch(method, withId(method, params));
  }

  private routedOrBatch(method: string, params: unknown[]): Promise<unknown> {
    if (method === "add_many" && params.length === 1 && Array.isArray(params[0])) {
      return this.addManyByOwner(params[0] as Record<string, unknown>[]);
    }
    return this.routed(method, params, route(method, params));
  }

  /** `method` on the owner of `taskId` (any node when undefined), retried as `Retry` decides. */
  private async routed(method: string, params: unknown[], taskId: string | undefined): Promise<unknown> {
    const retry = new Retry(method, nowS() + this.failoverTimeoutS);
    for (;;) {
      const pmap = await this.partitionMap();
      const answer = await this.sendTo(this.addressIn(pmap, taskId), method, params);
      if (!(answer instanceof DelaywheelError)) return answer;
      const step = retry.after(answer, nowS());
      if (step.action === "confirm" && taskId !== undefined) {
        const stored = await this.routed("get", [taskId], taskId);
        if (!sameTask(params[0] as Record<string, unknown>, stored)) throw answer;
        return addedResult(taskId, stored as Record<string, unknown>);
      }
      if (step.action !== "resend") throw answer;
      await this.pause(step);
    }
  }

  /** `add_many`: one per owner, all or nothing on each node; results in the caller's order. */
  private async addManyByOwner(tasks: Record<string, unknown>[]): Promise<unknown[]> {
    const results: unknown[] = new Array(tasks.length).fill(null);
    let left = tasks.map((_, index) => index);
    const retry = new Retry("add_many", nowS() + this.failoverTimeoutS);
    while (left.length > 0) {
      const pmap = await this.partitionMap();
      // The first owner's group, by the current map (tasks refused with moved regroup).
      const owners = left.map((i) => pmap.ownerOf(tasks[i]!.id as string));
      const address = owners[0] ?? this.rotate(pmap)[0]!;
      const indexes = left.filter((_, k) => (owners[k] ?? address) === address);
      const batch = indexes.map((i) => tasks[i]!);
      let answer = await this.sendTo(address, "add_many", [batch]);
      if (answer instanceof DelaywheelError) {
        const step = retry.after(answer, nowS());
        if (step.action === "resend") {
          await this.pause(step);
          continue;
        }
        if (step.action !== "confirm") throw answer;
        const stored: unknown[] = [];
        for (const fields of batch) stored.push(await this.routed("get", [fields.id], fields.id as string));
        if (!batch.every((fields, k) => sameTask(fields, stored[k]))) throw answer;
        answer = batch.map((fields, k) => addedResult(fields.id as string, stored[k] as Record<string, unknown>));
      }
      const answered = answer as unknown[];
      if (!Array.isArray(answered) || answered.length !== indexes.length) {
        throw new DelaywheelError(`add_many of ${indexes.length} tasks answered ${JSON.stringify(answer)}`, "internal");
      }
      indexes.forEach((i, k) => (results[i] = answered[k]));
      const done = new Set(indexes);
      left = left.filter((i) => !done.has(i));
      retry.progressed();
    }
    return results;
  }

  /** Every node in turn without waiting, then a wait on one node for at most a slice. */
  private async reserveAny(topics: string | string[], timeoutS: number): Promise<unknown> {
    const deadline = nowS() + Math.max(timeoutS, 0);
    for (;;) {
      const pmap = await this.partitionMap();
      const nodes = this.rotate(pmap);
      const failures: ConnectionFailed[] = [];
      for (const address of nodes) {
        const answer = await this.sendTo(address, "reserve", [topics, 0]);
        if (answer instanceof ConnectionFailed) failures.push(answer);
        else if (answer instanceof DelaywheelError) throw answer;
        else if (answer !== null && answer !== undefined) return answer;
      }
      if (failures.length > 0) {
        await this.pause({ action: "resend", waitS: 0 });
        if (failures.length === nodes.length) throw failures[0];
      }
      const remainingS = deadline - nowS();
      if (remainingS <= 0) return null;
      const answer = await this.sendTo(nodes[0]!, "reserve", [topics, Math.min(remainingS, this.reserveSliceS)]);
      if (answer instanceof DelaywheelError && !(answer instanceof ConnectionFailed)) throw answer;
      if (answer !== null && answer !== undefined && !(answer instanceof ConnectionFailed)) return answer;
    }
  }

  /** `ping` or `stats` of every node: "pong" once all answered; the stats by node. */
  private async eachNode(method: string): Promise<unknown> {
    const nodes = this.allNodes(await this.partitionMap());
    const answers = await Promise.all(nodes.map((address) => this.sendTo(address, method, [])));
    if (method === "stats") {
      const byNode: Record<string, unknown> = {};
      let tasks = 0;
      nodes.forEach((address, k) => {
        const answer = answers[k];
        if (answer instanceof DelaywheelError) byNode[address] = { error: String(answer) };
        else {
          byNode[address] = answer;
          tasks += Number((answer as { tasks?: number }).tasks ?? 0);
        }
      });
      return { nodes: byNode, tasks };
    }
    for (const answer of answers) if (answer instanceof DelaywheelError) throw answer;
    return "pong";
  }

  /** `kick`: each node in turn until `count` dead tasks were made ready. */
  private async kickEach(topic: string, count: number): Promise<number> {
    let kicked = 0;
    for (const address of this.allNodes(await this.partitionMap())) {
      if (kicked >= count) break;
      const answer = await this.sendTo(address, "kick", [topic, count - kicked]);
      if (answer instanceof DelaywheelError) throw answer;
      kicked += Number(answer);
    }
    return kicked;
  }

  /** `list` or `schedule_list`: one node's page, the nodes one after the other (the
   * cursor is `[address, that node's cursor]`). */
  private async page(method: string, params: unknown[]): Promise<unknown> {
    const { cursor, ...query } = (params[0] ?? {}) as Record<string, unknown>;
    const nodes = this.allNodes(await this.partitionMap());
    let address = nodes[0]!;
    if (cursor !== undefined && cursor !== null) {
      if (!Array.isArray(cursor) || cursor.length !== 2 || !nodes.includes(cursor[0] as string)) {
        throw new TypeError(`not a cursor of this cluster's list: ${JSON.stringify(cursor)}`);
      }
      address = cursor[0] as string;
      if (cursor[1] !== null) query.cursor = cursor[1];
    }
    const page = await this.sendTo(address, method, [query]);
    if (page instanceof DelaywheelError) throw page;
    const key = method === "list" ? "tasks" : "schedules";
    const { next, [key]: items } = page as Record<string, unknown>;
    if (next !== null && next !== undefined) return { [key]: items, next: [address, next] };
    const after = nodes.indexOf(address) + 1;
    return { [key]: items, next: after < nodes.length ? [nodes[after], null] : null };
  }
}
