#include "cli.h"

int main(int argc, char** argv) { return opguard::cli::run_cli(argc, argv); }
