/* The api, jobs and registry job declarations the CLI uses (API9.md):
 * the real headers once they exist, the temporary stub until then. */
#ifndef TV_CLI_API_SEAM_H
#define TV_CLI_API_SEAM_H

#include "registry/registry.h"
#if __has_include("daemon/jobs.h")
#include "daemon/jobs.h"
#endif
#if __has_include("http/api.h")
#include "http/api.h"
#endif
#include "cli/api_stub_tmp.h"

#endif
