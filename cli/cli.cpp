#include "cli.h"

#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstdio>

#include <fmt/format.h>

#include "exit_codes.h"
#include "opguard/formats/recording.h"
#include "opguard/core/error.h"
#include "verbs.h"

namespace opguard::cli {

std::string executable_dir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  buf[n] = '\0';
  std::string path(buf);
  auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

namespace {

// Integers from `least` up, refused with one line that says what is wanted.
CLI::Validator integer_from(long long least, const std::string& wanted, const std::string& description) {
  return CLI::Validator(
      [least, wanted](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long n = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || *end != '\0' || errno != 0 || n < least) return text + " is not " + wanted;
        return "";
      },
      description);
}

}  // namespace

const CLI::Validator& at_least_one() {
  static const CLI::Validator v = integer_from(1, "a count of 1 or more", "N>=1");
  return v;
}

const CLI::Validator& non_negative() {
  static const CLI::Validator v = integer_from(0, "a number of 0 or more", "N>=0");
  return v;
}

namespace {

// `opguard frobnicate` and `opguard bisect frob`: CLI11 says only "A
// subcommand is required"; name the word and the verbs.
void check_verbs(const CLI::App& app, int argc, char** argv) {
  const CLI::App* at = &app;
  // Only where a verb is required: `opguard repro REC ...` takes a recording
  // where `opguard repro check DIR` takes a verb.
  for (int i = 1; i < argc && at->get_require_subcommand_min() > 0; ++i) {
    const std::string word = argv[i];
    if (word.empty() || word[0] == '-') return;
    const CLI::App* next = nullptr;
    std::string verbs;
    for (const CLI::App* sub : at->get_subcommands({})) {
      if (sub->check_name(word)) next = sub;
      verbs += (verbs.empty() ? "" : ", ") + sub->get_name();
    }
    if (next == nullptr) {
      const std::string where = at == &app ? "" : at->get_name() + " ";
      throw UsageError(fmt::format("'{}{}' is not a verb: use one of {}", where, word, verbs));
    }
    at = next;
  }
}

}  // namespace

int run_cli(int argc, char** argv) {
  CLI::App app{"opguard: record two training runs, find the first operator whose bits diverge"};
  app.require_subcommand(1);
  app.set_version_flag("--version", fmt::format("opguard {} (recording format {})", OPGUARD_VERSION,
                                                formats::kFormatVersion));
  VerbResult result;
  add_record_command(app, result);
  add_ls_command(app, result);
  add_show_command(app, result);
  add_diff_command(app, result);
  add_replay_command(app, result);
  add_repro_command(app, result);
  add_configs_command(app, result);
  add_bisect_command(app, result);
  try {
    check_verbs(app, argc, argv);
    app.parse(argc, argv);
    return result.exit_code;
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUsage;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "opguard: %s\n", e.what());
    return kExitUsage;
  } catch (const FormatError& e) {
    std::fprintf(stderr, "opguard: %s\n", e.what());
    return kExitFormat;
  } catch (const IoError& e) {
    std::fprintf(stderr, "opguard: %s\n", e.what());
    return kExitIo;
  } catch (const LaunchError& e) {
    std::fprintf(stderr, "opguard: %s\n", e.what());
    return kExitLaunch;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "opguard: internal error: %s\n", e.what());
    return kExitInternal;
  }
}

}  // namespace opguard::cli
