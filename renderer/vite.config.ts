import { fileURLToPath } from "node:url";
import { defineConfig } from "vite";
import react from "@vitejs/plugin-react";
import tailwindcss from "@tailwindcss/vite";

const root = fileURLToPath(new URL(".", import.meta.url));

/**
 * The renderer is served two ways: by `redwing ui` over HTTP and by Electron from file://.
 * A relative base keeps asset URLs working in both.
 */
export default defineConfig({
  root,
  base: "./",
  plugins: [react(), tailwindcss()],
  build: {
    outDir: fileURLToPath(new URL("./dist", import.meta.url)),
    emptyOutDir: true,
    // The app is local: one chunk per route is not worth a request waterfall over file://.
    chunkSizeWarningLimit: 2000,
    // No inline scripts or data: URLs for modules: the CSP allows scripts from 'self' only.
    assetsInlineLimit: 0,
  },
  server: { host: "127.0.0.1" },
});
