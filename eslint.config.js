import js from "@eslint/js";
import tseslint from "typescript-eslint";
import reactHooks from "eslint-plugin-react-hooks";

export default tseslint.config(
  {
    ignores: [
      "node_modules/",
      "native/build*/",
      "fixtures/",
      "dist/",
      "renderer/dist/",
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
);
