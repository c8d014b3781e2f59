#pragma once
// Private to record/: the work items that leave the training thread.
//
// Ownership: a PendingEvent is created on the thread that ran the operator,
// handed to the Writer queue, and destroyed by the writer thread after its step
// file has the event. A TensorTask holds a reference to the tensor (keeping its
// storage alive) until it is fingerprinted, so the queue's byte bound is also a
// bound on the memory the recorder keeps alive.

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "opguard/formats/recording.h"

namespace opguard::record {

struct TensorTask {
  enum State : int { kPending = 0, kRunning = 1, kDone = 2 };

  // The tensor, until the task is queued; then, for CPU tensors, only its
  // storage and data pointer. Holding the tensor itself would raise its use
  // count, which autograd reads (AccumulateGrad steals a gradient only when
  // nobody else holds it): the op stream would depend on the writer's timing.
  at::Tensor tensor;
  c10::Storage keep;  // keeps `data` alive once `tensor` is dropped
  const void* data = nullptr;
  formats::TensorMeta meta;  // shape, identity and flags; fingerprint once done
  bool fingerprint = true;   // false: uninitialised / dropped / not hashable
  bool dump = false;         // copy the full contents for /data
  std::vector<uint8_t> bytes;  // the full contents, when dump
  const c10::StorageImpl* storage = nullptr;  // registry key while pending
  uint64_t nbytes = 0;  // bytes this task counts against the queue bound
  std::atomic<int> state{kPending};
};
using TensorTaskPtr = std::shared_ptr<TensorTask>;

enum class IntKind : uint8_t { kPlain, kScalarType, kLayout, kMemoryFormat };

// Interned per-operator facts, shared by all events of that operator.
struct OpInfo {
  std::string op;
  std::string overload;
  std::string schema;
  std::vector<std::string> arg_names;
  std::vector<bool> arg_written;  // alias annotation says the argument is written
  // ScalarType, Layout and MemoryFormat arguments travel as int IValues.
  std::vector<IntKind> arg_int_kind;
  std::vector<std::string> return_names;
  bool makes_uninitialized = false;  // empty, empty_like, ...: outputs are not data
  bool random = false;               // draws from a random generator
  bool is_mark = false;              // opguard::mark
  bool ignored = false;              // opguard:: control ops and profiler ranges
};

struct PendingEvent {
  formats::Event event;  // everything but op strings and fingerprints
  const OpInfo* op = nullptr;
  const std::string* scope = nullptr;  // interned, lives as long as the recorder
  // For each value of event.inputs then event.outputs: its task, or null.
  std::vector<TensorTaskPtr> tasks;
  // Bytes all tasks count against the queue bound.
  uint64_t queued_bytes = 0;
};

}  // namespace opguard::record
