/** The engine client and the decode-service protocol (docs/protocol.md). */
export * from "./client.ts";
export * from "./protocol.ts";
