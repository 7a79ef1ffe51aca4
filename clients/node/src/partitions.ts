/**
 * The partition rule, the same as the server's and the Python client's
 * (delaywheel_client/partitions.py; docs/protocol.md, "Several nodes: partitions"):
 * a task's partition is `crc32(key as UTF-8) % partitions`, CRC-32 as zlib has it,
 * unsigned. The key is the id, except for an id of a schedule's occurrence form
 * `s:{X}:{digits}` (ASCII digits, optionally `.` and more digits), which hashes `X`, so
 * a schedule and its occurrences share a partition. `X` runs to the last colon:
 * `s:a:b:123` hashes `a:b`; `s:x:` and `s:x:12a` hash the whole id.
 */

const CRC_TABLE: Uint32Array = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    table[n] = c >>> 0;
  }
  return table;
})();

/** CRC-32 (zlib's, unsigned) of `bytes`. */
export function crc32(bytes: Uint8Array): number {
  let crc = 0xffffffff;
  for (const byte of bytes) crc = CRC_TABLE[(crc ^ byte) & 0xff]! ^ (crc >>> 8);
  return (crc ^ 0xffffffff) >>> 0;
}

const OCCURRENCE_PREFIX = "s:";
const ASCII_DIGITS = /^[0-9]+$/;

/** What the partition of `taskId` is hashed from: the id, or a schedule's id for its
 * record and its occurrences. */
export function partitionKey(taskId: string): string {
  if (!taskId.startsWith(OCCURRENCE_PREFIX)) return taskId;
  const rest = taskId.slice(OCCURRENCE_PREFIX.length);
  const colon = rest.lastIndexOf(":");
  if (colon < 0) return taskId;
  const stamp = rest.slice(colon + 1);
  const dot = stamp.indexOf(".");
  const seconds = dot < 0 ? stamp : stamp.slice(0, dot);
  const fraction = dot < 0 ? null : stamp.slice(dot + 1);
  if (!ASCII_DIGITS.test(seconds) || (fraction !== null && !ASCII_DIGITS.test(fraction))) {
    return taskId;
  }
  return rest.slice(0, colon);
}

/** The partition of `taskId` in a keyspace of `partitions` (the contract). */
export function partitionOf(taskId: string, partitions: number): number {
  return crc32(Buffer.from(partitionKey(taskId), "utf8")) % partitions;
}
