import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

/** `redwing 0.1.0`, from package.json: what the tools record as a model's `created_by`. */
export function redwingVersionLabel(): string {
  try {
    const pkg = JSON.parse(
      readFileSync(fileURLToPath(new URL("../package.json", import.meta.url)), "utf8"),
    ) as { version?: string };
    return `redwing ${pkg.version ?? "unknown"}`;
  } catch {
    return "redwing";
  }
}
