/* tensorvault version. Invariant: bumped on every release, with the
 * project's version in CMakeLists.txt (the configure checks they agree);
 * the on-device and wire formats carry their own versions (docs/), and the
 * shared library's ABI its SONAME (libtensorvault.so.1, docs/c-api.md). */
#ifndef TENSORVAULT_VERSION_H
#define TENSORVAULT_VERSION_H

#define TV_VERSION_MAJOR  0
#define TV_VERSION_MINOR  2
#define TV_VERSION_PATCH  0
#define TV_VERSION_STRING "0.2.0"

#ifdef __cplusplus
extern "C" {
#endif
/* The library's version string, for checking against the header at run time. */
const char *tv_version(void);
#ifdef __cplusplus
}
#endif
#endif
