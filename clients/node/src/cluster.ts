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
 * - `moved`: take the hint, fetch the map, resend: at once 3 times in a row, then after a
 *   backoff each time, until `failoverTimeoutS` (a partition moving answers `moved` from
 *   both nodes for a moment; `Moved` is thrown only when they still disagree then).
 * - `tryagain`, an owner that cannot be reached, or a node that closed saying
 *   `unavailable`: sleep `retry_after_ms` (or back off 50 ms doubling to 1 s), fetch the
 *   map, resend, for up to `failoverTimeoutS` (30 s).
 * - Outcome unknown (`unavailable`, a reply lost after sending): `add`, `addMany` and the
 *   reads are resent at most 3 times; other writes throw for the caller to decide.
 * - A resent add answered `exists` is read back: the same id, topic and body means the
 *   first send landed, and the add succeeds.
 * - `addMany` goes as one `add_many` per owner; `reserve` polls every node in turn, one
 *   node further on at each call, then waits on one node for at most `reserveSliceS`
 *   (the nodes of a map fetched at most `MAP_MAX_AGE_S` ago);
 *   `stats` is per node; `kick` and `list` visit every node; `ping` pings them all
 *   (those too the nodes of a map fetched at most `MAP_MAX_AGE_S` ago).
 */

import { Client, type ClientOptions, parseUrl, sleep } from "./client.js";
import { Commands } from "./commands.js";
import { ConnectionFailed, DelaywheelError } from "./errors.js";
import { Retry, type Step, addedResult, nowS, sameTask } from "./retry.js";
import {
  FAILOVER_TIMEOUT_S,
  MAP_MAX_AGE_S,
  PartitionMap,
  RESERVE_SLICE_S,
  parseSeeds,
  route,
  withId,
} from "./routing.js";
import type { ClusterStats } from "./types.js";

export interface ClusterClientOptions extends Omit<ClientOptions, "host" | "port"> {
  /** How long one call keeps trying while its partition has no reachable owner, or is moving. Default 30 s. */
  failoverTimeoutS?: number;
  /** A blocking `reserve` waits on one node at a time for at most this long. Default 0.5 s. */
  reserveSliceS?: number;
}

export class ClusterClient extends Commands<ClusterStats> {
  readonly seeds: string[];
  readonly failoverTimeoutS: number;
  readonly reserveSliceS: number;
  private readonly nodeOptions: ClientOptions;
  private readonly clients = new Map<string, Client>();
  private map: PartitionMap | undefined;
  private mapS = 0; // when the map was fetched (nowS)
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
      this.mapS = nowS();
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
      case "topic_list":
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

  /** Every node in turn without waiting, then a wait on one node for at most a slice; a
   * map older than `MAP_MAX_AGE_S` fetched again first (the nodes are the map's). */
  private async reserveAny(topics: string | string[], timeoutS: number): Promise<unknown> {
    const deadline = nowS() + Math.max(timeoutS, 0);
    for (;;) {
      const nodes = this.rotate(await this.everyNodeMap());
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

  /** The map for a call that visits its nodes, fetched again first when older than
   * `MAP_MAX_AGE_S`: no answer of theirs is `moved`, so nothing else would tell a
   * long-lived client of a node that joined or came back since (a moved hint taken since
   * does not make the map new). */
  private async everyNodeMap(): Promise<PartitionMap> {
    if (this.map !== undefined && nowS() - this.mapS > MAP_MAX_AGE_S) {
      await this.pause({ action: "resend", waitS: 0 });
    }
    return this.partitionMap();
  }

  /** `ping` or `stats` of every node: "pong" once all answered; the stats by node. */
  private async eachNode(method: string): Promise<unknown> {
    const nodes = this.allNodes(await this.everyNodeMap());
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
    for (const address of this.allNodes(await this.everyNodeMap())) {
      if (kicked >= count) break;
      const answer = await this.sendTo(address, "kick", [topic, count - kicked]);
      if (answer instanceof DelaywheelError) throw answer;
      kicked += Number(answer);
    }
    return kicked;
  }

  /** `list`, `schedule_list` or `topic_list`: one node's page, the nodes one after the other (the
   * cursor is `[address, that node's cursor]`). */
  private async page(method: string, params: unknown[]): Promise<unknown> {
    const { cursor, ...query } = (params[0] ?? {}) as Record<string, unknown>;
    const nodes = this.allNodes(await this.everyNodeMap());
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
    const key = method === "list" ? "tasks" : method === "topic_list" ? "topics" : "schedules";
    const { next, [key]: items } = page as Record<string, unknown>;
    if (next !== null && next !== undefined) return { [key]: items, next: [address, next] };
    const after = nodes.indexOf(address) + 1;
    return { [key]: items, next: after < nodes.length ? [nodes[after], null] : null };
  }
}
