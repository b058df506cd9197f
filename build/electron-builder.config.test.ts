/**
 * The packaging config, checked without packaging (that needs Electron's binaries, downloaded by
 * electron-builder): electron-builder's own loader reads it, its JSON schema (with the ajv it
 * uses) accepts it, and the release requirements hold: macOS arm64 dmg with hardened runtime and
 * minimal entitlements, the engine in extraResources and signed, Linux AppImage and deb.
 */
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const CONFIG = "build/electron-builder.config.mjs";
const require = createRequire(import.meta.url);

/** Entitlements the app may have, each with the reason it needs it (see the plist's comment). */
const ALLOWED_ENTITLEMENTS: Record<string, string> = {
  "com.apple.security.cs.allow-jit": "V8 compiles JavaScript into MAP_JIT memory",
};

interface Target {
  target: string;
  arch?: string[];
}
interface Config {
  appId: string;
  productName: string;
  asar: boolean;
  /** electron-builder's loader normalizes patterns to `{ filter }` sets. */
  files: Array<string | { filter: string[] }>;
  extraMetadata: { main: string };
  extraResources: Array<{ from: string; to: string }>;
  electronFuses: Record<string, boolean>;
  mac: {
    target: Target[];
    category: string;
    hardenedRuntime: boolean;
    gatekeeperAssess: boolean;
    entitlements: string;
    entitlementsInherit: string;
    binaries: string[];
    notarize: boolean;
  };
  linux: { target: Target[]; category: string; maintainer: string; executableName: string };
  deb: { depends: string[] };
}

/** Loads the config the way `electron-builder --config` does. */
async function loadWithElectronBuilder(): Promise<Config> {
  const { getConfig } = require("app-builder-lib/out/util/config/config.js") as {
    getConfig(projectDir: string, configPath: string): Promise<Config>;
  };
  return getConfig(ROOT, CONFIG);
}

/**
 * The keys of a plist holding one flat `<dict>` of boolean entitlements; throws on anything else
 * (so a malformed file or a non-boolean value fails the test).
 */
function entitlementKeys(xml: string): string[] {
  const body = xml
    .replace(/<!--[\s\S]*?-->/g, "")
    .replace(/<\?xml[^>]*\?>/, "")
    .replace(/<!DOCTYPE[^>]*>/, "")
    .trim();
  const m = /^<plist version="1\.0">\s*<dict>([\s\S]*)<\/dict>\s*<\/plist>$/.exec(body);
  if (!m) throw new Error("not a plist with one top-level <dict>");
  const entries = m[1]!.trim();
  const keys: string[] = [];
  const entry = /\s*<key>([^<]+)<\/key>\s*<true\/>\s*/y;
  let at = 0;
  while (at < entries.length) {
    entry.lastIndex = at;
    const e = entry.exec(entries);
    if (!e) throw new Error(`unexpected plist content: ${entries.slice(at, at + 60)}`);
    keys.push(e[1]!);
    at = entry.lastIndex;
  }
  return keys;
}

describe("electron-builder config", async () => {
  const config = await loadWithElectronBuilder();

  it("is valid for electron-builder (its validator and its JSON schema)", async () => {
    const { validateConfiguration } = require("app-builder-lib/out/util/config/config.js") as {
      validateConfiguration(c: unknown, log: { isEnabled: boolean }): Promise<void>;
    };
    // It normalizes what it validates (files become {filter}): give it a copy.
    await validateConfiguration(structuredClone(config), { isEnabled: false });

    // The same schema with the ajv electron-builder resolves (it ships with app-builder-lib).
    const schema = JSON.parse(
      readFileSync(require.resolve("app-builder-lib/scheme.json"), "utf8"),
    ) as object;
    const ajvPath = require.resolve("ajv", {
      paths: [dirname(require.resolve("app-builder-lib/out/util/config/schemaValidator.js"))],
    });
    const Ajv = (require(ajvPath) as { default: new (o: object) => AjvLike }).default;
    interface AjvLike {
      compile(s: object): ((d: unknown) => boolean) & { errors?: unknown };
    }
    const validate = new Ajv({ allErrors: true, strict: false }).compile(schema);
    expect(validate(structuredClone(config)), JSON.stringify(validate.errors)).toBe(true);
    // The schema really checks: a misspelt option fails.
    expect(validate({ ...config, mac: { ...config.mac, hardendRuntime: true } })).toBe(false);
  });

  it("names the app and its entry point", () => {
    expect(config.productName).toBe("Redwing");
    expect(config.appId).toMatch(/^[a-z0-9-]+(\.[a-z0-9-]+)+$/);
    expect(config.asar).toBe(true);
    expect(config.extraMetadata.main).toBe("electron/dist/main.mjs");
    const patterns = config.files.flatMap((f) => (typeof f === "string" ? [f] : f.filter));
    for (const file of ["electron/dist/main.mjs", "electron/dist/preload.cjs"]) {
      expect(patterns).toContain(file);
    }
    expect(patterns).toContain("renderer/dist/**/*");
    // Files core reads next to its sources at run time are shipped and exist.
    for (const pattern of patterns.filter((f) => f.startsWith("core/"))) {
      const path = join(ROOT, pattern.replace(/\/\*\*\/\*$/, ""));
      expect(existsSync(path), path).toBe(true);
    }
  });

  it("builds an arm64 dmg with hardened runtime, minimal entitlements and a signed engine", () => {
    expect(config.mac.target).toEqual([{ target: "dmg", arch: ["arm64"] }]);
    expect(config.mac.hardenedRuntime).toBe(true);
    expect(config.mac.gatekeeperAssess).toBe(false);
    expect(config.mac.category).toMatch(/^public\.app-category\./);
    expect(typeof config.mac.notarize).toBe("boolean");
    for (const file of [config.mac.entitlements, config.mac.entitlementsInherit]) {
      const keys = entitlementKeys(readFileSync(join(ROOT, file), "utf8"));
      expect(keys.length).toBeGreaterThan(0);
      for (const key of keys) expect(Object.keys(ALLOWED_ENTITLEMENTS), key).toContain(key);
    }
    for (const resource of config.extraResources) {
      expect(config.mac.binaries).toContain(`Contents/Resources/${resource.to}`);
    }
  });

  it("rejects a plist with an unexpected entitlement or shape", () => {
    const plist = (inner: string) =>
      `<?xml version="1.0"?><plist version="1.0"><dict>${inner}</dict></plist>`;
    expect(entitlementKeys(plist("<key>a</key><true/>"))).toEqual(["a"]);
    expect(() => entitlementKeys(plist("<key>a</key><string>x</string>"))).toThrow();
    expect(() => entitlementKeys("<plist><array/></plist>")).toThrow();
  });

  it("ships the engine binaries in resources/bin", () => {
    expect(config.extraResources).toEqual([
      { from: "native/build/redwing-service", to: "bin/redwing-service" },
      { from: "native/build/redwing-engine", to: "bin/redwing-engine" },
    ]);
    // After a native build (npm run setup) they must be there, executable.
    if (existsSync(join(ROOT, "native", "build", "CMakeCache.txt"))) {
      for (const { from } of config.extraResources) {
        const stat = statSync(join(ROOT, from));
        expect(stat.isFile(), from).toBe(true);
        expect(stat.mode & 0o111, from).not.toBe(0);
      }
    }
  });

  it("hardens the packaged binary with fuses", () => {
    expect(config.electronFuses).toMatchObject({
      runAsNode: false,
      enableNodeOptionsEnvironmentVariable: false,
      enableNodeCliInspectArguments: false,
      onlyLoadAppFromAsar: true,
      grantFileProtocolExtraPrivileges: false,
    });
  });

  it("builds x64 AppImage and deb for Linux with the engine's libraries as dependencies", () => {
    expect(config.linux.target).toEqual([
      { target: "AppImage", arch: ["x64"] },
      { target: "deb", arch: ["x64"] },
    ]);
    expect(config.linux.category).toBe("Development");
    expect(config.linux.maintainer).toMatch(/<[^@\s]+@[^>\s]+>/);
    expect(config.linux.executableName).not.toBe("redwing"); // the CLI's name
    for (const dep of ["libnss3", "libgtk-3-0", "libstdc++6"]) {
      expect(config.deb.depends).toContain(dep);
    }
  });

  it("turns notarization on only with credentials in the environment", () => {
    const load = (env: Record<string, string>) => {
      const script = `import(${JSON.stringify(join(ROOT, CONFIG))}).then(m => process.stdout.write(String(m.default.mac.notarize)))`;
      const clean = Object.fromEntries(
        Object.entries(process.env).filter(([k]) => !k.startsWith("APPLE_")),
      );
      const result = spawnSync(process.execPath, ["-e", script], {
        env: { ...clean, ...env },
        encoding: "utf8",
      });
      return result.stdout;
    };
    expect(load({})).toBe("false");
    expect(load({ APPLE_API_KEY: "k.p8", APPLE_API_KEY_ID: "id", APPLE_API_ISSUER: "i" })).toBe(
      "true",
    );
    expect(load({ APPLE_ID: "a@b.c", APPLE_TEAM_ID: "T" })).toBe("false"); // password missing
  });

  it("is accepted by the electron-builder command line", () => {
    const cli = join(ROOT, "node_modules", "electron-builder", "cli.js");
    const result = spawnSync(process.execPath, [cli, "--help"], { encoding: "utf8" });
    expect(result.status, result.stderr).toBe(0);
    expect(result.stdout).toContain("--config");
  });
});
