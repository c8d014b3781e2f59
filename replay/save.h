#pragma once
// ReplayOptions::save_dir: a trial writes exactly what the op received and
// returned, for the repro bundle (docs/BUNDLE.md):
//   DIR/inputs.h5   every tensor argument (formats/tensor_file.h), named
//                   arg<I> (argument I), arg<I>_<K> (element K of a list),
//                   default_generator (the default CPU generator's state)
//   DIR/outputs.h5  every tensor output, out<K> (K: position among the
//                   flattened outputs, as ReplayResult::outputs numbers them)
//   DIR/call.json   op, overload, schema, effective config, this process's
//                   torch environment, arguments (name, schema type, kind,
//                   value text, datasets) and outputs (kind, text or dataset)
// Names are made here from indices, never taken from the recording.

#include <string>

#include "execute.h"
#include "opguard/formats/recording.h"

namespace opguard::replay::detail {

// Creates DIR (its parent must exist) and the three files, none of which may
// exist. Throws IoError.
void save_trial(const std::string& dir, const formats::Event& ev, const ExecResult& exec, const std::string& config);

}  // namespace opguard::replay::detail
