#pragma once
// Private to record/: the work items that leave the training thread.
//
// Nothing here refers to the application's tensors. The hook fingerprints
// (and, when the policy wants full tensors, copies) every tensor before its
// callback returns: a reference kept any longer would raise the tensor's or
// its storage's use count, which autograd reads (InputBuffer accumulates in
// place and AccumulateGrad steals a gradient only when nobody else holds it),
// so the recorded program would run different operators depending on the
// writer's timing. The writer thread only writes what it is given.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "opguard/formats/recording.h"

namespace opguard::record {

struct DeferredJob;  // deferred.h

struct TensorTask {
  // Identity, flags and fingerprint; its sizes and strides stay empty until
  // the writer copies them from `dims` (move_dims_into_meta). Whatever the
  // training thread allocates per tensor, the writer thread frees, and those
  // cross-thread frees kept glibc's malloc at about a tenth of the recorder's
  // cost: the shape lives inline.
  formats::TensorMeta meta;
  std::vector<uint8_t> bytes;  // the full contents (row-major), when kept
  bool has_bytes = false;
  // False for a tensor without a version counter (inference mode): its
  // version says nothing about its bits, so the fingerprint cache, keyed on
  // storage and version, must neither serve nor keep it.
  bool cacheable = true;
  // Its storage was marked uninitialised when the task was made (only such
  // a tensor needs RecorderImpl::still_uninitialized, and its lock).
  bool maybe_uninitialized = false;

  // A fingerprint left to the hashing thread (deferred.h): the view's first
  // element, its storage's first byte, the view's bytes, kernels::quick_probe of
  // the view when it was deferred, and the job (made when the event is
  // queued; none before, or when the event was settled where it was queued).
  const void* deferred_data = nullptr;
  const void* deferred_base = nullptr;
  uint64_t deferred_bytes = 0;
  uint64_t deferred_probe = 0;
  std::shared_ptr<DeferredJob> job;

  static constexpr int kInlineDims = 8;
  int ndim = 0;
  int64_t inline_dims[2 * kInlineDims];  // sizes, then strides
  std::vector<int64_t> heap_dims;         // the same, beyond kInlineDims dimensions

  // `strides` null: all zero (a layout without strides).
  void set_dims(const int64_t* sizes, const int64_t* strides, int n) {
    ndim = n;
    int64_t* d = inline_dims;
    if (n > kInlineDims) {
      heap_dims.resize(2 * static_cast<std::size_t>(n));
      d = heap_dims.data();
    }
    for (int i = 0; i < n; ++i) {
      d[i] = sizes[i];
      d[n + i] = strides != nullptr ? strides[i] : 0;
    }
  }
  const int64_t* sizes() const { return ndim > kInlineDims ? heap_dims.data() : inline_dims; }
  const int64_t* strides() const { return sizes() + ndim; }
  // Product of the sizes (1 for 0-d); -1 if one is negative or it overflows.
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) {
      if (sizes()[i] < 0 || __builtin_mul_overflow(n, sizes()[i], &n)) return -1;
    }
    return n;
  }
  void move_dims_into_meta() {
    meta.sizes.assign(sizes(), sizes() + ndim);
    meta.strides.assign(strides(), strides() + ndim);
    std::vector<int64_t>().swap(heap_dims);
  }
};

enum class IntKind : uint8_t { kPlain, kScalarType, kLayout, kMemoryFormat };

// Interned per-operator facts, shared by all events of that operator.
struct OpInfo {
  std::string op;
  std::string overload;
  std::string schema;
  std::vector<std::string> arg_names;
  std::vector<bool> arg_written;  // alias annotation says the argument is written
  // Written and not returned (core/written_arguments.h): recorded again after
  // the op, as extra outputs.
  std::vector<bool> arg_written_unreturned;
  // ScalarType, Layout and MemoryFormat arguments travel as int IValues.
  std::vector<IntKind> arg_int_kind;
  std::vector<std::string> return_names;
  bool makes_uninitialized = false;  // empty, empty_like, ...: outputs are not data
  bool random = false;               // draws from a random generator
  bool is_mark = false;              // opguard::mark
  bool ignored = false;              // opguard:: control ops and profiler ranges
};

struct PendingEvent {
  formats::Event event;  // everything but op strings and tensor metadata
  const OpInfo* op = nullptr;
  const std::string* scope = nullptr;  // interned, lives as long as the recorder
  // For each value of event.inputs then event.outputs: its tensor, or none.
  std::vector<std::optional<TensorTask>> tasks;
  // Bytes of full contents this event holds (counted against the queue bound).
  uint64_t queued_bytes = 0;
  // Estimated heap bytes of the event itself (values, shapes, strings): also
  // counted against the queue bound (estimate_event_bytes, set when queued).
  uint64_t meta_bytes = 0;
};

// An estimate of the memory a queued event holds besides its full contents.
inline uint64_t estimate_event_bytes(const PendingEvent& p) {
  uint64_t n = sizeof(PendingEvent) + p.event.node.capacity();
  for (const auto* values : {&p.event.inputs, &p.event.outputs}) {
    n += values->capacity() * sizeof(formats::Value);
    for (const auto& v : *values) n += v.name.capacity() + v.text.capacity();
  }
  n += p.tasks.capacity() * sizeof(std::optional<TensorTask>);
  for (const auto& t : p.tasks) {
    if (t) n += t->heap_dims.capacity() * sizeof(int64_t);
  }
  return n;
}

}  // namespace opguard::record
