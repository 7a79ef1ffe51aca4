/**
 * `Worker`: run a handler per topic on reserved tasks, `concurrency` at a time; ack on
 * success, release with backoff on a throw (as the Python `Worker` does).
 *
 * Each of the `concurrency` loops reserves from every registered topic (waiting up to
 * `reserveTimeoutS`), calls the topic's handler with the task, and acks it when the
 * handler's promise resolves. When the handler throws (or rejects), the task is released
 * with a delay of `retryBaseS * 2 ** (attempts - 1)`, at most `retryCapS`; on its last
 * attempt it is released at once and the server makes it `dead` (`kick` revives it). A
 * lost connection, `Unavailable` and `Internal` are logged and retried with backoff; any
 * other error (a wrong token, say) ends `run()` with it.
 *
 * Delivery is at least once: make handlers idempotent, or `touch` long work.
 */

import type { Commands } from "./commands.js";
import { ConnectionFailed, DelaywheelError, Internal, Unavailable } from "./errors.js";
import type { Task } from "./types.js";

export type Handler = (task: Task) => unknown | Promise<unknown>;

export interface WorkerLogger {
  warn(message: string, ...more: unknown[]): void;
  error(message: string, ...more: unknown[]): void;
}

export interface WorkerOptions {
  /** How many tasks are handled at once (each by its own loop). Default 1. */
  concurrency?: number;
  /** How long one `reserve` waits for a task. Default 1 s. */
  reserveTimeoutS?: number;
  /** The release delay after a first failure, doubling at each attempt. Default 1 s. */
  retryBaseS?: number;
  /** The longest release delay. Default 3600 s. */
  retryCapS?: number;
  /** Where failures are reported. Default `console`. */
  logger?: WorkerLogger;
}

// Backoff while the server cannot be reached: 0.1 s doubling to 10 s.
const RECONNECT_BASE_S = 0.1;
const RECONNECT_CAP_S = 10;

export class Worker {
  readonly concurrency: number;
  readonly reserveTimeoutS: number;
  readonly retryBaseS: number;
  readonly retryCapS: number;
  private readonly logger: WorkerLogger;
  private readonly handlers = new Map<string, Handler>();
  private stopping = false;
  private readonly sleepers = new Set<() => void>();

  /** `client` is a `Client` or a `ClusterClient`. */
  constructor(
    readonly client: Commands<unknown>,
    options: WorkerOptions = {},
  ) {
    this.concurrency = options.concurrency ?? 1;
    if (!Number.isInteger(this.concurrency) || this.concurrency < 1) {
      throw new RangeError(`concurrency must be an integer of at least 1, got ${options.concurrency}`);
    }
    this.reserveTimeoutS = options.reserveTimeoutS ?? 1;
    this.retryBaseS = options.retryBaseS ?? 1;
    this.retryCapS = options.retryCapS ?? 3600;
    this.logger = options.logger ?? console;
  }

  /** Handle `topic`'s tasks with `handler(task)`; replaces an earlier handler. */
  handle(topic: string, handler: Handler): this {
    this.handlers.set(topic, handler);
    return this;
  }

  /** The release delay after a task's `attempts`-th delivery failed. */
  retryDelayS(attempts: number): number {
    const exponent = Math.min(Math.max(attempts - 1, 0), 64);
    return Math.min(this.retryBaseS * 2 ** exponent, this.retryCapS);
  }

  /** Ask `run()` to resolve once the tasks in hand are done. */
  stop(): void {
    this.stopping = true;
    for (const wake of [...this.sleepers]) wake();
  }

  /** Handle tasks until `stop()` or `maxTasks` were handled; resolves with how many. */
  async run(options: { maxTasks?: number } = {}): Promise<number> {
    if (this.handlers.size === 0) throw new Error("no handlers registered: use worker.handle(topic, fn) first");
    const maxTasks = options.maxTasks ?? Infinity;
    const topics = [...this.handlers.keys()];
    let taken = 0;
    let failures = 0;
    this.stopping = false;
    const loop = async (): Promise<void> => {
      while (!this.stopping && taken < maxTasks) {
        let task: Task | null;
        try {
          task = await this.client.reserve(topics, this.reserveTimeoutS);
        } catch (exc) {
          if (!(exc instanceof ConnectionFailed || exc instanceof Unavailable || exc instanceof Internal)) throw exc;
          const delayS = Math.min(RECONNECT_BASE_S * 2 ** Math.min(failures, 16), RECONNECT_CAP_S);
          failures += 1;
          this.logger.warn(`delaywheel worker: reserve failed (${exc}); retrying in ${delayS.toFixed(1)} s`);
          await this.pause(delayS);
          continue;
        }
        failures = 0;
        if (task === null) continue;
        if (taken >= maxTasks) {
          // Another loop reached the count meanwhile: give this one back at once.
          await this.settle("release", task.id, () => this.client.release(task.id, 0));
          break;
        }
        taken += 1;
        await this.handleOne(task);
      }
    };
    // An error no retry fixes ends every loop, not just its own, and run() with it.
    const loopUntilFatal = (): Promise<void> =>
      loop().catch((exc: unknown) => {
        this.stop();
        throw exc;
      });
    const loops = Array.from({ length: this.concurrency }, loopUntilFatal);
    const outcomes = await Promise.allSettled(loops);
    this.stopping = false;
    const failed = outcomes.find((outcome): outcome is PromiseRejectedResult => outcome.status === "rejected");
    if (failed !== undefined) throw failed.reason;
    return taken;
  }

  private pause(seconds: number): Promise<void> {
    return new Promise((resolve) => {
      const wake = (): void => {
        clearTimeout(timer);
        this.sleepers.delete(wake);
        resolve();
      };
      const timer = setTimeout(wake, seconds * 1000);
      this.sleepers.add(wake);
    });
  }

  private async handleOne(task: Task): Promise<void> {
    const handler = this.handlers.get(task.topic);
    let result: unknown;
    try {
      if (handler === undefined) throw new Error(`no handler for topic ${JSON.stringify(task.topic)}`);
      result = await handler(task);
    } catch (exc) {
      const attempts = Number(task.attempts || 1);
      const maxAttempts = task.max_attempts;
      let delayS = 0;
      if (Number.isInteger(maxAttempts) && attempts >= maxAttempts) {
        this.logger.error(
          `delaywheel worker: task ${JSON.stringify(task.id)} of topic ${JSON.stringify(task.topic)} failed on its ` +
            `last attempt (${attempts} of ${maxAttempts}): it is now dead; kick makes it due again`,
          exc,
        );
      } else {
        delayS = this.retryDelayS(attempts);
        this.logger.error(
          `delaywheel worker: task ${JSON.stringify(task.id)} of topic ${JSON.stringify(task.topic)} failed on ` +
            `attempt ${attempts} of ${maxAttempts ?? "?"}; releasing it for ${delayS} s`,
          exc,
        );
      }
      await this.settle("release", task.id, () => this.client.release(task.id, delayS));
      return;
    }
    // What the handler returned is the task's result (kept with a retained task).
    await this.settle("ack", task.id, () => this.client.ack(task.id, result));
  }

  private async settle(what: string, taskId: string, call: () => Promise<unknown>): Promise<void> {
    try {
      await call();
    } catch (exc) {
      // Conflict/NotFound: the ttr ran out or the task was deleted meanwhile; a lost
      // connection: the server delivers the task again when its ttr runs out.
      if (!(exc instanceof DelaywheelError)) throw exc;
      this.logger.warn(`delaywheel worker: ${what} of task ${JSON.stringify(taskId)} failed: ${exc}`);
    }
  }
}
