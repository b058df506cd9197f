// POSIX implementation of platform/file.h (Linux, macOS).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <new>

#include "platform/file.h"

namespace redwing::platform {
namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path, int err) {
  throw FileError(what + " " + path + ": " + std::strerror(err));
}

struct OpenedFile {
  int fd;
  uint64_t size;
};

// Opens `path` read-only and reads its size; the descriptor is closed again if fstat fails.
OpenedFile open_for_reading(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open", path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail("cannot stat", path, err);
  }
  return {fd, static_cast<uint64_t>(st.st_size)};
}

}  // namespace

PathKind path_kind(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return PathKind::missing;
  if (S_ISLNK(st.st_mode)) return PathKind::symlink;
  if (S_ISREG(st.st_mode)) return PathKind::regular;
  if (S_ISDIR(st.st_mode)) return PathKind::directory;
  return PathKind::other;
}

uint64_t file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail("cannot stat", path, errno);
  return static_cast<uint64_t>(st.st_size);
}

// ---- MappedFile ------------------------------------------------------------------------------

MappedFile MappedFile::open(const std::string& path) {
  auto [fd, size] = open_for_reading(path);
  MappedFile file;
  file.path_ = path;
  file.size_ = size;
  if (file.size_ > 0) {
    void* p = ::mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      fail("cannot map", path, err);
    }
    file.data_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);  // the mapping keeps its own reference to the file
  return file;
}

void MappedFile::populate() const {
  if (data_ == nullptr) return;
  void* p = const_cast<std::byte*>(data_);
#if defined(MADV_POPULATE_READ)
  if (::madvise(p, size_, MADV_POPULATE_READ) == 0) return;
#endif
  ::madvise(p, size_, MADV_WILLNEED);  // older kernels, macOS: read-ahead only
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(other.data_), size_(other.size_), path_(std::move(other.path_)) {
  other.data_ = nullptr;
  other.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = other.data_;
    size_ = other.size_;
    path_ = std::move(other.path_);
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

MappedFile::~MappedFile() { reset(); }

void MappedFile::reset() noexcept {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

// ---- ReadFile --------------------------------------------------------------------------------

ReadFile ReadFile::open(const std::string& path) {
  auto [fd, size] = open_for_reading(path);
  ReadFile file;
  file.fd_ = fd;
  file.size_ = size;
  file.path_ = path;
  return file;
}

ReadFile ReadFile::open_uncached(const std::string& path) {
#if defined(O_DIRECT)
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  if (fd >= 0) {
    // Some filesystems accept O_DIRECT at open and refuse it at the first read (EINVAL), so
    // probe one aligned block before trusting it.
    struct stat st {};
    bool ok = ::fstat(fd, &st) == 0;
    if (ok && st.st_size >= static_cast<off_t>(kDirectIoAlignment)) {
      AlignedBytes probe = allocate_aligned(kDirectIoAlignment, kDirectIoAlignment);
      ssize_t got;
      do {
        got = ::pread(fd, probe.get(), kDirectIoAlignment, 0);
      } while (got < 0 && errno == EINTR);
      ok = got >= 0;
    }
    if (ok) {
      ReadFile file;
      file.fd_ = fd;
      file.size_ = static_cast<uint64_t>(st.st_size);
      file.path_ = path;
      file.direct_ = true;
      return file;
    }
    ::close(fd);
  }
  return open(path);  // the filesystem refuses direct I/O (or the file is missing: open says so)
#else
  ReadFile file = open(path);
#if defined(__APPLE__) && defined(F_NOCACHE)
  file.direct_ = ::fcntl(file.fd_, F_NOCACHE, 1) == 0;
#endif
  return file;
#endif
}

ReadFile::ReadFile(ReadFile&& other) noexcept
    : direct_(other.direct_), fd_(other.fd_), size_(other.size_), path_(std::move(other.path_)) {
  other.fd_ = -1;
}

ReadFile& ReadFile::operator=(ReadFile&& other) noexcept {
  if (this != &other) {
    reset();
    direct_ = other.direct_;
    fd_ = other.fd_;
    size_ = other.size_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

ReadFile::~ReadFile() { reset(); }

void ReadFile::reset() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void ReadFile::read_exact(void* dst, uint64_t n, uint64_t offset) const {
  auto* out = static_cast<std::byte*>(dst);
  while (n > 0) {
    // Some systems cap a single read at 2 GiB.
    size_t want = static_cast<size_t>(n < (1ull << 30) ? n : (1ull << 30));
    ssize_t got = ::pread(fd_, out, want, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      throw FileError("cannot read " + path_ + " at offset " + std::to_string(offset) + ": " +
                      std::strerror(err));
    }
    if (got == 0)
      throw FileError("unexpected end of file in " + path_ + " at offset " +
                      std::to_string(offset));
    out += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
}

// ---- aligned memory --------------------------------------------------------------------------

void AlignedFree::operator()(std::byte* p) const noexcept {
  if (mapped_bytes > 0) {
    ::munmap(p, mapped_bytes);
    return;
  }
  ::operator delete[](p, std::align_val_t(alignment));
}

namespace {

// Large blocks straight from the kernel, 2 MiB-aligned and marked for transparent huge pages
// (Linux). Model weights are read once into such blocks and then swept at every token: with
// 4 KiB pages a 13 GB model is 3.4 million pages, each a TLB miss per sweep and a page fault at
// first use; in a virtual machine the first touch from user space of a page the kernel filled
// (pread) traps to the hypervisor again, which measured 4-5 us per page on a 2-core KVM guest
// (docs/cpu.md, session 20). Huge pages make those 512 times rarer. Returns null where the
// system has no such mapping (the caller then uses the heap).
constexpr std::size_t kHugePage = std::size_t{2} << 20;

std::byte* map_huge_aligned(std::size_t bytes, std::size_t& mapped) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const std::size_t page = 4096;
  mapped = (bytes + page - 1) / page * page;
  const std::size_t span = mapped + kHugePage;
  void* p = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<uintptr_t>(p);
  const uintptr_t start = (base + kHugePage - 1) & ~(uintptr_t{kHugePage} - 1);
  // Unmap the unaligned head and the unused tail. The block ends at a 4 KiB page, not a 2 MiB
  // one, so its last partial huge page stays in small pages and holds no untouched memory.
  if (start > base) ::munmap(p, start - base);
  const uintptr_t end = base + span;
  if (end > start + mapped) ::munmap(reinterpret_cast<void*>(start + mapped), end - start - mapped);
  // A hint: where huge pages are off or none are free, the block keeps small pages.
  ::madvise(reinterpret_cast<void*>(start), mapped, MADV_HUGEPAGE);
  return reinterpret_cast<std::byte*>(start);
#else
  (void)bytes;
  mapped = 0;
  return nullptr;
#endif
}

}  // namespace

AlignedBytes allocate_aligned(std::size_t bytes, std::size_t alignment) {
  if (bytes >= kHugePage && alignment <= kHugePage) {
    std::size_t mapped = 0;
    if (std::byte* p = map_huge_aligned(bytes, mapped))
      return AlignedBytes(p, AlignedFree{alignment, mapped});
  }
  auto* p = static_cast<std::byte*>(
      ::operator new[](bytes == 0 ? 1 : bytes, std::align_val_t(alignment)));
  return AlignedBytes(p, AlignedFree{alignment});
}

void release_pages(const void* p, std::size_t bytes) {
#if defined(MADV_PAGEOUT)
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_PAGEOUT);
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace redwing::platform
