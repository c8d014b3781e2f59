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

const CLI::Validator& at_least_one() {
  static const CLI::Validator v(
      [](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long n = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || *end != '\0' || errno != 0 || n < 1) return text + " is not a count of 1 or more";
        return "";
      },
      "N>=1");
  return v;
}

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
