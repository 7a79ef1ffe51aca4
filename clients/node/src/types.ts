/**
 * The shapes of what the client sends and gets back (docs/protocol.md, "Task" and
 * "Methods"). Times are seconds, as on the wire: `delay`, `ttr` and `timeout` are
 * durations, `at`, `created` and `deadline` Unix timestamps.
 *
 * Bodies are any MessagePack value: bin is a `Uint8Array` (send a `Buffer` or a
 * `Uint8Array`), str a `string`, int and float a `number`, nil `null`, arrays and maps
 * arrays and plain objects. A task added from Python is read the same here, and back.
 */

export type Body = unknown;

export type TaskState = "delayed" | "ready" | "reserved" | "delivering" | "dead" | "done" | "gone";

/** How a due task is delivered (docs/delivery.md): `{type: "queue"}` is the ready queue. */
export interface Target {
  type: "queue" | "http" | "redis" | "amqp" | "nats" | string;
  [field: string]: unknown;
}

/** A task as the server returns it. */
export interface Task {
  id: string;
  topic: string;
  body: Body;
  state: TaskState;
  at: number;
  ttr: number;
  attempts: number;
  max_attempts: number;
  /** 0 is the most urgent; 1024 unless given. */
  priority: number;
  target: Target;
  created: number;
  cycle: number | null;
  slot: number | null;
  /** Only while reserved: when the reservation runs out. */
  deadline?: number;
  /** Only after a failed attempt to a target. */
  last_error?: string;
  /** Only for a schedule's occurrence. */
  schedule?: string;
  nominal?: number;
  nominal_local?: string;
  late_by?: number;
  /** Only when the task was given one: seconds it is kept `done`. */
  retain?: number;
  /** Only once completed: when (Unix s), how (`acked`, `HTTP 200`, `published`), and its result. */
  completed?: number;
  outcome?: string;
  result?: unknown;
}

/** What `add` (and each entry of `addMany`) answers. */
export interface Added {
  id: string;
  at: number;
  cycle: number;
  slot: number;
}

/** `add`'s options; those left out take the server's defaults. */
export interface AddOptions {
  /** Seconds from now (give `delay` or `at`, not both). */
  delay?: number;
  /** Absolute due time, Unix seconds. */
  at?: number;
  /** A client-chosen id makes `add` idempotent (`Exists` on a repeat). */
  id?: string;
  /** Time to run, seconds (default 60; 0: at most once). */
  ttr?: number;
  /** Deliveries before the task goes to `dead` (default 5). */
  maxAttempts?: number;
  target?: Target;
  /** Seconds the task is kept `done`, with its result, once acked or delivered. */
  retain?: number;
  /** 0 is the most urgent (default 1024): `reserve` takes the most urgent ready task first. */
  priority?: number;
}

/** A task map as `addMany` sends it: the protocol's field names. */
export interface TaskFields {
  topic: string;
  id?: string;
  body?: Body;
  delay?: number;
  at?: number;
  ttr?: number;
  max_attempts?: number;
  target?: Target;
  retain?: number;
  priority?: number;
}

/** What `update` may change. */
export interface TaskChanges {
  delay?: number;
  at?: number;
  body?: Body;
  topic?: string;
  ttr?: number;
  target?: Target;
  max_attempts?: number;
  priority?: number;
}

export interface ListQuery {
  topic?: string;
  state?: TaskState;
  /** 1 to 1000 per page (the server's default 100). */
  limit?: number;
  /** The `next` of the previous page. */
  cursor?: unknown;
}

export interface TaskPage {
  tasks: Task[];
  next: unknown;
}

export interface ScheduleQuery {
  topic?: string;
  paused?: boolean;
  limit?: number;
  cursor?: unknown;
}

/** A recurring schedule (docs/schedules.md): `id`, `cron` + `tz` or `every`, the task
 * template and its policies. The server's answer adds its state. */
export interface Schedule {
  id: string;
  cron?: string;
  tz?: string;
  every?: number;
  anchor?: number;
  topic?: string;
  body?: Body;
  [field: string]: unknown;
}

/** A schedule as the server returns it: the spec with `version`, `paused`, `note`,
 * `next`, `last_fired`, `counts`. */
export interface ScheduleState extends Schedule {
  version: number;
  paused: boolean;
  next: number | null;
  [field: string]: unknown;
}

export interface SchedulePage {
  schedules: ScheduleState[];
  next: unknown;
}

/** What `topicSet` may change (null puts a field back to its default). */
export interface TopicSettingsChanges {
  /** Paused until then (Unix s); null: not paused. */
  paused_until?: number | null;
  /** Tasks a second handed out; null: no limit. */
  rate?: number | null;
  burst?: number | null;
  /** Reserved or delivering at once; null: no limit. */
  concurrency?: number | null;
  /** Seconds a completed task is kept. */
  retain?: number | null;
  /** Seconds a dead task is kept; null: the server's `--dead-retention`. */
  dead_retain?: number | null;
  note?: string | null;
}

/** A topic's settings as the server returns them. */
export interface TopicSettings {
  topic: string;
  paused: boolean;
  paused_until: number | null;
  rate: number | null;
  burst: number;
  concurrency: number | null;
  retain: number;
  dead_retain: number | null;
  note: string;
}

export interface TopicPage {
  topics: TopicSettings[];
  next: unknown;
}

export interface TopicQuery {
  paused?: boolean;
  limit?: number;
  cursor?: unknown;
}

export interface ScheduleTimes {
  times: { utc: number; local: string }[];
  description: string;
}

export interface ClusterOwner {
  partition: number;
  node: string | null;
  address: string | null;
  epoch: number | null;
}

/** The keyspace's partition map (`cluster`). */
export interface ClusterMap {
  node: string;
  partitions: number;
  lease_s: number | null;
  owners: ClusterOwner[];
  [field: string]: unknown;
}

/** `stats` of one server (docs/protocol.md lists every field). */
export interface Stats {
  version: string;
  uptime: number;
  tasks: number;
  states: Record<string, number>;
  topics: Record<string, Record<string, number>>;
  [field: string]: unknown;
}

/** `stats` of a `ClusterClient`: each node's (or `{error}` for one that did not answer),
 * and the sum of their `tasks`. */
export interface ClusterStats {
  nodes: Record<string, Stats | { error: string }>;
  tasks: number;
}
