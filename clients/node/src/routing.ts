/**
 * Several nodes, without any I/O (the Python client's routing.py): which param routes a
 * call, the ids a cluster client gives `add`, the partition map from `cluster` and a
 * `moved` hint taken into it, and the seeds.
 */

import { randomUUID } from "node:crypto";

import { parseUrl } from "./client.js";
import { DelaywheelError } from "./errors.js";
import { partitionOf } from "./partitions.js";
import type { ClusterMap } from "./types.js";

/**
 * `moved` is followed at once this many times in a row (each time with a fresh map); past
 * that the nodes disagree for longer than a refresh (a partition moving: the old owner
 * names the new one before the new one serves it), and each further follow waits a backoff
 * first, until the call's deadline.
 */
export const MOVED_AT_ONCE = 3;
/** How long one call keeps trying while its partition has no owner that answers, or is moving. */
export const FAILOVER_TIMEOUT_S = 30;
/** A blocking `reserve` waits on one node at a time for at most this long. */
export const RESERVE_SLICE_S = 0.5;
/**
 * `reserve` fetches the map again when it is older than this: it asks the nodes of the
 * map, and a node that joined (or came back) since is in no map taken before, while no
 * reserve is ever answered `moved` to say so. One `cluster` a client at most this often.
 */
export const MAP_MAX_AGE_S = 5;

type Route = (params: unknown[]) => string | undefined;

const byId: Route = (params) => (typeof params[0] === "string" ? params[0] : undefined);
const byIdField: Route = (params) => {
  const first = params[0];
  const id = typeof first === "object" && first !== null ? (first as { id?: unknown }).id : undefined;
  return typeof id === "string" ? id : undefined;
};

/** A topic's settings live under `s:{topic}:000` (the Python client's `settings_key`). */
const byTopic: Route = (params) => (typeof params[0] === "string" ? `s:${params[0]}:000` : undefined);

/** The methods sent to the owner of a task (or schedule), by the param that names it. */
const ROUTES: Record<string, Route> = {
  add: byIdField,
  update: byId,
  delete: byId,
  get: byId,
  ack: byId,
  wait: byId,
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
  topic_get: byTopic,
  topic_set: byTopic,
};

export function route(method: string, params: unknown[]): string | undefined {
  return ROUTES[method]?.(params);
}

/** A client-made id: `add` always sends one, so that sending it again is safe. */
export function newTaskId(): string {
  return randomUUID().replace(/-/g, "");
}

export function isMap(value: unknown): value is Record<string, unknown> {
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
