/**
 * Every protocol method as a typed method, written once for `Client` and `ClusterClient`
 * (the same list as the Python client's delaywheel_client/commands.py and
 * docs/protocol.md, "Methods"). Each builds the protocol's params and hands them to
 * `send`, which each client implements: `Client` sends to its one server, `ClusterClient`
 * to the owner of the task the call names.
 */

import type {
  AddOptions,
  Added,
  ClusterMap,
  ListQuery,
  Schedule,
  SchedulePage,
  ScheduleQuery,
  ScheduleState,
  ScheduleTimes,
  Stats,
  Task,
  TaskChanges,
  TaskFields,
  TaskPage,
  TopicPage,
  TopicQuery,
  TopicSettings,
  TopicSettingsChanges,
} from "./types.js";

/** The methods that change nothing: a client may send one again when its reply was lost. */
export const READ_ONLY_METHODS: ReadonlySet<string> = new Set([
  "ping",
  "auth",
  "get",
  "list",
  "wait",
  "stats",
  "cluster",
  "schedule_get",
  "schedule_list",
  "schedule_next",
  "topic_get",
  "topic_list",
]);

/** `add`'s task map: only the fields given (the server's defaults apply to the others). */
export function taskFields(topic: string, body: unknown, options: AddOptions): TaskFields {
  const task: TaskFields = { topic };
  if (options.id !== undefined) task.id = options.id;
  if (body !== undefined && body !== null) task.body = body;
  if (options.delay !== undefined) task.delay = options.delay;
  if (options.at !== undefined) task.at = options.at;
  if (options.ttr !== undefined) task.ttr = options.ttr;
  if (options.maxAttempts !== undefined) task.max_attempts = options.maxAttempts;
  if (options.target !== undefined) task.target = options.target;
  if (options.retain !== undefined) task.retain = options.retain;
  if (options.priority !== undefined) task.priority = options.priority;
  return task;
}

function withoutUndefined<T extends object>(query: T): Partial<T> {
  return Object.fromEntries(Object.entries(query).filter(([, value]) => value !== undefined)) as Partial<T>;
}

/** `TStats` is what `stats` answers: one server's `Stats`, or a cluster's `ClusterStats`. */
export abstract class Commands<TStats = Stats> {
  /**
   * Send one call: its params are the protocol's; `waitS` is how much longer than the
   * client's timeout its reply may take (a blocking `reserve`'s wait).
   */
  protected abstract send(method: string, params: unknown[], waitS?: number): Promise<unknown>;

  /** Any method by name, with the protocol's params: `call("get", "task-1")`. */
  call(method: string, ...params: unknown[]): Promise<unknown> {
    const blocking = method === "reserve" || method === "wait";
    const waitS = blocking && typeof params[1] === "number" && params[1] > 0 ? params[1] : 0;
    return this.send(method, params, waitS);
  }

  /** `"pong"`. */
  async ping(): Promise<string> {
    return (await this.send("ping", [])) as string;
  }

  /** Add a task; `body` is any MessagePack value (a `Buffer`/`Uint8Array` travels as bin). */
  async add(topic: string, body?: unknown, options: AddOptions = {}): Promise<Added> {
    return (await this.send("add", [taskFields(topic, body, options)])) as Added;
  }

  /** Add task maps all or nothing; `add`'s result for each, in order. */
  async addMany(tasks: TaskFields[]): Promise<Added[]> {
    return (await this.send("add_many", [tasks.map((task) => ({ ...task }))])) as Added[];
  }

  /** Change `delay`/`at`, `body`, `topic`, `ttr`, `target`, `max_attempts` or `priority`: the updated task. */
  async update(id: string, changes: TaskChanges): Promise<Task> {
    return (await this.send("update", [id, changes])) as Task;
  }

  /** True if the task existed. */
  async delete(id: string): Promise<boolean> {
    return Boolean(await this.send("delete", [id]));
  }

  /** The task, or null. */
  async get(id: string): Promise<Task | null> {
    return ((await this.send("get", [id])) ?? null) as Task | null;
  }

  /** One page of `list`: `{tasks, next}`, `next` the cursor of the following page or null. */
  async listPage(query: ListQuery = {}): Promise<TaskPage> {
    return (await this.send("list", [withoutUndefined(query)])) as TaskPage;
  }

  /** Every page of matching tasks, following `next` (`for await (const page of dw.list(...))`). */
  async *list(query: ListQuery = {}): AsyncGenerator<TaskPage, void, undefined> {
    let cursor = query.cursor;
    do {
      const page = await this.listPage({ ...query, cursor });
      yield page;
      cursor = page.next;
    } while (cursor !== null && cursor !== undefined);
  }

  /** Every matching task, page after page. */
  async *tasks(query: Omit<ListQuery, "cursor"> = {}): AsyncGenerator<Task, void, undefined> {
    for await (const page of this.list(query)) yield* page.tasks;
  }

  /** The oldest ready task of `topics`, now reserved, or null after `timeout` seconds. */
  async reserve(topics: string | string[], timeout = 0): Promise<Task | null> {
    return ((await this.send("reserve", [topics, timeout], timeout)) ?? null) as Task | null;
  }

  /** The reserved task is done: removed, or kept `done` with `result` for its `retain` seconds. */
  async ack(id: string, result?: unknown): Promise<boolean> {
    return Boolean(await this.send("ack", result === undefined || result === null ? [id] : [id, result]));
  }

  /** The task's final map once it is `done`, `dead` or gone (`state` `"gone"`), or null after `timeout` s. */
  async wait(id: string, timeout = 0): Promise<Task | null> {
    return ((await this.send("wait", [id, timeout], timeout)) ?? null) as Task | null;
  }

  /** Put a reserved task back, due after `delay` seconds. */
  async release(id: string, delay = 0): Promise<boolean> {
    return Boolean(await this.send("release", [id, delay]));
  }

  /** Extend a reservation by its ttr: the new deadline (Unix s). */
  async touch(id: string): Promise<number> {
    return (await this.send("touch", [id])) as number;
  }

  /** Make up to `count` dead tasks of `topic` ready again: how many. */
  async kick(topic: string, count: number): Promise<number> {
    return (await this.send("kick", [topic, count])) as number;
  }

  /** Make one dead task ready again (due now, if it has a target). */
  async kickTask(id: string): Promise<boolean> {
    return Boolean(await this.send("kick_task", [id]));
  }

  /** Counts by state and topic, wheel settings, store, uptime, version, ... */
  async stats(): Promise<TStats> {
    return (await this.send("stats", [])) as TStats;
  }

  /** The keyspace's partition map. */
  async cluster(): Promise<ClusterMap> {
    return (await this.send("cluster", [])) as ClusterMap;
  }

  /** Save a recurring schedule (docs/schedules.md): the schedule with its state. */
  async scheduleAdd(schedule: Schedule): Promise<ScheduleState> {
    return (await this.send("schedule_add", [{ ...schedule }])) as ScheduleState;
  }

  /** Change a schedule (null removes a field); a stale `expectedVersion` throws `Conflict`. */
  async scheduleUpdate(id: string, changes: Record<string, unknown>, expectedVersion?: number): Promise<ScheduleState> {
    const params = expectedVersion === undefined ? [id, changes] : [id, changes, expectedVersion];
    return (await this.send("schedule_update", params)) as ScheduleState;
  }

  /** Pause a schedule, with a note. */
  async schedulePause(id: string, note?: string): Promise<ScheduleState> {
    return (await this.send("schedule_pause", note === undefined ? [id] : [id, note])) as ScheduleState;
  }

  /** Resume a paused schedule from now. */
  async scheduleResume(id: string): Promise<ScheduleState> {
    return (await this.send("schedule_resume", [id])) as ScheduleState;
  }

  /** Delete a schedule; true if it existed. */
  async scheduleDelete(id: string): Promise<boolean> {
    return Boolean(await this.send("schedule_delete", [id]));
  }

  /** A schedule with its state, or null. */
  async scheduleGet(id: string): Promise<ScheduleState | null> {
    return ((await this.send("schedule_get", [id])) ?? null) as ScheduleState | null;
  }

  /** One page of schedules: `{schedules, next}`. */
  async scheduleListPage(query: ScheduleQuery = {}): Promise<SchedulePage> {
    return (await this.send("schedule_list", [withoutUndefined(query)])) as SchedulePage;
  }

  /** Every page of matching schedules, following `next`. */
  async *scheduleList(query: ScheduleQuery = {}): AsyncGenerator<SchedulePage, void, undefined> {
    let cursor = query.cursor;
    do {
      const page = await this.scheduleListPage({ ...query, cursor });
      yield page;
      cursor = page.next;
    } while (cursor !== null && cursor !== undefined);
  }

  /** The next `n` (1-1000, default 5) times of a schedule id or an unsaved spec. */
  async scheduleNext(schedule: string | Omit<Schedule, "id">, n?: number): Promise<ScheduleTimes> {
    return (await this.send("schedule_next", n === undefined ? [schedule] : [schedule, n])) as ScheduleTimes;
  }

  /** One extra occurrence now: `{id}` of its task. */
  async scheduleTrigger(id: string): Promise<{ id: string }> {
    return (await this.send("schedule_trigger", [id])) as { id: string };
  }

  /** Fire the occurrences in [start, min(end, now)] (Unix s): `{ids, existing}`. */
  async scheduleBackfill(id: string, start: number, end: number): Promise<{ ids: string[]; existing: number }> {
    return (await this.send("schedule_backfill", [id, start, end])) as { ids: string[]; existing: number };
  }

  /** A topic's settings (the defaults when never set). */
  async topicGet(topic: string): Promise<TopicSettings> {
    return (await this.send("topic_get", [topic])) as TopicSettings;
  }

  /** Change a topic's settings (only the fields given; null: back to the default). */
  async topicSet(topic: string, settings: TopicSettingsChanges): Promise<TopicSettings> {
    return (await this.send("topic_set", [topic, { ...settings }])) as TopicSettings;
  }

  /** One page of the topics that have settings: `{topics, next}`. */
  async topicList(query: TopicQuery = {}): Promise<TopicPage> {
    return (await this.send("topic_list", [withoutUndefined(query)])) as TopicPage;
  }
}
