import { describe, expect, it } from "vitest";
import { retryDelayMs, tokenFromHash } from "./http.ts";

describe("web transport helpers", () => {
  it("reads the token from the address fragment", () => {
    expect(tokenFromHash("#token=0123456789abcdef0123456789abcdef")).toBe(
      "0123456789abcdef0123456789abcdef",
    );
    expect(tokenFromHash("token=abcdef0123")).toBe("abcdef0123");
    expect(tokenFromHash("#other=1&token=abcdef0123")).toBe("abcdef0123");
    expect(tokenFromHash("")).toBeNull();
    expect(tokenFromHash("#token=")).toBeNull();
    // Not a token: never sent anywhere as one.
    expect(tokenFromHash("#token=<script>")).toBeNull();
  });
  it("backs off reconnects up to a cap", () => {
    expect(retryDelayMs(0)).toBe(500);
    expect(retryDelayMs(1)).toBe(1000);
    expect(retryDelayMs(3)).toBe(4000);
    expect(retryDelayMs(20)).toBe(10_000);
  });
});
