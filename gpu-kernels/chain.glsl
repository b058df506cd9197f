// Dependent dispatches without a pipeline barrier (docs/gpu.md, "Twenty-third round"): where
// the device layer allows it (DeviceInfo::dispatch_chain), the backend records a dependent step
// of the decode chain with no barrier before it; instead each workgroup of the later dispatch
// waits in chain_wait() until every workgroup of the step before it has counted itself done in
// chain_signal(). A barrier drains the GPU before the next dispatch starts; this way the next
// dispatch's workgroups are launched while the last ones of the step before still run, and can
// have their weight loads in flight (chain_prefetch callers) before their input is ready.
//
// Why it cannot deadlock: the backend chains only dispatches recorded in one queue, whose
// workgroups the GPU launches in recording order, so every workgroup a waiter waits for has been
// launched before it and runs to its end. Where that promise does not hold, the wait gives up
// after kChainSpins polls, counts the failure in counter 0 (the host checks it after each
// flush and turns chaining off) and goes on.
//
// The including kernel includes this file before its push-constant block, which ends with
// CHAIN_PARAMS at byte offset 112 (the backend writes them there: gpu_backend.cpp's
// ChainFields), and passes those fields to the calls; the counters are binding 12 of every
// chained kernel (the backend binds them there). Whatever a chained kernel reads that an
// earlier step wrote is declared coherent, so that no load hits a cache line older than the
// wait. Counters grow monotonically: the host
// knows how many workgroups it has recorded on each, so a wait's target is that running total
// (compared modulo 2^32).

#define CHAIN_PARAMS                                                                       \
  layout(offset = 112) uint chain_wait; /* counter to wait on, 0 for none */                \
  uint chain_target;                    /* its running total once the step before is done */ \
  uint chain_signal;                    /* counter this dispatch's workgroups add to, 0: none */ \
  uint chain_prefetch;                  /* 1: load the first weights before the wait */

layout(std430, set = 0, binding = 12) coherent volatile buffer ChainCounters {
  uint chain_counters[];
};

const uint kChainSpins = 1u << 22;

// Every thread of the workgroup calls it before reading what the step before wrote.
void chain_wait(uint counter, uint target) {
  if (counter == 0u) return;  // uniform
  if (gl_LocalInvocationIndex == 0u) {
    uint spins = 0u;
    while (int(chain_counters[counter] - target) < 0) {
      if (++spins == kChainSpins) {
        atomicAdd(chain_counters[0], 1u);
        break;
      }
    }
  }
  barrier();
  memoryBarrierBuffer();
}

// Every thread of the workgroup calls it after its last write (and every workgroup must reach
// it exactly once: the host counts them).
void chain_signal(uint counter) {
  if (counter == 0u) return;  // uniform
  memoryBarrierBuffer();
  barrier();
  if (gl_LocalInvocationIndex == 0u) atomicAdd(chain_counters[counter], 1u);
}
