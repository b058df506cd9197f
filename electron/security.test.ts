import { join, resolve } from "node:path";
import { describe, expect, it } from "vitest";
import {
  APP_INDEX_URL,
  CONTENT_SECURITY_POLICY,
  contentTypeFor,
  isAllowedNavigation,
  isAllowedRequest,
  isAppUrl,
  isPermissionAllowed,
  isSafeExternalUrl,
  isTrustedSender,
  resolveAppFile,
  withCspMeta,
} from "./security.ts";

function directives(csp: string): Map<string, string[]> {
  return new Map(
    csp.split(";").map((part) => {
      const [name, ...values] = part.trim().split(/\s+/);
      return [name!, values];
    }),
  );
}

describe("CSP", () => {
  const d = directives(CONTENT_SECURITY_POLICY);
  it("denies by default and allows only the app's own scripts and styles", () => {
    expect(d.get("default-src")).toEqual(["'none'"]);
    expect(d.get("script-src")).toEqual(["'self'"]);
    expect(d.get("style-src")).toEqual(["'self'"]);
    expect(d.get("object-src")).toEqual(["'none'"]);
    expect(d.get("frame-ancestors")).toEqual(["'none'"]);
    expect(d.get("base-uri")).toEqual(["'none'"]);
  });
  it("has no unsafe source, wildcard or remote origin anywhere", () => {
    for (const [name, values] of d) {
      for (const value of values) {
        expect(value, name).not.toMatch(/unsafe|^\*$|^https?:|^ws/);
      }
    }
  });
});

describe("URLs", () => {
  it("knows the app's own URLs", () => {
    expect(isAppUrl(APP_INDEX_URL)).toBe(true);
    expect(isAppUrl("app://redwing/assets/index.js?x=1#y")).toBe(true);
    expect(isAppUrl("app://evil/index.html")).toBe(false);
    expect(isAppUrl("app://redwing.evil/index.html")).toBe(false);
    expect(isAppUrl("app://user:pw@redwing/")).toBe(false);
    expect(isAppUrl("app://redwing:8080/")).toBe(false);
    expect(isAppUrl("https://redwing/")).toBe(false);
    expect(isAppUrl("file:///index.html")).toBe(false);
    expect(isAppUrl("")).toBe(false);
    expect(isAppUrl(null)).toBe(false);
    expect(isAppUrl("not a url")).toBe(false);
  });

  it("navigation stays inside the app", () => {
    expect(isAllowedNavigation("app://redwing/index.html#/chat")).toBe(true);
    for (const url of [
      "https://example.com/",
      "http://127.0.0.1:8080/",
      "file:///etc/passwd",
      "javascript:alert(1)",
      "data:text/html,<script>1</script>",
      "about:blank",
      "app://other/index.html",
    ]) {
      expect(isAllowedNavigation(url), url).toBe(false);
    }
  });

  it("hands only http(s) links to the operating system", () => {
    expect(isSafeExternalUrl("https://huggingface.co/google/gemma-3")).toBe(true);
    expect(isSafeExternalUrl("http://127.0.0.1:8080/v1")).toBe(true);
    for (const url of [
      "file:///Applications/Calculator.app",
      "smb://host/share",
      "javascript:alert(1)",
      "vscode://file/etc/passwd",
      "ms-msdt:/id",
      "https://user:secret@example.com/",
      "app://redwing/index.html",
      "mailto:a@b.c",
      "",
    ]) {
      expect(isSafeExternalUrl(url), url).toBe(false);
    }
  });

  it("trusts IPC only from the app's page", () => {
    expect(isTrustedSender("app://redwing/index.html")).toBe(true);
    expect(isTrustedSender(null)).toBe(false);
    expect(isTrustedSender("https://example.com/")).toBe(false);
    expect(isTrustedSender("about:blank")).toBe(false);
    expect(isTrustedSender("file:///work/main/renderer/dist/index.html")).toBe(false);
  });

  it("grants only clipboard writes, only to the app", () => {
    expect(isPermissionAllowed("clipboard-sanitized-write", "app://redwing/index.html")).toBe(true);
    expect(isPermissionAllowed("clipboard-sanitized-write", "https://example.com/")).toBe(false);
    for (const p of ["media", "geolocation", "notifications", "clipboard-read", "openExternal"]) {
      expect(isPermissionAllowed(p, "app://redwing/index.html"), p).toBe(false);
    }
  });

  it("lets no request leave the app", () => {
    expect(isAllowedRequest("app://redwing/assets/a.js")).toBe(true);
    expect(isAllowedRequest("data:image/png;base64,AAAA")).toBe(true);
    expect(isAllowedRequest("devtools://devtools/bundled/inspector.html")).toBe(true);
    for (const url of [
      "https://example.com/x.png",
      "http://127.0.0.1:8080/v1/models",
      "ws://127.0.0.1:1/",
      "file:///etc/passwd",
      "app://other/x",
    ]) {
      expect(isAllowedRequest(url), url).toBe(false);
    }
  });
});

describe("resolveAppFile", () => {
  const root = resolve("/srv/renderer/dist");
  it("maps app paths under the root, / to index.html", () => {
    expect(resolveAppFile(root, "app://redwing/")).toBe(join(root, "index.html"));
    expect(resolveAppFile(root, "app://redwing/index.html#/x")).toBe(join(root, "index.html"));
    expect(resolveAppFile(root, "app://redwing/assets/a%20b.js?v=1")).toBe(
      join(root, "assets", "a b.js"),
    );
  });
  it("refuses what escapes the root after decoding, odd bytes and other origins", () => {
    for (const url of [
      "app://redwing/..%2fsecret",
      "app://redwing/assets/..%2f..%2f..%2fsecret",
      "app://redwing/..%5csecret",
      "app://redwing/a%00.js",
      "app://redwing/%E0%A4%A",
      "app://other/index.html",
      "https://redwing/index.html",
    ]) {
      expect(resolveAppFile(root, url), url).toBeNull();
    }
  });
  it("keeps dot segments the URL parser resolves inside the root", () => {
    // The URL parser already folds `..` and `%2e%2e` segments at the root into `/`.
    expect(resolveAppFile(root, "app://redwing/../secret")).toBe(join(root, "secret"));
    expect(resolveAppFile(root, "app://redwing/assets/%2e%2e/%2e%2e/secret")).toBe(
      join(root, "secret"),
    );
  });
});

describe("responses", () => {
  it("types files and never sniffs unknown ones as scripts", () => {
    expect(contentTypeFor("/a/index.html")).toMatch(/^text\/html/);
    expect(contentTypeFor("/a/x.JS")).toMatch(/^text\/javascript/);
    expect(contentTypeFor("/a/x.css")).toMatch(/^text\/css/);
    expect(contentTypeFor("/a/x.woff2")).toBe("font/woff2");
    expect(contentTypeFor("/a/noext")).toBe("application/octet-stream");
  });
  it("adds the CSP meta to a page without one, once", () => {
    const page = "<!doctype html><html><head><title>x</title></head><body></body></html>";
    const out = withCspMeta(page);
    expect(out).toContain(`<head><meta http-equiv="Content-Security-Policy" content="`);
    expect(out).toContain(CONTENT_SECURITY_POLICY);
    expect(withCspMeta(out)).toBe(out);
  });
});
