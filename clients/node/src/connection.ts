/**
 * One connection to one server: a TCP (or TLS) socket carrying MessagePack-RPC
 * (docs/protocol.md, "Transport and framing"), with any number of requests in flight.
 *
 * How it works. Each request gets the next msgid and a pending entry; the read loop
 * decodes the socket's bytes as a stream of messages and settles the entry its reply
 * names, so replies may come in any order (a blocking `reserve` is answered late).
 * Requests written in one turn of the event loop go out in one write (the socket is
 * corked until the next tick). The connection opens on the first request, sends `auth`
 * first when it has a token, and opens again on the request after a lost one: the
 * `Client` retries (connection.ts says what was sent; client.ts decides).
 */

import * as net from "node:net";
import * as tls from "node:tls";
import { Decoder, Encoder } from "@msgpack/msgpack";

import { ConnectionFailed, DelaywheelError, ServerClosed, errorFromReply } from "./errors.js";

export const DEFAULT_HOST = "127.0.0.1";
export const DEFAULT_PORT = 3450;

const REQUEST = 0;
const RESPONSE = 1;
const NOTIFICATION = 2;
const MAX_MSGID = 0xffffffff;

/** TLS settings: `true` for the system's CAs, or Node's `tls.connect` options
 * (`ca`, `cert`, `key` as PEM contents, `servername`, ...). */
export type TlsOption = boolean | tls.ConnectionOptions;

export interface ConnectionOptions {
  host: string;
  port: number;
  token?: string | undefined;
  tls?: TlsOption | undefined;
  connectTimeoutS: number;
}

// One socket and the requests written on it: a lost socket fails its own requests only.
interface Wire {
  socket: net.Socket;
  pending: Map<number, Pending>;
  corked: boolean;
}

interface Pending {
  resolve: (result: unknown) => void;
  reject: (error: DelaywheelError) => void;
  timer: NodeJS.Timeout | undefined;
}

// Errors a retry would meet again (a certificate that does not verify, a wrong token):
// the client does not retry them.
const permanentErrors = new WeakSet<Error>();

export function isPermanent(error: Error): boolean {
  return permanentErrors.has(error);
}

// One codec per process is enough for encoding (synchronous); each connection's read
// loop has its own Decoder, which keeps its place in a message across chunks.
const encoder = new Encoder({ ignoreUndefined: true });

export class Connection {
  readonly address: string;
  private wire: Wire | undefined;
  private opening: Promise<Wire> | undefined;
  private msgid = 0;
  private closed = false;

  constructor(private readonly options: ConnectionOptions) {
    this.address = `${options.host}:${options.port}`;
  }

  /** How many requests wait for their reply. */
  get inFlight(): number {
    return this.wire?.pending.size ?? 0;
  }

  /**
   * Send `method(params)` and resolve with its result (or reject with the server's error,
   * or `ConnectionFailed`: `maybeApplied` says whether the request had been written).
   * `timeoutS` bounds the wait for the reply; 0 waits as long as the connection lives.
   */
  request(method: string, params: unknown[], timeoutS: number): Promise<unknown> {
    const wire = this.wire;
    if (wire !== undefined && !wire.socket.destroyed) return this.send(wire, method, params, timeoutS);
    return this.open().then((opened) => this.send(opened, method, params, timeoutS));
  }

  /** Close the connection; requests in flight fail with `ConnectionFailed`. */
  close(): void {
    this.closed = true;
    this.wire?.socket.destroy();
  }

  private send(wire: Wire, method: string, params: unknown[], timeoutS: number): Promise<unknown> {
    const socket = wire.socket;
    if (socket.destroyed || wire !== this.wire) {
      return Promise.reject(new ConnectionFailed(`${this.address}: connection lost before sending ${method}`));
    }
    let bytes: Uint8Array;
    const msgid = this.msgid;
    this.msgid = msgid >= MAX_MSGID ? 0 : msgid + 1;
    try {
      bytes = encoder.encode([REQUEST, msgid, method, params]);
    } catch (exc) {
      // A value MessagePack cannot carry (a function, a bigint, a symbol): nothing was sent.
      return Promise.reject(
        new DelaywheelError(`cannot encode the params of ${method}: ${(exc as Error).message}`, "bad_request"),
      );
    }
    return new Promise((resolve, reject) => {
      const entry: Pending = { resolve, reject, timer: undefined };
      if (timeoutS > 0) {
        entry.timer = setTimeout(() => {
          // Replies come in order behind the late one: the connection is given up whole.
          this.lost(wire, `no reply to ${method} within ${timeoutS} s`);
        }, timeoutS * 1000);
      }
      wire.pending.set(msgid, entry);
      if (!wire.corked) {
        wire.corked = true;
        socket.cork();
        process.nextTick(() => {
          wire.corked = false;
          socket.uncork();
        });
      }
      socket.write(bytes);
    });
  }

  private open(): Promise<Wire> {
    if (this.wire !== undefined && !this.wire.socket.destroyed) return Promise.resolve(this.wire);
    if (this.closed) {
      const closed = new ConnectionFailed(`${this.address}: the client is closed`);
      permanentErrors.add(closed);
      return Promise.reject(closed);
    }
    this.opening ??= this.connect().finally(() => {
      this.opening = undefined;
    });
    return this.opening;
  }

  private async connect(): Promise<Wire> {
    const socket = await this.dial();
    const wire: Wire = { socket, pending: new Map(), corked: false };
    this.wire = wire;
    this.readLoop(wire);
    if (this.options.token !== undefined) {
      try {
        await this.send(wire, "auth", [this.options.token], this.options.connectTimeoutS);
      } catch (exc) {
        socket.destroy();
        if (exc instanceof DelaywheelError && !(exc instanceof ConnectionFailed)) permanentErrors.add(exc);
        throw exc;
      }
    }
    return wire;
  }

  private dial(): Promise<net.Socket> {
    const { host, port } = this.options;
    const useTls = this.options.tls !== undefined && this.options.tls !== false;
    return new Promise((resolve, reject) => {
      const extra = typeof this.options.tls === "object" ? this.options.tls : {};
      const socket = useTls
        ? tls.connect({ ...extra, host, port, ...(net.isIP(host) ? {} : { servername: extra.servername ?? host }) })
        : net.connect({ host, port });
      const ready = useTls ? "secureConnect" : "connect";
      const timer = setTimeout(() => {
        socket.destroy();
        reject(new ConnectionFailed(`${this.address}: no connection within ${this.options.connectTimeoutS} s`));
      }, this.options.connectTimeoutS * 1000);
      const onError = (error: Error) => {
        clearTimeout(timer);
        const failed = new ConnectionFailed(`${this.address}: cannot connect: ${error.message}`);
        // A handshake the server refused, or a certificate that does not verify, would fail again.
        if (useTls && ("reason" in error || /certificate|SSL|TLS|handshake/i.test(error.message))) {
          permanentErrors.add(failed);
        }
        reject(failed);
      };
      socket.once("error", onError);
      socket.once(ready, () => {
        clearTimeout(timer);
        socket.off("error", onError);
        socket.setNoDelay(true);
        resolve(socket);
      });
    });
  }

  private readLoop(wire: Wire): void {
    const socket = wire.socket;
    const decoder = new Decoder();
    let reason = "closed by the server";
    let closedBy: [string, string] | undefined;
    // The loop's own errors (a reset, undecodable bytes) end it; none escapes.
    socket.on("error", (error) => {
      reason = error.message;
    });
    void (async () => {
      try {
        for await (const message of decoder.decodeStream(chunksOf(socket))) {
          const said = this.onMessage(wire, message);
          if (said !== undefined) closedBy = said;
        }
      } catch (exc) {
        reason = (exc as Error).message;
      } finally {
        this.lost(wire, reason, closedBy);
      }
    })();
  }

  /** Settle the request a response names; a notification's `[code, message]` is returned. */
  private onMessage(wire: Wire, message: unknown): [string, string] | undefined {
    if (!Array.isArray(message)) return undefined;
    if (message[0] === RESPONSE && message.length === 4) {
      const entry = wire.pending.get(message[1] as number);
      if (entry === undefined) return undefined;
      wire.pending.delete(message[1] as number);
      clearTimeout(entry.timer);
      if (message[2] === null || message[2] === undefined) entry.resolve(message[3]);
      else entry.reject(errorFromReply(message[2]));
    } else if (message[0] === NOTIFICATION && message[1] === "error") {
      const params = message[2];
      if (Array.isArray(params) && params.length >= 2) return [String(params[0]), String(params[1])];
      return ["internal", `malformed error notification: ${JSON.stringify(params)}`];
    }
    return undefined;
  }

  /** The socket is gone: every request written on it fails (it may have been applied). */
  private lost(wire: Wire, reason: string, closedBy?: [string, string]): void {
    if (this.wire === wire) this.wire = undefined;
    wire.socket.destroy();
    const failures = [...wire.pending.values()];
    wire.pending.clear();
    for (const entry of failures) {
      clearTimeout(entry.timer);
      entry.reject(
        closedBy !== undefined
          ? new ServerClosed(closedBy[1], closedBy[0], undefined, true)
          : new ConnectionFailed(`${this.address}: connection lost (${reason})`, undefined, undefined, true),
      );
    }
  }
}

/**
 * The socket's chunks as an async iterable, from its 'data' events: lighter than the
 * stream's own async iterator, which costs a round of stream machinery per chunk. Ends
 * when the socket closes; an error ends it too (the socket's 'error' handler notes why).
 */
async function* chunksOf(socket: net.Socket): AsyncGenerator<Buffer, void, undefined> {
  const chunks: Buffer[] = [];
  let ended = false;
  let wake: (() => void) | undefined;
  const notify = (): void => {
    const resume = wake;
    wake = undefined;
    resume?.();
  };
  socket.on("data", (chunk: Buffer) => {
    chunks.push(chunk);
    notify();
  });
  socket.once("close", () => {
    ended = true;
    notify();
  });
  for (;;) {
    const chunk = chunks.shift();
    if (chunk !== undefined) {
      yield chunk;
    } else if (ended) {
      return;
    } else {
      await new Promise<void>((resolve) => {
        wake = resolve;
      });
    }
  }
}
