/** The Redwing runtime model format (docs/format.md): schema, reader and writer. */
export * from "./dtype.ts";
export * from "./manifest.ts";
export { isPartialDirName, isSafeRelativePath } from "./paths.ts";
export {
  parseManifestText,
  readManifest,
  readModelDir,
  sha256File,
  unexpectedEntries,
  verifyModelFiles,
  type FileCheck,
  type FileStatus,
  type ModelDir,
  type ReadOptions,
  type UnexpectedEntry,
} from "./read.ts";
export {
  ExpertLayerWriter,
  ModelWriter,
  removeLeftovers,
  type ModelWriterOptions,
  type QuantizedData,
  type QuantizedMeta,
} from "./writer.ts";
