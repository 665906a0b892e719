/*
 * edgepack compat header (not part of the apache-tvm wheel).
 *
 * A page arena for short-lived RPC argument buffers (rpc_endpoint.cc,
 * minrpc_server.h). Memory is recycled in bulk with RecycleAll().
 *
 * PageAllocator contract (as in minrpc_server.h):
 *   ArenaPageHeader* allocate(size_t min_size);  // min_size counts the header too;
 *                                               // sets size and offset (= header size)
 *   void deallocate(ArenaPageHeader* page);
 */
#ifndef TVM_SUPPORT_ARENA_H_
#define TVM_SUPPORT_ARENA_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <type_traits>
#include <utility>

namespace tvm {
namespace support {

/*! \brief Header at the start of every arena page. */
struct ArenaPageHeader {
  /*! \brief Next page in the list. */
  ArenaPageHeader* next;
  /*! \brief Total size of the page in bytes, header included. */
  size_t size;
  /*! \brief Offset of the first free byte from the start of the page. */
  size_t offset;
};

/*! \brief malloc-backed pages of at least kPageSize bytes. */
class SimplePageAllocator {
 public:
  static const constexpr size_t kPageSize = 16 << 10;

  ArenaPageHeader* allocate(size_t min_size) {
    size_t size = min_size < kPageSize ? kPageSize : min_size;
    void* data = std::malloc(size);
    if (data == nullptr) throw std::bad_alloc();
    ArenaPageHeader* page = static_cast<ArenaPageHeader*>(data);
    page->next = nullptr;
    page->size = size;
    page->offset = sizeof(ArenaPageHeader);
    return page;
  }
  void deallocate(ArenaPageHeader* page) { std::free(page); }
};

/*! \brief Bump allocator over pages obtained from PageAllocator. Not thread-safe. */
template <typename PageAllocator>
class GenericArena {
 public:
  explicit GenericArena(PageAllocator alloc = PageAllocator()) : alloc_(std::move(alloc)) {}
  GenericArena(const GenericArena&) = delete;
  GenericArena& operator=(const GenericArena&) = delete;
  ~GenericArena() { FreeAll(); }

  /*! \brief Allocate size bytes aligned to align (a power of two). */
  void* Alloc(size_t size, size_t align = alignof(std::max_align_t)) {
    if (head_ != nullptr) {
      void* ptr = TryAlloc(head_, size, align);
      if (ptr != nullptr) return ptr;
    }
    size_t need = sizeof(ArenaPageHeader) + size + align;
    ArenaPageHeader* page = nullptr;
    // reuse a recycled page that is large enough
    for (ArenaPageHeader** link = &free_list_; *link != nullptr; link = &(*link)->next) {
      if ((*link)->size >= need) {
        page = *link;
        *link = page->next;
        break;
      }
    }
    if (page == nullptr) page = alloc_.allocate(need);
    page->offset = sizeof(ArenaPageHeader);
    page->next = head_;
    head_ = page;
    return TryAlloc(page, size, align);
  }

  /*! \brief Uninitialised storage for count values of a trivial type T. */
  template <typename T>
  T* allocate_(size_t count = 1) {
    static_assert(std::is_trivial<T>::value, "arena storage is never destructed");
    return static_cast<T*>(Alloc(sizeof(T) * count, alignof(T)));
  }

  /*! \brief Construct a T in the arena (its destructor is never run). */
  template <typename T, typename... Args>
  T* make(Args&&... args) {
    return new (Alloc(sizeof(T), alignof(T))) T(std::forward<Args>(args)...);
  }

  /*! \brief Make all memory reusable; pointers handed out so far become invalid. */
  void RecycleAll() {
    while (head_ != nullptr) {
      ArenaPageHeader* next = head_->next;
      head_->next = free_list_;
      free_list_ = head_;
      head_ = next;
    }
  }

  /*! \brief Return every page to the page allocator. */
  void FreeAll() {
    RecycleAll();
    while (free_list_ != nullptr) {
      ArenaPageHeader* next = free_list_->next;
      alloc_.deallocate(free_list_);
      free_list_ = next;
    }
  }

 private:
  static void* TryAlloc(ArenaPageHeader* page, size_t size, size_t align) {
    uintptr_t base = reinterpret_cast<uintptr_t>(page);
    uintptr_t ptr = (base + page->offset + align - 1) & ~(static_cast<uintptr_t>(align) - 1);
    if (ptr + size > base + page->size) return nullptr;
    page->offset = ptr + size - base;
    return reinterpret_cast<void*>(ptr);
  }

  PageAllocator alloc_;
  ArenaPageHeader* head_{nullptr};
  ArenaPageHeader* free_list_{nullptr};
};

/*! \brief The arena used by the RPC endpoint. */
using Arena = GenericArena<SimplePageAllocator>;

}  // namespace support
}  // namespace tvm

#endif  // TVM_SUPPORT_ARENA_H_
