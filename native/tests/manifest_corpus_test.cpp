// The shared corpus of good and bad model directories (fixtures/manifest-corpus, written by
// scripts/manifest-corpus.ts): the native reader accepts exactly the good ones and refuses each
// bad one with an error naming its fault. core/format/manifest-corpus.test.ts holds the
// TypeScript reader to the same list.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "format/model_dir.h"

namespace fs = std::filesystem;

TEST_CASE("the shared manifest corpus: good directories open, bad ones are refused by name") {
  const fs::path corpus = fs::path(REDWING_FIXTURES_DIR) / "manifest-corpus";
  std::ifstream in(corpus / "cases.json");
  REQUIRE(in.good());
  const nlohmann::json cases = nlohmann::json::parse(in);
  std::set<std::string> listed, present;
  for (const auto& item : cases.items()) listed.insert(item.key());
  for (const auto& e : fs::directory_iterator(corpus))
    if (e.is_directory()) present.insert(e.path().filename().string());
  CHECK(listed == present);
  int good = 0, bad = 0;
  for (const auto& item : cases.items()) {
    const std::string name = item.key();
    const nlohmann::json& c = item.value();
    CAPTURE(name);
    std::string error;
    try {
      redwing::ModelDir::open((corpus / name).string());
    } catch (const redwing::FormatError& e) {
      error = e.what();
    }
    CAPTURE(error);
    if (c.at("valid").get<bool>()) {
      CHECK(error.empty());
      ++good;
    } else {
      CHECK(error.find(c.at("error").get<std::string>()) != std::string::npos);
      ++bad;
    }
  }
  CHECK(good > 0);
  CHECK(bad > 20);
}
