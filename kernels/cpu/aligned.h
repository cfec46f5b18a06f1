// Buffers the kernels allocate for themselves, aligned to the 64-byte cache line.
//
// malloc, and std::vector of ordinary element types, hand out 16-byte alignment (glibc's
// large blocks sit 16 bytes past a page boundary). Rows in such a buffer start mid-line
// (where a row's bytes are a multiple of 64, every row), so each 64-byte vector load or AMX
// tile row touches two cache lines: a 512-token prefill step of the default model, whose
// intermediates live in one such buffer, ran ~1.2x slower than with the same buffer
// 64-byte aligned (Intel Xeon with AMX), and a buffer's placement differed from process to
// process, so did the speed. PyTorch's CPU tensors are 64-byte aligned already.
#pragma once

#include <cstddef>
#include <new>
#include <type_traits>
#include <vector>

namespace forkserve {

constexpr std::size_t kCacheLine = 64;

// `bytes` rounded up to a whole number of cache lines (where a buffer's next part starts).
constexpr std::size_t cache_lines(std::size_t bytes) { return (bytes + kCacheLine - 1) / kCacheLine * kCacheLine; }

template <typename T>
struct CacheLineAllocator {
    using value_type = T;
    CacheLineAllocator() = default;
    template <typename U>
    CacheLineAllocator(const CacheLineAllocator<U> &) {}
    T *allocate(std::size_t n) {
        return static_cast<T *>(::operator new(n * sizeof(T), std::align_val_t{kCacheLine}));
    }
    void deallocate(T *p, std::size_t) { ::operator delete(p, std::align_val_t{kCacheLine}); }
    template <typename U>
    bool operator==(const CacheLineAllocator<U> &) const { return true; }
    template <typename U>
    bool operator!=(const CacheLineAllocator<U> &) const { return false; }
};

// A std::vector whose data() is 64-byte aligned.
template <typename T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

// `n` values of a trivial type on cache lines, not initialised: for buffers a kernel fills
// completely before it reads them, where a vector's zeroing would be one more pass over
// them, on one thread, before the parallel work (the AMX extend attention's packed keys
// and values: ~400 KB a layer for 224 new tokens after 450 cached).
template <typename T>
class UninitializedBuffer {
    static_assert(std::is_trivially_default_constructible_v<T>, "left uninitialised: trivial types only");

  public:
    explicit UninitializedBuffer(std::size_t n)
        : data_(static_cast<T *>(::operator new((n > 0 ? n : 1) * sizeof(T), std::align_val_t{kCacheLine}))) {}
    ~UninitializedBuffer() { ::operator delete(data_, std::align_val_t{kCacheLine}); }
    UninitializedBuffer(const UninitializedBuffer &) = delete;
    UninitializedBuffer &operator=(const UninitializedBuffer &) = delete;
    T *data() const { return data_; }

  private:
    T *data_;
};

}  // namespace forkserve
