// redwing-service: the decode service, run as a child process by the TypeScript engine client
// (core/engine). It speaks newline-delimited JSON on stdin/stdout (docs/protocol.md); logs go to
// stderr. It exits when stdin closes, on a shutdown request, or when its parent process dies.
//
// A separate tool rather than a `serve` subcommand of redwing-engine: its process lifetime
// (parent-death watch, model lock, long-lived state) differs from the one-shot commands, and the
// binary the client spawns stays small and independent of the engine CLI's flags.
//
//   redwing-service [--no-parent-watch]
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>

#include "platform/process.h"
#include "service/service.h"

int main(int argc, char** argv) {
  bool watch_parent = true;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-parent-watch") == 0) {
      watch_parent = false;
    } else if (std::strcmp(argv[i], "--help") == 0) {
      std::puts("usage: redwing-service [--no-parent-watch]   (protocol: docs/protocol.md)");
      return 0;
    } else {
      std::fprintf(stderr, "redwing-service: unknown argument \"%s\"\n", argv[i]);
      return 2;
    }
  }
  // A closed stdout shows up as a write error, not a signal.
  std::signal(SIGPIPE, SIG_IGN);
  // A terminal's Ctrl-C reaches the whole foreground process group: the client decides what it
  // means (e.g. cancel the generation). The service ends through the protocol, end of input, or
  // its parent's death.
  std::signal(SIGINT, SIG_IGN);
  if (watch_parent) redwing::platform::exit_with_parent();
  try {
    return redwing::service::serve_stdio();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "redwing-service: %s\n", e.what());
    return 1;
  }
}
