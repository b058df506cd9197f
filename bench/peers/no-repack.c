// Bench-only, loaded with LD_PRELOAD into the llama.cpp peer (bench/peers/llama-run.mjs, started
// by `npm run bench -- vs-llama-cpp --memory-limit`): makes the prebuilt llama.cpp load as its
// `--no-repack` option does (llama_model_params.use_extra_bufts = false), which node-llama-cpp's
// addon does not expose. llama.cpp finds the CPU backend's extra buffer types (repacked weight
// layouts, AMX tiles: copies of the weights in RAM) by asking the backend registry for the
// function "ggml_backend_dev_get_extra_bufts"; answering "none" leaves every weight in the plain
// CPU buffer, mapped from the file. Every other lookup goes to ggml's own function.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

typedef void *(*proc_address_fn)(void *reg, const char *name);

void *ggml_backend_reg_get_proc_address(void *reg, const char *name);

static proc_address_fn ggml_lookup(void) {
  // libggml-base.so is loaded by then (the caller, libllama, needs it), but with the addon's
  // local scope, which RTLD_NEXT does not search: ask for the loaded library by its soname.
  void *ggml = dlopen("libggml-base.so", RTLD_LAZY | RTLD_NOLOAD);
  void *found = ggml ? dlsym(ggml, "ggml_backend_reg_get_proc_address") : NULL;
  if (found == NULL) found = dlsym(RTLD_NEXT, "ggml_backend_reg_get_proc_address");
  if (found == (void *)ggml_backend_reg_get_proc_address) found = NULL;  // never this one
  return (proc_address_fn)found;
}

void *ggml_backend_reg_get_proc_address(void *reg, const char *name) {
  if (name != NULL && strcmp(name, "ggml_backend_dev_get_extra_bufts") == 0) return NULL;
  static proc_address_fn next;  // a benign race: every thread finds the same function
  if (next == NULL) next = ggml_lookup();
  return next == NULL ? NULL : next(reg, name);
}
