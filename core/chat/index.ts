/** The text side of generation: tokenizer, chat template, detokenization, stop strings, stats. */
export * from "./backend.ts";
export * from "./detokenize.ts";
export * from "./model.ts";
export * from "./stats.ts";
export * from "./stop.ts";
export * from "./template.ts";
export * from "./text-stream.ts";
export * from "./tokenizer.ts";
