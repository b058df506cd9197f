// "Am I the last workgroup of this dispatch to finish?" for kernels whose last workgroup works on
// what every workgroup wrote (router.comp, qmatvec_norms.comp; qmatvec_heads.comp asks it per
// head; attention_partial.comp keeps its own per-head form). Once a workgroup's writes are
// visible device-wide, one thread adds it to its 32-bit arrival counter; the one that brings it
// to the number of workgroups counted there resets it to 0 for the next dispatch and goes on,
// having made the others' writes visible to itself. The including kernel declares a coherent
// `counters` buffer and calls it from every thread.

shared uint arrival_last;

// `groups` workgroups count themselves on `counter`.
bool last_of_arrivals(uint counter, uint groups) {
  memoryBarrierBuffer();
  barrier();
  if (gl_LocalInvocationID.x == 0u) {
    const uint before = atomicAdd(counters[counter], 1u);
    arrival_last = before == groups - 1u ? 1u : 0u;
    if (arrival_last != 0u) atomicExchange(counters[counter], 0u);
  }
  barrier();
  if (arrival_last == 0u) return false;  // uniform over the workgroup
  memoryBarrierBuffer();  // the other workgroups' writes, as their atomics published them
  return true;
}

// Every workgroup of a token's z-slice counts itself on `counter`.
bool last_to_arrive(uint counter) {
  return last_of_arrivals(counter, gl_NumWorkGroups.x * gl_NumWorkGroups.y);
}
