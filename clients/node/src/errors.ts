/**
 * Errors: one class per protocol error code, all under `DelaywheelError`, with the
 * Python client's names (delaywheel_client/errors.py). A server error reply
 * `[code, message(, data)]` becomes `errorFrom(code, message, data)`; a code this version
 * does not know still throws, as a plain `DelaywheelError` that carries it. Failures of
 * the connection itself are `ConnectionFailed` (code `"connection"`), and the server's
 * parting `[2, "error", [code, message]]` notification is `ServerClosed`, a
 * `ConnectionFailed` that carries the server's code and message.
 */

export type ErrorData = Record<string, unknown>;

export class DelaywheelError extends Error {
  /** The protocol error code (`bad_request`, `not_found`, ...). */
  code: string;
  /** The error's third element, when the server sent one: `moved`'s owner, `tryagain`'s wait. */
  data: ErrorData | undefined;

  constructor(message = "", code?: string, data?: ErrorData) {
    super(message);
    this.name = new.target.name;
    this.code = code ?? (new.target as unknown as { CODE: string }).CODE ?? "error";
    this.data = data;
  }

  static CODE = "error";

  override toString(): string {
    return this.message ? `${this.code}: ${this.message}` : this.code;
  }
}

/** Wrong params: a missing or ill-typed field, both delay and at, a value out of range. */
export class BadRequest extends DelaywheelError {
  static override CODE = "bad_request";
}
/** No task with that id (update, ack, release, touch). */
export class NotFound extends DelaywheelError {
  static override CODE = "not_found";
}
/** `add` with an id that a live task already has. */
export class Exists extends DelaywheelError {
  static override CODE = "exists";
}
/** The task's state does not allow it (ack of a task not reserved, say). */
export class Conflict extends DelaywheelError {
  static override CODE = "conflict";
}
/** A message or body over the server's limit. */
export class TooLarge extends DelaywheelError {
  static override CODE = "too_large";
}
/** The server has a token and this connection has not sent the matching one. */
export class Unauthorized extends DelaywheelError {
  static override CODE = "unauthorized";
}
/** The store could not be written: the outcome is unknown (docs/protocol.md, Durability). */
export class Unavailable extends DelaywheelError {
  static override CODE = "unavailable";
}
/** The task's partition is another node's: `data` holds `partition`, `owner`, `epoch`. */
export class Moved extends DelaywheelError {
  static override CODE = "moved";
}
/** No node owns the task's partition just now: `data` holds `partition`, `retry_after_ms`. */
export class TryAgain extends DelaywheelError {
  static override CODE = "tryagain";
}
/** The server has no method of that name. */
export class NoMethod extends DelaywheelError {
  static override CODE = "no_method";
}
/** A bug in the server; it logged it and keeps serving. */
export class Internal extends DelaywheelError {
  static override CODE = "internal";
}

/** Cannot connect, or the connection was lost; the message names host:port and the cause. */
export class ConnectionFailed extends DelaywheelError {
  static override CODE = "connection";
  /** True when the request was sent and its reply lost: a write may have been applied. */
  maybeApplied: boolean;

  constructor(message = "", code?: string, data?: ErrorData, maybeApplied = false) {
    super(message, code, data);
    this.maybeApplied = maybeApplied;
  }
}

/**
 * The server sent `[2, "error", [code, message]]` and closed the connection: `code` and
 * `message` are the server's (`too_large`, `unavailable` for too many connections, ...).
 */
export class ServerClosed extends ConnectionFailed {}

const BY_CODE: Record<string, typeof DelaywheelError> = Object.fromEntries(
  [
    BadRequest,
    NotFound,
    Exists,
    Conflict,
    TooLarge,
    Unauthorized,
    Unavailable,
    Moved,
    TryAgain,
    NoMethod,
    Internal,
  ].map((cls) => [cls.CODE, cls]),
);

/** The error for a server error `[code, message(, data)]`; unknown codes give the base class. */
export function errorFrom(code: string, message: string, data?: ErrorData): DelaywheelError {
  const cls = BY_CODE[code];
  return cls === undefined ? new DelaywheelError(message, code, data) : new cls(message, undefined, data);
}

function isPlainMap(value: unknown): value is ErrorData {
  return typeof value === "object" && value !== null && !Array.isArray(value) && !ArrayBuffer.isView(value);
}

/** `errorFrom` for an `error` as decoded off the wire, whatever its shape. */
export function errorFromReply(error: unknown): DelaywheelError {
  if (Array.isArray(error) && (error.length === 2 || error.length === 3) && typeof error[0] === "string") {
    const message = typeof error[1] === "string" ? error[1] : JSON.stringify(error[1]);
    const data = error.length === 3 && isPlainMap(error[2]) ? error[2] : undefined;
    return errorFrom(error[0], message, data);
  }
  return new Internal(`malformed error from the server: ${JSON.stringify(error)}`);
}
