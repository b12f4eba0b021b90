/* Devices of the store (a file image, a block device, an NVMe namespace),
 * their geometry and identity, full-length positioned I/O, and the on-device
 * label that binds a region of a device to one store.
 *
 * Invariants: every pread/pwrite/fdatasync/ioctl on a device goes through
 * tv__sys (fault injection); io_align = lcm(lba_size, 4096) and
 * object_align = lcm(64 KiB, io_align), both computed with checked math;
 * a device opened with O_DIRECT only ever sees buffers, lengths and offsets
 * aligned to io_align; I/O never reaches past size_bytes (a write past the
 * end of an image would silently resize it); the label is 512 bytes,
 * little-endian, encoded field by field (never a memcpy of a host struct) and
 * sits in a zeroed io_align-sized block at region_off, which is never 0. */
#ifndef TV_DEV_DEV_H
#define TV_DEV_DEV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/internal.h"

/* ------------------------------------------------------------------------ */
/* Devices                                                                  */
/* ------------------------------------------------------------------------ */

typedef enum {
    TV__DEV_FILE = 1,  /* regular file image */
    TV__DEV_BLOCK = 2, /* any block device (loop, SCSI, NVMe without libnvme) */
    TV__DEV_NVME = 3,  /* NVMe namespace with identity from libnvme */
} tv__dev_kind;

/* Open flags: RDONLY (0) or RDWR, plus NODIRECT to force buffered I/O and
 * NOFOLLOW to refuse a symlink as the last path component (file images the
 * store created: a symlink planted there is never followed). */
#define TV__DEV_O_RDONLY   0x0u
#define TV__DEV_O_RDWR     0x1u
#define TV__DEV_O_NODIRECT 0x2u
#define TV__DEV_O_NOFOLLOW 0x4u

#define TV__DEV_MIN_ALIGN        4096u  /* io_align is a multiple of this */
#define TV__DEV_OBJECT_ALIGN_MIN 65536u /* object_align is a multiple of this */
#define TV__DEV_MIN_LBA          512u
#define TV__DEV_MAX_LBA          65536u

/* NVMe identity; all zero for file and plain block devices. Strings are
 * NUL-terminated with the NVMe space padding trimmed. */
typedef struct tv__dev_identity {
    char serial[21];  /* Identify Controller SN, bytes 4..23 */
    char model[41];   /* Identify Controller MN, bytes 24..63 */
    char firmware[9]; /* Identify Controller FR, bytes 64..71 (not in the label) */
    uint32_t nsid;
    uint8_t nguid[16];     /* Identify Namespace bytes 104..119 */
    uint8_t eui64[8];      /* Identify Namespace bytes 120..127 */
    uint32_t lba_size;     /* from the active LBA format (1 << LBADS) */
    uint64_t capacity_lba; /* NSZE, in lba_size sectors */
} tv__dev_identity;

typedef struct tv__dev {
    int fd;
    tv__dev_kind kind;
    char *path;            /* as given to tv__dev_open */
    uint32_t lba_size;     /* bytes per logical block (512 for file images) */
    uint64_t size_bytes;   /* device (or image) size */
    uint32_t io_align;     /* lcm(lba_size, 4096) */
    uint64_t object_align; /* lcm(64 KiB, io_align) */
    bool direct;           /* opened with O_DIRECT */
    bool writable;
    tv__dev_identity ident;
} tv__dev;

/* Creates a sparse file image of size_bytes (ftruncate) with mode 0600,
 * never following a symlink (O_EXCL | O_NOFOLLOW), and fsyncs it and its
 * directory. Returns 0; -EEXIST if path exists (never overwrites);
 * TV_E_INVALID_ARG for size 0 or a size that is not a multiple of 4096 or
 * over INT64_MAX; another -errno from open/ftruncate/fsync (-ENOSPC and
 * -EDQUOT say that the filesystem holding the image is full). On failure
 * nothing is left at path. */
int tv__dev_create_image(const char *path, uint64_t size_bytes, tv_error *err);

/* Opens path (O_NONBLOCK until the type is known, so a FIFO never blocks the
 * open) and detects its kind: regular file -> TV__DEV_FILE (lba_size 512,
 * size from fstat); block device -> TV__DEV_BLOCK (BLKSSZGET, BLKGETSIZE64);
 * a whole NVMe namespace (sysfs name nvmeXnY or nvmeXcYnZ) -> TV__DEV_NVME with
 * its identity, or TV__DEV_BLOCK when this build has no libnvme or the
 * identify command fails (logged). Uses O_DIRECT unless TV__DEV_O_NODIRECT or
 * the filesystem refuses it (then direct = false).
 * Returns 0 and *out (free with tv__dev_close); TV_E_INVALID_ARG for bad
 * flags, NULL arguments, other file types, an empty device or an lba size
 * outside [512, 65536] or not a power of two; TV_E_OVERFLOW when the
 * alignments overflow; -errno from open/fstat/ioctl; -ENOMEM. */
int tv__dev_open(const char *path, unsigned flags, tv__dev **out, tv_error *err);

/* Closes the descriptor and frees d. NULL-safe. */
void tv__dev_close(tv__dev *d);

/* Reads exactly len bytes at off, looping over short transfers and retrying
 * EINTR. When d->direct, buf, len and off must be io_align-aligned.
 * Returns 0; TV_E_INVALID_ARG (misaligned, or [off, off + len) not inside
 * the device); TV_E_OVERFLOW; TV_E_SHORT_IO when the device returns 0 bytes
 * early; -errno from pread (message names device, offset and length). */
int tv__dev_pread_full(tv__dev *d, void *buf, size_t len, uint64_t off, tv_error *err);

/* Writes exactly len bytes at off; same rules and errors as
 * tv__dev_pread_full, plus -EBADF when d was opened read-only and -ENOSPC
 * and friends from pwrite. Data is durable only after tv__dev_flush. */
int tv__dev_pwrite_full(tv__dev *d, const void *buf, size_t len, uint64_t off, tv_error *err);

/* fdatasync (EINTR retried). Returns 0 or -errno. */
int tv__dev_flush(tv__dev *d, tv_error *err);

/* Allocates len bytes (rounded up to d->io_align) aligned to d->io_align and
 * zeroed, suitable for O_DIRECT on d. Returns NULL on failure or overflow.
 * Free with free(). */
void *tv__dev_alloc_aligned(const tv__dev *d, size_t len);

/* Computes io_align and object_align for a logical block size.
 * Returns 0; TV_E_INVALID_ARG for an invalid lba size; TV_E_OVERFLOW. */
int tv__dev_compute_align(uint32_t lba_size, uint32_t *io_align, uint64_t *object_align,
                          tv_error *err);

/* True when a sysfs block name ("nvme0n1", "nvme1c2n3") is a whole NVMe
 * namespace (not a partition such as "nvme0n1p1"). */
bool tv__dev_is_nvme_name(const char *name);

/* Name for messages: "file", "block", "nvme" or "unknown". */
const char *tv__dev_kind_name(int kind);

/* ------------------------------------------------------------------------ */
/* Claims: device identity and the "already in use" scan                    */
/* ------------------------------------------------------------------------ */

#define TV__DEV_CLAIM_MAX_KEYS 3
#define TV__DEV_CLAIM_KEY_LEN  160

/* What a device is, whatever path names it: keys that two opens of the same
 * storage share. A regular file is "file:DEV:INO" (st_dev, st_ino: a hard
 * link or symlink gives the same key); a loop device adds the key of its
 * backing file (LOOP_GET_STATUS64 lo_device/lo_inode), so a loop device over
 * a registered image matches it; any block device is "blk:MAJ:MIN"
 * (st_rdev: /dev/disk/by-* aliases match); an NVMe namespace adds
 * "nvme:SERIAL:MODEL:NSID:NGUID:EUI64" (the same namespace under another
 * controller path or after a rename matches). Never built from the path. */
typedef struct tv__dev_claim {
    size_t n_keys;
    char keys[TV__DEV_CLAIM_MAX_KEYS][TV__DEV_CLAIM_KEY_LEN];
} tv__dev_claim;

/* Fills *out for the open device d. Returns 0 or -errno from fstat. */
int tv__dev_claim_keys(const tv__dev *d, tv__dev_claim *out, tv_error *err);

/* True when a and b share a key (the same storage). */
bool tv__dev_claim_same(const tv__dev_claim *a, const tv__dev_claim *b);

/* Bounds of the in-use scan (docs/store.md, "Claiming a device"). */
#define TV__DEV_SCAN_HEAD    (64ull << 20) /* device start searched for labels */
#define TV__DEV_SCAN_EDGE    (16ull << 20) /* region start and end read in full */
#define TV__DEV_SCAN_SAMPLES 64u           /* evenly spaced windows in between */
#define TV__DEV_SCAN_WINDOW  (1ull << 20)  /* bytes per window */
#define TV__DEV_SCAN_EXTENTS 256u          /* data extents of a file image probed */

typedef struct tv__dev_scan {
    bool label;             /* a tensorvault label was found */
    uint64_t label_off;     /* ...at this byte offset */
    bool label_valid;       /* ...with a good checksum (then label_uuid is set) */
    uint8_t label_uuid[16]; /* the store uuid it records */
    bool nonzero;           /* a non-zero byte inside the region */
    uint64_t nonzero_off;   /* ...the first one found */
    uint64_t bytes_read;    /* what the scan cost */
} tv__dev_scan;

/* Looks for anything the region [region_off, region_off + region_len) of d
 * would overwrite: a tensorvault label (magic "TVSTORE1") at any io_align
 * block of the first TV__DEV_SCAN_HEAD bytes of the device or of a scanned
 * window, and any non-zero byte inside the region in the label block, the
 * first and last TV__DEV_SCAN_EDGE bytes, TV__DEV_SCAN_SAMPLES windows spread
 * evenly in between and, for a regular file, the first window of each of
 * the first TV__DEV_SCAN_EXTENTS data extents (SEEK_DATA: a sparse image's
 * holes cost nothing). Bytes before region_off other than labels (a
 * partition table) are not the region's. Reads at most about 64 + 32 +
 * 64 + 256 MiB whatever the device size. Returns 0 and *out (look at
 * out->label and out->nonzero); TV_E_INVALID_ARG for a region outside d;
 * -ENOMEM; the errors of tv__dev_pread_full. */
int tv__dev_claim_scan(tv__dev *d, uint64_t region_off, uint64_t region_len, tv__dev_scan *out,
                       tv_error *err);

/* ------------------------------------------------------------------------ */
/* NVMe identity                                                            */
/* ------------------------------------------------------------------------ */

#define TV__NVME_IDENTIFY_LEN 4096u

/* Decodes raw Identify Controller and Identify Namespace data (4096 bytes
 * each, as returned by the device) for namespace nsid into *out.
 * Returns 0; TV_E_INVALID_ARG for NULL buffers, an FLBAS index beyond NLBAF,
 * LBADS < 9 or > 16, or NSZE 0 (an inactive namespace); TV_E_OVERFLOW when
 * NSZE * lba_size overflows. Untrusted bytes never abort. */
int tv__nvme_parse_identify(const void *id_ctrl_4096, const void *id_ns_4096, uint32_t nsid,
                            tv__dev_identity *out, tv_error *err);

/* Fetches and parses the identity of the NVMe namespace open on fd (libnvme:
 * nvme_get_nsid, nvme_identify_ctrl, nvme_identify_ns). These admin ioctls
 * are issued by libnvme itself, not through tv__sys. Returns 0;
 * TV_E_NOT_SUPPORTED in builds without libnvme; -errno when the ioctl fails;
 * -EIO (message gives the NVMe status) when the command completes with an
 * error status; the parser's errors. */
int tv__nvme_identify(int fd, tv__dev_identity *out, tv_error *err);

/* ------------------------------------------------------------------------ */
/* Label                                                                    */
/* ------------------------------------------------------------------------ */

#define TV__LABEL_MAGIC   "TVSTORE1"
#define TV__LABEL_VERSION 1u
#define TV__LABEL_LEN     512u

/* The label's layout: this struct is the field map (offsets asserted in
 * label.c) and the in-memory form (host byte order). On disk every integer
 * is little-endian, written at the offset of its field; strings are
 * zero-padded, not NUL-terminated when full. */
typedef struct tv__label {
    char magic[8];          /*   0: "TVSTORE1" */
    uint32_t version;       /*   8: TV__LABEL_VERSION */
    uint32_t label_len;     /*  12: TV__LABEL_LEN */
    uint8_t store_uuid[16]; /*  16 */
    uint32_t lba_size;      /*  32 */
    uint32_t io_align;      /*  36 */
    uint64_t region_off;    /*  40: byte offset of the region (and the label) */
    uint64_t region_len;    /*  48: bytes, label block included */
    uint64_t object_align;  /*  56 */
    uint64_t size_bytes;    /*  64: the device must keep exactly this size */
    uint32_t dev_kind;      /*  72: tv__dev_kind */
    char serial[20];        /*  76: NVMe only, else zero */
    char model[40];         /*  96 */
    uint32_t nsid;          /* 136 */
    uint8_t nguid[16];      /* 140 */
    uint8_t eui64[8];       /* 156 */
    uint8_t reserved[316];  /* 164: zero */
    uint8_t sha256[32];     /* 480: SHA-256 of bytes [0, 480) */
} tv__label;

/* What the registry and a snapshot record about a device: everything its
 * label must say. Both device records (the snapshot's, and the registry row
 * through tv__store_device_record) convert to this one
 * (tv__snap_device_record, tv__snap_device_in_record), so one function maps
 * a record to its expected label. */
typedef struct tv__dev_record {
    uint8_t store_uuid[16];
    uint32_t kind; /* tv__dev_kind */
    uint32_t lba_size;
    uint32_t io_align;
    uint64_t object_align;
    uint64_t size_bytes;
    uint64_t region_off;
    uint64_t region_len;
    char serial[20]; /* NVMe identity, zero-padded; zero otherwise */
    char model[40];
    uint32_t nsid;
    uint8_t nguid[16];
    uint8_t eui64[8];
} tv__dev_record;

/* Fills *out with the label a device described by rec must carry (magic,
 * version and length set; the checksum is not: tv__label_check compares
 * fields). */
void tv__label_expected(const tv__dev_record *rec, tv__label *out);

/* Validates a region of d: region_off > 0 and io_align-aligned, region inside
 * the device, and long enough for the label block plus one object_align of
 * data (checked arithmetic). Returns 0 or TV_E_INVALID_ARG / TV_E_OVERFLOW. */
int tv__region_validate(const tv__dev *d, uint64_t region_off, uint64_t region_len, tv_error *err);

/* Fills *l for d (geometry, kind, identity), store uuid and region. The
 * checksum is computed by tv__label_write. Returns 0 or the errors of
 * tv__region_validate. */
int tv__label_init(tv__label *l, const tv__dev *d, const uint8_t uuid[16], uint64_t region_off,
                   uint64_t region_len, tv_error *err);

/* Encodes l (little-endian, checksum computed here) into 512 bytes. */
void tv__label_encode(const tv__label *l, uint8_t out[TV__LABEL_LEN]);

/* Decodes and verifies 512 bytes: magic, version, label_len, checksum.
 * Returns 0 or TV_E_DEVICE_MISMATCH naming what is wrong. */
int tv__label_decode(const uint8_t in[TV__LABEL_LEN], tv__label *out, tv_error *err);

/* Writes l into a zeroed io_align-sized block at l->region_off and flushes.
 * Returns 0; the errors of tv__region_validate (checked against d);
 * -ENOMEM; the errors of tv__dev_pwrite_full and tv__dev_flush. */
int tv__label_write(tv__dev *d, const tv__label *l, tv_error *err);

/* Reads and decodes the label at region_off. Returns 0;
 * TV_E_DEVICE_MISMATCH for a bad magic, version, length, checksum or a label
 * that records another region_off; TV_E_INVALID_ARG for a region_off that is
 * 0, misaligned or past the end; -ENOMEM; the errors of tv__dev_pread_full. */
int tv__label_read(tv__dev *d, uint64_t region_off, tv__label *out, tv_error *err);

/* Checks the label read from the device against the expected one (from the
 * registry; NULL to check against the device only) and against the device
 * as opened now: store uuid, lba size, io_align, object_align, region,
 * device size (a resized image is a mismatch), kind and NVMe identity
 * (serial, model, nsid, nguid, eui64); then that the recorded region is
 * valid on this device. Returns 0; TV_E_DEVICE_MISMATCH naming the field
 * and both values; TV_E_INVALID_ARG for NULL on_disk or d. */
int tv__label_check(const tv__label *on_disk, const tv__label *expected, const tv__dev *d,
                    tv_error *err);

/* First object_align-aligned byte offset after the label block: where
 * objects may start. Returns 0 on overflow (never for a validated label). */
uint64_t tv__region_data_off(const tv__label *l);

/* Fills uuid with a random (version 4, RFC 4122 variant) UUID from
 * getrandom. Returns 0 or -errno. */
int tv__uuid_random(uint8_t uuid[16], tv_error *err);

/* Formats uuid as 36 lower-case characters plus NUL. */
void tv__uuid_format(const uint8_t uuid[16], char out[37]);

/* Parses the 36-character 8-4-4-4-12 form (either case; nothing before or
 * after it) into uuid. Returns 0; -EINVAL (uuid untouched) otherwise. */
int tv__uuid_parse(const char *text, uint8_t uuid[16]);

#endif
