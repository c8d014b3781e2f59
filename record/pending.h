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
#include <string>
#include <vector>

#include "opguard/formats/recording.h"

namespace opguard::record {

struct TensorTask {
  formats::TensorMeta meta;    // shape, identity, flags and fingerprint
  std::vector<uint8_t> bytes;  // the full contents (row-major), when kept
  bool has_bytes = false;
};
using TensorTaskPtr = std::unique_ptr<TensorTask>;

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
  formats::Event event;  // everything but op strings and tensor metadata
  const OpInfo* op = nullptr;
  const std::string* scope = nullptr;  // interned, lives as long as the recorder
  // For each value of event.inputs then event.outputs: its tensor, or null.
  std::vector<TensorTaskPtr> tasks;
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
  n += p.tasks.capacity() * sizeof(TensorTaskPtr);
  for (const auto& t : p.tasks) {
    if (t) n += sizeof(TensorTask) + (t->meta.sizes.capacity() + t->meta.strides.capacity()) * sizeof(int64_t);
  }
  return n;
}

}  // namespace opguard::record
