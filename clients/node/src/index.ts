/**
 * delaywheel-client: the Node.js client of the delaywheel delay-queue server, over its
 * native protocol (MessagePack-RPC over TCP or TLS; docs/protocol.md).
 */

export { Client, type ClientOptions, parseUrl } from "./client.js";
export { ClusterClient, type ClusterClientOptions } from "./cluster.js";
export { PartitionMap } from "./routing.js";
export { Commands, READ_ONLY_METHODS } from "./commands.js";
export { DEFAULT_HOST, DEFAULT_PORT, type TlsOption } from "./connection.js";
export {
  BadRequest,
  Conflict,
  ConnectionFailed,
  DelaywheelError,
  Exists,
  Internal,
  Moved,
  NoMethod,
  NotFound,
  ServerClosed,
  TooLarge,
  TryAgain,
  Unauthorized,
  Unavailable,
  errorFrom,
} from "./errors.js";
export { crc32, partitionKey, partitionOf } from "./partitions.js";
export type * from "./types.js";
export { Worker, type Handler, type WorkerLogger, type WorkerOptions } from "./worker.js";
