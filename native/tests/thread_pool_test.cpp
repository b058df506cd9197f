// Tests of backend/cpu/thread_pool.h: coverage of the index range, chunk alignment, exceptions,
// nesting, repeated dispatch and shutdown.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "backend/cpu/thread_pool.h"

using redwing::ThreadPool;

TEST_CASE("parallel_for covers every index exactly once, in grain-aligned chunks") {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    CHECK(pool.size() == threads);
    for (int64_t n : {0, 1, 3, 64, 1000, 4097}) {
      for (int64_t grain : {1, 4, 64, 5000}) {
        CAPTURE(threads);
        CAPTURE(n);
        CAPTURE(grain);
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::atomic<bool> misaligned{false};
        pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
          if (b % grain != 0 || b >= e || e > n) misaligned = true;
          if (e != n && (e - b) % grain != 0) misaligned = true;
          for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
        });
        CHECK_FALSE(misaligned.load());
        for (int64_t i = 0; i < n; ++i) REQUIRE(hits[i].load() == 1);
      }
    }
  }
}

TEST_CASE("chunks shrink towards the end of a loop, so the threads finish together") {
  for (int threads : {2, 4}) {
    ThreadPool pool(threads);
    for (int64_t grain : {1, 16}) {
      CAPTURE(threads);
      CAPTURE(grain);
      const int64_t n = 10000;
      std::mutex m;
      std::vector<std::pair<int64_t, int64_t>> chunks;
      pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
        std::lock_guard lock(m);
        chunks.emplace_back(b, e);
      });
      std::sort(chunks.begin(), chunks.end());  // handed out in order of their first row
      REQUIRE(chunks.size() >= 2);
      // The first takes a share of the whole loop, not a grain; then no chunk is larger than the
      // one before it, and the last two are a grain (or the rest of the rows).
      CHECK(chunks.front().second - chunks.front().first >= n / (2 * threads) - grain);
      for (size_t i = 1; i < chunks.size(); ++i)
        CHECK(chunks[i].second - chunks[i].first <= chunks[i - 1].second - chunks[i - 1].first);
      CHECK(chunks.back().second - chunks.back().first <= grain);
      CHECK(chunks[chunks.size() - 2].second - chunks[chunks.size() - 2].first <= grain);
      // Few chunks all the same: about 2 * threads per halving of the rows left.
      CHECK(chunks.size() < 200);
    }
  }
}

TEST_CASE("parallel_for uses several threads") {
  ThreadPool pool(2);
  std::atomic<int> inside{0};
  std::atomic<int> max_inside{0};
  // Each chunk waits briefly for company, so both threads are seen inside at once unless the
  // pool runs everything on one thread.
  pool.parallel_for(8, 1, [&](int64_t, int64_t) {
    const int now = inside.fetch_add(1) + 1;
    int prev = max_inside.load();
    while (now > prev && !max_inside.compare_exchange_weak(prev, now)) {
    }
    for (int i = 0; i < 2000 && max_inside.load() < 2; ++i) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    inside.fetch_sub(1);
  });
  CHECK(max_inside.load() == 2);
}

TEST_CASE("exceptions reach the caller and the pool stays usable") {
  ThreadPool pool(3);
  for (int round = 0; round < 20; ++round) {
    CHECK_THROWS_WITH_AS(pool.parallel_for(100, 1,
                                           [&](int64_t b, int64_t e) {
                                             if ((b <= 37 && 37 < e) || (b <= 80 && 80 < e)) {
                                               throw std::runtime_error("chunk failed");
                                             }
                                           }),
                         "chunk failed", std::runtime_error);
    std::atomic<int64_t> sum{0};
    pool.parallel_for(100, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sum += i;
    });
    CHECK(sum.load() == 4950);
  }
}

TEST_CASE("nested parallel_for runs inline") {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  pool.parallel_for(4, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      pool.parallel_for(10, 1, [&](int64_t b2, int64_t e2) { total += e2 - b2; });
    }
  });
  CHECK(total.load() == 40);
}

TEST_CASE("many short loops, with sleeping workers in between") {
  ThreadPool pool(2);
  pool.set_spin_us(0);  // workers block at once, so every loop exercises the wake-up path
  std::vector<float> v(256, 1.0f);
  for (int round = 0; round < 3000; ++round) {
    std::atomic<int> done{0};
    pool.parallel_for(256, 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) v[i] += 1.0f;
      done += static_cast<int>(e - b);
    });
    REQUIRE(done.load() == 256);
    if (round % 500 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (float x : v) REQUIRE(x == 3001.0f);
}

TEST_CASE("calls from several threads are serialized") {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 3; ++t) {
    callers.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        pool.parallel_for(50, 1, [&](int64_t b, int64_t e) { total += e - b; });
      }
    });
  }
  for (auto& t : callers) t.join();
  CHECK(total.load() == 3 * 200 * 50);
}

TEST_CASE("pools start and stop cleanly") {
  for (int i = 0; i < 50; ++i) {
    ThreadPool pool(4);
    if (i % 2) pool.parallel_for(10, 1, [](int64_t, int64_t) {});
  }
  CHECK(ThreadPool::default_thread_count() >= 1);
}

TEST_CASE("REDWING_SPIN_US sets the spin; a malformed value is refused") {
  setenv("REDWING_SPIN_US", "0", 1);
  {
    ThreadPool pool(2);  // blocking at once: the loop still covers every index
    std::atomic<int64_t> total{0};
    for (int round = 0; round < 50; ++round)
      pool.parallel_for(100, 1, [&](int64_t b, int64_t e) { total += e - b; });
    CHECK(total.load() == 5000);
  }
  for (const char* bad : {"-1", "ten", "5us", "2000000"}) {
    CAPTURE(bad);
    setenv("REDWING_SPIN_US", bad, 1);
    CHECK_THROWS_AS(ThreadPool(2), std::invalid_argument);
  }
  unsetenv("REDWING_SPIN_US");
}

TEST_CASE("loops run with subnormal floats flushed to zero, and the caller's mode comes back") {
  // A subnormal product: 2^-100 * 2^-30 = 2^-130, below float's smallest normal 2^-126.
  volatile float tiny = 0x1p-100f;
  volatile float factor = 0x1p-30f;
  const float outside_before = tiny * factor;
#if defined(__x86_64__) || defined(__i386__)
  REQUIRE(outside_before != 0.0f);  // the process's default mode keeps subnormals
  for (int threads : {1, 2, 4}) {
    CAPTURE(threads);
    ThreadPool pool(threads);
    std::vector<float> products(64, -1.0f);
    std::vector<float> read_back(64, -1.0f);
    volatile float subnormal = outside_before;
    pool.parallel_for(64, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        products[static_cast<size_t>(i)] = tiny * factor;           // flushed result (FTZ)
        read_back[static_cast<size_t>(i)] = subnormal + 0x1p-126f;  // input read as 0 (DAZ)
      }
    });
    for (float p : products) CHECK(p == 0.0f);
    for (float r : read_back) CHECK(r == 0x1p-126f);
    // A loop too small to leave the caller runs inline, under the same mode.
    float inline_product = -1.0f;
    pool.parallel_for(1, 1, [&](int64_t, int64_t) { inline_product = tiny * factor; });
    CHECK(inline_product == 0.0f);
    const float outside_after = tiny * factor;
    CHECK(outside_after == outside_before);
  }
#else
  MESSAGE("the subnormal mode is set only on x86; AArch64 computes subnormals at full speed");
  CHECK(outside_before != 0.0f);
#endif
}
