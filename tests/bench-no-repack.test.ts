// bench/peers/no-repack.c, the preloaded library that runs the prebuilt llama.cpp as `--no-repack`
// does, built the way the benchmark builds it, against stand-ins laid out as in node-llama-cpp:
// a "libggml-base.so" that answers the backend lookups, and a library that needs it, opened with
// dlopen into a local scope (as node opens the addon). The lookup of the CPU backend's extra buffer
// types must come back empty; every other lookup must still reach ggml's own function.
import { spawnSync } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { buildNoRepackShim } from "../bench/vs-llama-cpp-memory.ts";

const peers = fileURLToPath(new URL("../bench/peers", import.meta.url));
const compiler = ["cc", "gcc", "clang"].find((cc) => spawnSync(cc, ["--version"]).status === 0);
const dirs: string[] = [];
afterAll(async () => {
  for (const d of dirs) await rm(d, { recursive: true, force: true });
});

const GGML = `
#include <string.h>
void *ggml_backend_reg_get_proc_address(void *reg, const char *name) {
  (void)reg;
  if (strcmp(name, "ggml_backend_dev_get_extra_bufts") == 0) return (void *)0x1234;
  if (strcmp(name, "ggml_backend_set_n_threads") == 0) return (void *)0x5678;
  return 0;
}
`;
const LLAMA = `
void *ggml_backend_reg_get_proc_address(void *reg, const char *name);
void *lookup(const char *name) { return ggml_backend_reg_get_proc_address(0, name); }
`;
const MAIN = `
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
  (void)argc;
  void *lib = dlopen(argv[1], RTLD_LAZY | RTLD_LOCAL);
  if (!lib) { fprintf(stderr, "%s\\n", dlerror()); return 1; }
  void *(*lookup)(const char *) = (void *(*)(const char *))dlsym(lib, "lookup");
  printf("%p %p %p\\n", lookup("ggml_backend_dev_get_extra_bufts"),
         lookup("ggml_backend_set_n_threads"), lookup("unknown"));
  return 0;
}
`;

describe.skipIf(!compiler)("bench/peers/no-repack.c", () => {
  it("hides the extra buffer types and passes every other lookup to ggml", async () => {
    const dir = await mkdtemp(join(tmpdir(), "redwing-no-repack-test-"));
    dirs.push(dir);
    const cc = (...args: string[]) => {
      const r = spawnSync(compiler!, args, { cwd: dir, encoding: "utf8" });
      expect(r.status, r.stderr).toBe(0);
    };
    await writeFile(join(dir, "ggml.c"), GGML);
    await writeFile(join(dir, "llama.c"), LLAMA);
    await writeFile(join(dir, "main.c"), MAIN);
    cc("-shared", "-fPIC", "-Wl,-soname,libggml-base.so", "-o", "libggml-base.so", "ggml.c");
    cc(
      "-shared",
      "-fPIC",
      "-o",
      "libllama.so",
      "llama.c",
      "-L.",
      "-lggml-base",
      "-Wl,-rpath,$ORIGIN",
    );
    cc("-o", "main", "main.c", "-ldl");
    const shim = await buildNoRepackShim(peers);
    if ("error" in shim) throw new Error(shim.error);
    dirs.push(join(shim.path, ".."));

    const run = (env: NodeJS.ProcessEnv) => {
      const r = spawnSync(join(dir, "main"), [join(dir, "libllama.so")], { encoding: "utf8", env });
      expect(r.status, r.stderr).toBe(0);
      return r.stdout.trim().split(" ");
    };
    // Without the shim, the stand-in answers both; with it, the extra buffer types are gone.
    expect(run({ ...process.env })).toEqual(["0x1234", "0x5678", "(nil)"]);
    expect(run({ ...process.env, LD_PRELOAD: shim.path })).toEqual(["(nil)", "0x5678", "(nil)"]);
  });
});
