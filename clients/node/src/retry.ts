/**
 * How a cluster client retries, without any I/O (the Python client's retry.py, rule for
 * rule: test/rules.test.mjs checks the two decision by decision). `Retry` decides, error
 * by error, whether a call is thrown, sent again (after a wait and a fresh map) or
 * confirmed (a resent `add` answered `exists`: read the task and compare).
 */

import { isDeepStrictEqual } from "node:util";

import { READ_ONLY_METHODS } from "./commands.js";
import { ConnectionFailed, DelaywheelError, ServerClosed } from "./errors.js";
import { FAILOVER_TIMEOUT_S, MOVED_AT_ONCE, isMap } from "./routing.js";

/** A call whose outcome is unknown is sent again at most this many times. */
export const MAX_UNKNOWN_RESENDS = 3;
const RETRY_MIN_S = 0.05;
const RETRY_MAX_S = 1.0;

// Sending again is safe only for these: each add carries its id, and reads change nothing.
const UNKNOWN_OUTCOME_RESENDABLE = new Set([...READ_ONLY_METHODS, "add", "add_many"]);

/** How long to sleep after `tryagain` (its `retry_after_ms`) or an unreachable owner. */
export function retryAfterS(error: DelaywheelError, attempt: number): number {
  const waitMs = error.code === "tryagain" ? error.data?.retry_after_ms : undefined;
  if (typeof waitMs === "number" && waitMs >= 0) {
    return Math.min(Math.max(waitMs / 1000, RETRY_MIN_S), FAILOVER_TIMEOUT_S);
  }
  return Math.min(RETRY_MIN_S * 2 ** Math.min(attempt, 8), RETRY_MAX_S);
}

export type Step = { action: "raise" } | { action: "confirm" } | { action: "resend"; waitS: number; hint?: unknown };

/**
 * One call's retry policy: the same rules as the Python client's `Retry` (retry.py).
 *
 * - `moved`: follow the hint, refresh, resend: at once `MOVED_AT_ONCE` times in a row (a
 *   call that then gets through starts the count again), then after a backoff each time,
 *   until the deadline. A partition moving answers `moved` from both nodes for a moment;
 *   a call throws `Moved` only when the nodes still disagree at its deadline.
 * - `tryagain`, an owner that cannot be reached, a node that closed saying `unavailable`:
 *   wait (`retry_after_ms`, or a backoff), refresh, resend, until the deadline.
 * - Outcome unknown: resend at most `MAX_UNKNOWN_RESENDS` times, reads and adds only.
 * - `exists` on an add sent more than once: confirm. Anything else: throw.
 */
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
      if (nowS >= this.deadlineS) return { action: "raise" };
      this.moved += 1;
      if (this.moved <= MOVED_AT_ONCE) return { action: "resend", waitS: 0, hint: error.data };
      const waitS = Math.min(retryAfterS(error, this.moved - MOVED_AT_ONCE), this.deadlineS - nowS);
      return { action: "resend", waitS, hint: error.data };
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

export function addedResult(taskId: string, stored: Record<string, unknown>): Record<string, unknown> {
  const result: Record<string, unknown> = { id: taskId, at: stored.at };
  for (const key of ["cycle", "slot"]) if (key in stored) result[key] = stored[key];
  return result;
}

export function nowS(): number {
  return performance.now() / 1000;
}
