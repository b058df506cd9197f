import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { createAppProtocolHandler } from "./protocol.ts";
import { CONTENT_SECURITY_POLICY } from "./security.ts";

const base = mkdtempSync(join(tmpdir(), "redwing-protocol-"));
const root = join(base, "dist");
mkdirSync(join(root, "assets"), { recursive: true });
writeFileSync(
  join(root, "index.html"),
  '<!doctype html><html><head><script type="module" src="./assets/app.js"></script></head></html>',
);
writeFileSync(join(root, "assets", "app.js"), "console.log(1)");
// A file next to the root that traversal must not reach.
writeFileSync(join(base, "secret.txt"), "secret");
afterAll(() => rmSync(base, { recursive: true, force: true }));

const handle = createAppProtocolHandler(root);
const get = (url: string, method = "GET") => handle(new Request(url, { method }));

describe("app protocol", () => {
  it("serves index.html with the CSP header and meta", async () => {
    const response = await get("app://redwing/");
    expect(response.status).toBe(200);
    expect(response.headers.get("content-security-policy")).toBe(CONTENT_SECURITY_POLICY);
    expect(response.headers.get("x-content-type-options")).toBe("nosniff");
    expect(response.headers.get("content-type")).toMatch(/^text\/html/);
    const html = await response.text();
    expect(html).toContain('http-equiv="Content-Security-Policy"');
    expect(html).toContain("./assets/app.js");
  });

  it("serves assets byte for byte with their type", async () => {
    const response = await get("app://redwing/assets/app.js");
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toMatch(/^text\/javascript/);
    expect(await response.text()).toBe("console.log(1)");
  });

  it("answers 404 for a missing file and 403 for traversal or another host", async () => {
    expect((await get("app://redwing/nope.js")).status).toBe(404);
    const traversal = await get("app://redwing/..%2fsecret.txt");
    expect(traversal.status).toBe(403);
    expect(await traversal.text()).not.toContain("secret");
    expect((await get("app://other/index.html")).status).toBe(403);
    // Errors carry the CSP too.
    expect(traversal.headers.get("content-security-policy")).toBe(CONTENT_SECURITY_POLICY);
  });

  it("is read-only", async () => {
    expect((await get("app://redwing/index.html", "POST")).status).toBe(405);
    const head = await get("app://redwing/index.html", "HEAD");
    expect(head.status).toBe(200);
    expect(await head.text()).toBe("");
  });
});
