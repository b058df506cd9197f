// electron-builder configuration of the Redwing desktop app:
//   npm run setup && node scripts/build-electron.mjs && npx electron-builder --config build/electron-builder.config.mjs
// (--mac on an Apple-silicon Mac with native/build built there; --linux on x86-64 Linux).
// Validated by build/electron-builder.config.test.ts against electron-builder's own schema.
//
// The engine: native/build/redwing-service and redwing-engine go to <resources>/bin; the packaged
// main process sets REDWING_NATIVE_BUILD=<resources>/bin, which core/native.ts (and so the engine
// client's findServiceBinary) already honours. From a checkout the same code finds native/build.

const env = process.env;

/**
 * Notarization runs when the credentials of one of @electron/notarize's methods are in the
 * environment (App Store Connect API key, Apple ID, or a keychain profile); a local build without
 * them is signed (when a certificate is present: CSC_LINK / CSC_NAME) but not notarized.
 */
const notarize = Boolean(
  (env.APPLE_API_KEY && env.APPLE_API_KEY_ID && env.APPLE_API_ISSUER) ||
  (env.APPLE_ID && env.APPLE_APP_SPECIFIC_PASSWORD && env.APPLE_TEAM_ID) ||
  (env.APPLE_KEYCHAIN && env.APPLE_KEYCHAIN_PROFILE),
);

/** The native executables shipped with the app. */
export const NATIVE_BINARIES = ["redwing-service", "redwing-engine"];

/** @type {import("app-builder-lib").Configuration} */
const config = {
  appId: "app.redwing.desktop",
  productName: "Redwing",
  copyright: "Copyright © Redwing contributors",
  directories: { output: "dist/electron-app", buildResources: "build" },
  // The app's entry point is the bundle; package.json keeps `main` free for the CLI.
  extraMetadata: { main: "electron/dist/main.mjs" },
  // Besides these, electron-builder always adds package.json and the production dependencies
  // (node_modules, dev dependencies never): main.mjs imports npm packages at run time.
  files: [
    "electron/dist/main.mjs",
    "electron/dist/preload.cjs",
    "electron/dist/install-worker.mjs",
    "renderer/dist/**/*",
    // Files core code reads next to itself (kept at their place: scripts/build-electron.mjs
    // rewrites import.meta.url per source): the Gemma 4 chat template, the hash worker and the
    // tokenizer worker.
    "core/models/gemma4.jinja",
    "core/chat/tokenize-worker.mjs",
    "core/install/hash-worker.mjs",
    "!**/*.map",
  ],
  asar: true,
  extraResources: NATIVE_BINARIES.map((name) => ({
    from: `native/build/${name}`,
    to: `bin/${name}`,
  })),
  // No native Node modules: nothing to rebuild against Electron's ABI.
  npmRebuild: false,
  publish: null,
  // Packaged-app hardening: the binary cannot be turned into a plain Node (ELECTRON_RUN_AS_NODE,
  // NODE_OPTIONS, --inspect), loads only its integrity-checked app.asar, file:// gets no extras.
  electronFuses: {
    runAsNode: false,
    enableCookieEncryption: true,
    enableNodeOptionsEnvironmentVariable: false,
    enableNodeCliInspectArguments: false,
    enableEmbeddedAsarIntegrityValidation: true,
    onlyLoadAppFromAsar: true,
    grantFileProtocolExtraPrivileges: false,
  },

  mac: {
    target: [{ target: "dmg", arch: ["arm64"] }],
    category: "public.app-category.developer-tools",
    minimumSystemVersion: "12.0",
    hardenedRuntime: true,
    gatekeeperAssess: false,
    entitlements: "build/entitlements.mac.plist",
    entitlementsInherit: "build/entitlements.mac.plist",
    // Signed with the app's identity and hardened runtime, so the notarized app may spawn them
    // (paths inside Redwing.app).
    binaries: NATIVE_BINARIES.map((name) => `Contents/Resources/bin/${name}`),
    notarize,
  },
  dmg: { title: "Redwing" },

  linux: {
    target: [
      { target: "AppImage", arch: ["x64"] },
      { target: "deb", arch: ["x64"] },
    ],
    category: "Development",
    // `redwing` is the CLI's name (npm bin): the desktop app gets its own.
    executableName: "redwing-desktop",
    maintainer: "Redwing contributors <redwing@users.noreply.github.com>",
    synopsis: "Run large language models on this computer",
    description:
      "Redwing runs Gemma models locally on the CPU with SSD expert streaming: chat, model downloads, tuning, live statistics and an OpenAI-compatible server.",
  },
  deb: {
    // Electron's own runtime libraries (electron-builder's default list, which `depends`
    // replaces) plus the engine's: libstdc++ and libgcc (ldd native/build/redwing-service).
    depends: [
      "libgtk-3-0",
      "libnotify4",
      "libnss3",
      "libxss1",
      "libxtst6",
      "xdg-utils",
      "libatspi2.0-0",
      "libuuid1",
      "libsecret-1-0",
      "libasound2 | libasound2t64",
      "libgbm1",
      "libstdc++6",
      "libgcc-s1",
    ],
    packageName: "redwing-desktop",
  },
};

export default config;
