/**
 * `Client`: one server, one connection, any number of calls in flight on it.
 *
 * Retries, as the Python client decides (delaywheel_client/connection.py): a call that
 * could not be sent at all (the connection refused, lost before writing) is sent again on
 * a new connection, up to `retries` times, backing off from 50 ms doubling to 1 s. A call
 * that was sent but whose reply never came may have been applied, so only the read-only
 * methods are sent again; any other throws `ConnectionFailed` with `maybeApplied` true.
 * When the server said why it closed (`ServerClosed`), or TLS or the token was refused,
 * the call throws at once. Give `add` an `id` to make it safe to repeat yourself: a
 * second add of the same id throws `Exists`.
 */

import { Commands, READ_ONLY_METHODS } from "./commands.js";
import { Connection, DEFAULT_HOST, DEFAULT_PORT, isPermanent, type TlsOption } from "./connection.js";
import { ConnectionFailed, ServerClosed } from "./errors.js";

export interface ClientOptions {
  host?: string;
  port?: number;
  /** The server's `--token`: sent as `auth` first on each new connection. */
  token?: string;
  /** `true`, or `tls.connect` options (`ca`, `cert`, `key` as PEM contents, `servername`). */
  tls?: TlsOption;
  /** How long a reply may take (a blocking `reserve` adds its own wait). Default 10 s. */
  timeoutS?: number;
  /** How long connecting may take. Default 5 s. */
  connectTimeoutS?: number;
  /** How many times a call that may be sent again is retried. Default 3. */
  retries?: number;
}

const RETRY_BASE_S = 0.05;
const RETRY_CAP_S = 1.0;

export function sleep(seconds: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, seconds * 1000));
}

/** Backoff before retry number `attempt` (0-based): 50 ms doubling to 1 s. */
export function retryDelayS(attempt: number): number {
  return Math.min(RETRY_BASE_S * 2 ** attempt, RETRY_CAP_S);
}

/** `delaywheel://[token@]host[:port]` or `host[:port]` (or `[v6]:port`) -> host, port, token. */
export function parseUrl(url: string): { host: string; port: number; token: string | undefined } {
  const text = url.includes("://") ? url : `delaywheel://${url}`;
  let parsed: URL;
  try {
    parsed = new URL(text);
  } catch {
    throw new TypeError(`not a delaywheel URL (delaywheel://[token@]host:port): ${JSON.stringify(url)}`);
  }
  if (parsed.protocol !== "delaywheel:") {
    throw new TypeError(`not a delaywheel URL (delaywheel://[token@]host:port): ${JSON.stringify(url)}`);
  }
  const port = parsed.port === "" ? DEFAULT_PORT : Number(parsed.port);
  const host = parsed.hostname.replace(/^\[(.*)\]$/, "$1") || DEFAULT_HOST;
  // delaywheel://TOKEN@host, or Redis-style delaywheel://:TOKEN@host.
  const raw = parsed.password !== "" ? parsed.password : parsed.username;
  return { host, port, token: raw !== "" ? decodeURIComponent(raw) : undefined };
}

export class Client extends Commands {
  readonly host: string;
  readonly port: number;
  readonly timeoutS: number;
  readonly retries: number;
  private readonly connection: Connection;

  /** `new Client()` (127.0.0.1:3450), `new Client("delaywheel://token@host:3450")`,
   * `new Client({host, port, token, tls})`, or a URL and options. */
  constructor(url?: string | ClientOptions, options: ClientOptions = {}) {
    super();
    const fromUrl = typeof url === "string" ? parseUrl(url) : {};
    const given = { ...fromUrl, ...(typeof url === "object" ? url : {}), ...options };
    this.host = given.host ?? DEFAULT_HOST;
    this.port = given.port ?? DEFAULT_PORT;
    if (!Number.isInteger(this.port) || this.port < 0 || this.port > 65535) {
      throw new RangeError(`port must be an integer from 0 to 65535, got ${JSON.stringify(given.port)}`);
    }
    this.timeoutS = given.timeoutS ?? 10;
    this.retries = given.retries ?? 3;
    this.connection = new Connection({
      host: this.host,
      port: this.port,
      token: given.token,
      tls: given.tls,
      connectTimeoutS: given.connectTimeoutS ?? 5,
    });
  }

  /** `host:port`. */
  get address(): string {
    return this.connection.address;
  }

  /** How many calls wait for their reply on the connection. */
  get inFlight(): number {
    return this.connection.inFlight;
  }

  protected async send(method: string, params: unknown[], waitS = 0): Promise<unknown> {
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.connection.request(method, params, this.timeoutS + waitS);
      } catch (exc) {
        if (!(exc instanceof ConnectionFailed) || exc instanceof ServerClosed || isPermanent(exc)) throw exc;
        const mayResend = !exc.maybeApplied || READ_ONLY_METHODS.has(method);
        if (!mayResend || attempt >= this.retries) throw exc;
        await sleep(retryDelayS(attempt));
      }
    }
  }

  /** Close the connection; calls in flight fail with `ConnectionFailed`. */
  close(): void {
    this.connection.close();
  }
}
