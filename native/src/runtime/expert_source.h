// Where the MoE layers get their experts' weights from.
//
// The model asks for the experts one layer needs, uses them, then releases them. The resident
// source below reads every expert file into memory at start; an SSD-streaming cache can replace
// it behind the same interface (fetch missing experts on acquire, unpin them on release).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "format/host_tensor.h"
#include "format/model_dir.h"
#include "platform/file.h"

namespace redwing {

struct ExpertMatrices {
  HostQuantMatrix gate, up, down;
};

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  // The matrices of the listed experts of `layer`, in the same order. They stay valid until
  // release(layer) is called; the model releases a layer before acquiring the next one.
  virtual std::vector<ExpertMatrices> acquire(int layer, std::span<const int32_t> experts) = 0;
  virtual void release(int layer) = 0;
};

// Reads each MoE layer's expert file fully into an aligned buffer when constructed.
class ResidentExpertSource final : public ExpertSource {
 public:
  // Throws FormatError / platform::FileError naming the file.
  explicit ResidentExpertSource(const ModelDir& dir);

  std::vector<ExpertMatrices> acquire(int layer, std::span<const int32_t> experts) override;
  void release(int layer) override {}
  uint64_t bytes() const { return bytes_; }

 private:
  struct Layer {
    ExpertLayerInfo info;
    std::string path;
    platform::AlignedBytes data;
  };
  std::map<int, Layer> layers_;
  uint64_t bytes_ = 0;
};

}  // namespace redwing
