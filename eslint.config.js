import js from "@eslint/js";
import tseslint from "typescript-eslint";
import reactHooks from "eslint-plugin-react-hooks";
import { builtinModules } from "node:module";
import { dirname, relative } from "node:path";

// ---- import boundaries ---------------------------------------------------------------------------
// Test support (fakes, fixtures writers, child scripts) lives in testkit/; production code must
// never import it, nor vitest. Production is everything shipped or run by users: core/, cli/,
// electron/ and renderer/src, except the tests (*.test.ts) next to the code.
const PRODUCTION_TESTS = ["**/*.test.ts", "**/*.test.tsx"];
const TEST_SUPPORT = {
  regex: String.raw`(^|/)testkit(/|$)`,
  message: "testkit/ is test support: production code must not import it.",
};
const NO_VITEST = { name: "vitest", message: "vitest is for tests (*.test.ts) and testkit/ only." };
const escapeRegex = (text) => text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
// Dynamic import() is not seen by no-restricted-imports; esquery's regex literal cannot hold "/".
const dynamicImport = (pattern, message) => ({
  selector: `ImportExpression[source.value=/${pattern.replaceAll("/", String.raw`\x2f`)}/]`,
  message,
});

// The renderer runs in a browser (or Electron's sandboxed renderer): it imports nothing from Node.
// The core modules it shares with the main process are listed here and held to the same rule, so
// they stay importable by the renderer; anything else in core/ may use Node.
const RENDERER_SHARED_CORE = ["core/app/api.ts", "core/defaults.ts", "core/units.ts"];
const NODE_BUILTIN = String.raw`^(node:|(${builtinModules.map(escapeRegex).join("|")})(/|$))`;
const NO_NODE = {
  regex: NODE_BUILTIN,
  message: "The renderer runs in a browser: no Node built-ins here (this file is in its bundle).",
};
/** Relative imports from `file` that leave RENDERER_SHARED_CORE (a file there may import only another). */
function outsideSharedCore(file) {
  const allowed = RENDERER_SHARED_CORE.filter((other) => other !== file).map((other) => {
    const path = relative(dirname(file), other);
    return escapeRegex(path.startsWith(".") ? path : `./${path}`);
  });
  const except = allowed.length > 0 ? `(?!(${allowed.join("|")})$)` : "";
  return {
    regex: String.raw`^${except}\.`,
    message: `The renderer imports this file: it may import only packages without Node and the other modules in RENDERER_SHARED_CORE (eslint.config.js), which are held to this rule too.`,
  };
}
// From renderer/src, core/ is reachable only through RENDERER_SHARED_CORE.
const RENDERER_CORE_IMPORT = {
  regex: String.raw`^(\.\./)+(?!(${RENDERER_SHARED_CORE.map(escapeRegex).join("|")})$)core/`,
  message: `The renderer may import from core/ only the Node-free modules in RENDERER_SHARED_CORE (eslint.config.js).`,
};
const browserRules = (patterns) => ({
  "no-restricted-imports": [
    "error",
    { paths: [NO_VITEST], patterns: [TEST_SUPPORT, NO_NODE, ...patterns] },
  ],
  "no-restricted-syntax": [
    "error",
    dynamicImport(TEST_SUPPORT.regex, TEST_SUPPORT.message),
    dynamicImport(NO_NODE.regex, NO_NODE.message),
  ],
});

export default tseslint.config(
  {
    ignores: [
      "node_modules/",
      "native/build*/",
      "fixtures/",
      "dist/",
      "renderer/dist/",
      // Device-run scratch (git-ignored): bundles carried to the GPU machine.
      ".dev*/",
      "electron/dist/",
    ],
  },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: {
      globals: { process: "readonly", console: "readonly", Buffer: "readonly", URL: "readonly" },
    },
    rules: {
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_" }],
    },
  },
  // The React renderer runs in a browser (or Electron's sandboxed renderer), not Node.
  {
    files: ["renderer/src/**/*.{ts,tsx}"],
    ...reactHooks.configs.flat.recommended,
    languageOptions: {
      globals: Object.fromEntries(
        [
          "window",
          "document",
          "navigator",
          "location",
          "history",
          "localStorage",
          "sessionStorage",
          "fetch",
          "EventSource",
          "MessageEvent",
          "ResizeObserver",
          "requestAnimationFrame",
          "getComputedStyle",
          "setTimeout",
          "clearTimeout",
          "setInterval",
          "clearInterval",
          "structuredClone",
          "HTMLElement",
          "HTMLDivElement",
          "HTMLPreElement",
          "HTMLDialogElement",
          "URLSearchParams",
        ].map((name) => [name, "readonly"]),
      ),
    },
  },
  {
    files: ["core/**/*.{ts,mjs}", "cli/**/*.{ts,mjs}", "electron/**/*.{ts,mjs,cjs}"],
    ignores: [...PRODUCTION_TESTS, ...RENDERER_SHARED_CORE],
    rules: {
      "no-restricted-imports": ["error", { paths: [NO_VITEST], patterns: [TEST_SUPPORT] }],
      "no-restricted-syntax": ["error", dynamicImport(TEST_SUPPORT.regex, TEST_SUPPORT.message)],
    },
  },
  {
    files: ["renderer/src/**/*.{ts,tsx}"],
    ignores: PRODUCTION_TESTS,
    rules: browserRules([RENDERER_CORE_IMPORT]),
  },
  ...RENDERER_SHARED_CORE.map((file) => ({
    files: [file],
    rules: browserRules([outsideSharedCore(file)]),
  })),
);
