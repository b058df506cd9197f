// Files: read-only memory maps, positioned reads and path checks.
//
// The implementation (file_posix.cpp) uses POSIX calls available on Linux and macOS. A Windows
// port adds file_win32.cpp behind the same interface; nothing else in the engine touches the
// operating system's file API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace redwing::platform {

// An I/O failure; the message names the file.
class FileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a path is, without following a final symbolic link.
enum class PathKind { missing, regular, directory, symlink, other };
PathKind path_kind(const std::string& path);
// The size of a regular file in bytes; throws FileError if it cannot be read.
uint64_t file_size(const std::string& path);

// A whole file mapped read-only into memory. Move-only; unmapped on destruction.
class MappedFile {
 public:
  static MappedFile open(const std::string& path);
  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Reads the whole file into memory now and maps it (Linux: MADV_POPULATE_READ, else a
  // read-ahead hint), so that the first pass over it does not fault page by page, from the disk
  // where the page cache lost it. A hint: errors are ignored (the pages then fault in on use).
  void populate() const;

 private:
  void reset() noexcept;
  const std::byte* data_ = nullptr;
  uint64_t size_ = 0;
  std::string path_;
};

// A file opened for positioned reads. Move-only; closed on destruction.
class ReadFile {
 public:
  static ReadFile open(const std::string& path);
  // Opens for reads that bypass the page cache where the system allows it (O_DIRECT on Linux,
  // F_NOCACHE on macOS), so streamed experts are not quietly cached twice. Falls back to
  // ordinary reads when the filesystem refuses (e.g. tmpfs); direct() says which one is used.
  // With direct I/O, destination, offset and size must be multiples of kDirectIoAlignment.
  static ReadFile open_uncached(const std::string& path);
  static constexpr uint64_t kDirectIoAlignment = 4096;
  ReadFile() = default;
  ReadFile(ReadFile&& other) noexcept;
  ReadFile& operator=(ReadFile&& other) noexcept;
  ReadFile(const ReadFile&) = delete;
  ReadFile& operator=(const ReadFile&) = delete;
  ~ReadFile();

  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }
  // Reads exactly n bytes at offset, retrying after EINTR and short reads; throws FileError
  // (naming the file and the offset) on error or end of file. Safe to call from several
  // threads at once (positioned reads share no file offset).
  void read_exact(void* dst, uint64_t n, uint64_t offset) const;

 private:
  void reset() noexcept;
  bool direct_ = false;
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string path_;
};

// Memory with a given power-of-two alignment (direct I/O wants page or 4 KiB alignment), not
// initialized. Blocks of 2 MiB and more come from the system directly where it can back them
// with huge pages (Linux: 2 MiB-aligned, transparent huge pages asked for), which pays for
// weights swept at every token (file_posix.cpp says why); smaller ones from the heap.
struct AlignedFree {
  std::size_t alignment = 64;
  std::size_t mapped_bytes = 0;  // nonzero: a mapping of that many bytes, returned to the system
  void operator()(std::byte* p) const noexcept;
};
using AlignedBytes = std::unique_ptr<std::byte[], AlignedFree>;
AlignedBytes allocate_aligned(std::size_t bytes, std::size_t alignment);

// Hands the whole pages inside [p, p + bytes) back to the system (Linux: MADV_PAGEOUT), for a
// read-only file mapping whose contents were copied elsewhere: they leave the process's resident
// memory and are read from the file again if touched. A hint: errors are ignored, and elsewhere
// it does nothing. Reclaim never loses data, so it is safe on any memory.
void release_pages(const void* p, std::size_t bytes);

}  // namespace redwing::platform
