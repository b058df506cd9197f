import { describe, expect, it } from "vitest";
import { inOrderAnnouncer } from "./in-order.ts";

/** An announcer whose readings the test finishes by hand, in the order it picks. */
function announcer(): {
  announce: () => void;
  finish: (i: number, value: string) => void;
  announced: string[];
} {
  const pending: ((value: string) => void)[] = [];
  const announced: string[] = [];
  const announce = inOrderAnnouncer(
    () => new Promise<string>((resolve) => pending.push(resolve)),
    (v) => announced.push(v),
    () => {},
  );
  return { announce, finish: (i, value) => pending[i]!(value), announced };
}

const settle = () => new Promise((r) => setTimeout(r, 0));

describe("inOrderAnnouncer", () => {
  it("drops an older reading that finishes after a newer one was announced", async () => {
    const { announce, finish, announced } = announcer();
    announce(); // the start-up list: the model not loaded yet, its plan slow
    announce(); // the list after "ready"
    finish(1, "loaded");
    await settle();
    finish(0, "not loaded");
    await settle();
    expect(announced).toEqual(["loaded"]);
  });

  it("announces readings that finish in order, and an older one that finishes first", async () => {
    const { announce, finish, announced } = announcer();
    announce();
    announce();
    announce();
    finish(0, "a");
    await settle();
    finish(2, "c");
    await settle();
    finish(1, "b");
    await settle();
    expect(announced).toEqual(["a", "c"]);
  });

  it("reports a failed reading and goes on announcing", async () => {
    const errors: unknown[] = [];
    let n = 0;
    const announced: number[] = [];
    const announce = inOrderAnnouncer(
      () => (n++ === 0 ? Promise.reject(new Error("disk gone")) : Promise.resolve(n)),
      (v) => announced.push(v),
      (e) => errors.push(e),
    );
    announce();
    announce();
    await settle();
    expect((errors[0] as Error).message).toBe("disk gone");
    expect(announced).toEqual([2]);
  });
});
