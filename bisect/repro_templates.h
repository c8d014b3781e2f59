#pragma once
// The text of the bundle's programs (repro_templates.cpp). Placeholders
// @@NAME@@ are filled by repro.cpp with code generated from the recorded
// schema and values it has validated.

namespace opguard::bisect::templates {

extern const char* const kReproPy;
extern const char* const kReproCpp;
extern const char* const kCMakeLists;

}  // namespace opguard::bisect::templates
